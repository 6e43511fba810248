"""fp8_verifier: check the FP8 wgmma of a TTGIR module before Triton lowers it to LLVM.

An FP8 wgmma is a ``ttng.warp_group_dot`` whose operand A or B has element type ``f8E4M3FN`` or
``f8E5M2``. A violation is a ``CompileError`` naming the kernel, the rule and the wgmma (its result's
SSA name and its text up to the attributes):

(1) K-major. Hopper's wgmma reads 8-bit shared operands K-major only. Operand A
    (``!ttg.memdesc<MxKx...>``) must have a ``#ttg.nvmma_shared`` layout with ``transposed =
    false``, operand B (``!ttg.memdesc<KxNx...>``) one with ``transposed = true``; a missing
    ``transposed`` reads as false, any other layout is a violation. The layout is written inline in
    the type or as an alias defined at the top of the module (``#shared3 = #ttg.nvmma_shared<{...}>``,
    resolved through aliases of aliases). A register operand (``tensor<...>``, which only A can be)
    is not checked.
(2) Promotion, only when ``promote_every > 0`` (a block-scaled kernel, whose partial products
    must leave the wgmma accumulator every ``promote_every`` elements of K to be scaled and added
    in fp32). The *chain* of a value is the K that FP8 wgmma accumulated into it since the last
    restart (the longest way there); every FP8 wgmma's chain must be at most ``promote_every``.
    Over SSA definitions:

    - a ``ttng.warp_group_dot`` *restarts* when its 4th operand (useC) is defined by
      ``arith.constant false``: its chain is its own K; otherwise its chain is its own K plus its
      C operand's. Its own K is the last dim of A's type (dim 1 of ``MxK``) for an FP8 wgmma and
      0 for any other;
    - ``arith.constant dense<0.000000e+00>`` (a zero accumulator) has chain 0;
    - a ``ttng.warp_group_dot_wait`` result has its operand's chain (same position);
    - an ``scf.for`` result or iter_arg has the larger chain of its init and its ``scf.yield``
      operand; so an accumulator carried around the loop through a wgmma that does not restart
      grows without bound, whatever the trip count;
    - an ``scf.if`` / ``ttg.warp_specialize`` result has the largest chain of what its regions'
      ``scf.yield`` / ``ttg.warp_yield`` give at that position;
    - any other value (a function or partition argument, ``arith.addf``, a layout conversion, ...)
      is not followed: a wgmma accumulating onto it is a violation.

Assumed: the text is MLIR's default printing as ``ws_verifier.Module`` reads it (one op per line;
a wgmma's operands ``A, B, C[, useC]`` and its types in the trailing ``A type * B type -> result
type``; without a useC operand C is used). Names are bound in program order, since MLIR reuses SSA
names in sibling regions. ``scf.while`` and unstructured control flow (``cf``) are not followed.
"""
from __future__ import annotations

import re

from tilews.lowering.errors import CompileError

from .ws_verifier import Module, Op, Region, _short, _walk

_FP8 = ("f8E4M3FN", "f8E5M2")
_FP8_DOT_LINE = re.compile(r"ttng\.warp_group_dot [^\n]*x(?:f8E4M3FN|f8E5M2)\b")
_ALIAS = re.compile(r"^#([\w$.-]+) = (.+)$", re.M)
_TYPE_START = re.compile(r"!ttg\.memdesc<|tensor<")
_OPEN, _CLOSE = "<{[(", ">}])"


def has_fp8_dot(text: str) -> bool:
    """Whether ``text`` holds an FP8 ``ttng.warp_group_dot`` (a cheap scan of its lines)."""
    return _FP8_DOT_LINE.search(text) is not None


# ---------------------------------------------------------------------------------------------
# types


def _balanced_end(s: str, i: int) -> int:
    """The index just past the bracket group opening at or after ``i``."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] in _OPEN:
            depth += 1
        elif s[j] in _CLOSE and s[j - 1] != "-":   # `->` is no bracket
            depth -= 1
            if depth == 0:
                return j + 1
    return len(s)


def _types(op: Op) -> list:
    """The memdesc and tensor types in ``op``'s text, in order."""
    out, i = [], 0
    while m := _TYPE_START.search(op.text, i):
        i = _balanced_end(op.text, m.start())
        out.append(op.text[m.start():i])
    return out


def _fields(t: str) -> list:
    """The top-level comma-separated fields inside a type's outer ``<...>``."""
    inner = t[t.index("<") + 1:-1]
    out, depth, start = [], 0, 0
    for j, c in enumerate(inner):
        depth += (c in _OPEN) - (c in _CLOSE and inner[j - 1] != "-")
        if c == "," and depth == 0:
            out.append(inner[start:j].strip())
            start = j + 1
    return out + [inner[start:].strip()]


def _shape(t: str) -> tuple:
    """(dims, element type) of a memdesc or tensor type."""
    *dims, elem = _fields(t)[0].split("x")
    return [int(d) for d in dims], elem


def _is_fp8(dot: Op) -> bool:
    return any(_shape(t)[1] in _FP8 for t in _types(dot)[:2])


def _own_k(dot: Op) -> int:
    return _shape(_types(dot)[0])[0][-1] if _is_fp8(dot) else 0


# ---------------------------------------------------------------------------------------------
# (1) K-major shared operands


def _aliases(text: str) -> dict:
    return {m.group(1): m.group(2).strip() for m in _ALIAS.finditer(text)}


def _resolve_layout(layout: str, aliases: dict) -> str:
    seen = set()
    while layout.startswith("#") and layout[1:] in aliases and layout not in seen:
        seen.add(layout)
        layout = aliases[layout[1:]]
    return layout


def _k_major_errors(dot: Op, aliases: dict) -> list:
    errors = []
    for operand, t, want in zip("AB", _types(dot)[:2], ("false", "true")):
        if not t.startswith("!ttg.memdesc<"):
            continue
        written = _fields(t)[1]
        layout = _resolve_layout(written, aliases)
        m = re.search(r"\btransposed = (true|false)\b", layout)
        if layout.startswith("#ttg.nvmma_shared<") and (m.group(1) if m else "false") == want:
            continue
        shown = written if written == layout else f"{written} = {layout}"
        errors.append(f"FP8 wgmma `{_short(dot)}` reads operand {operand} from shared memory that "
                      f"is not K-major ({shown}): rule (1) needs A (MxK) in #ttg.nvmma_shared with "
                      f"transposed = false and B (KxN) with transposed = true")
    return errors


# ---------------------------------------------------------------------------------------------
# (2) K covered between promotions


def _bind_uses(m: Module) -> dict:
    """op -> the definition ((Op or Region, index), None if not in the text) of each operand,
    names bound in program order."""
    uses: dict = {}

    def bind(region: Region, seen: dict) -> None:
        for i, key in enumerate(region.args):
            seen[key] = (region, i)
        for op in region.ops:
            uses[op] = [seen.get(k) for k in op.operands]
            for r in op.regions:
                bind(r, seen)
            for i, key in enumerate(op.results):
                seen[key] = (op, i)

    bind(m.root, {})
    return uses


def _is_const(d, pattern: str) -> bool:
    return (d is not None and isinstance(d[0], Op) and d[0].name == "arith.constant"
            and re.search(rf"= arith\.constant {pattern}(?: |$)", d[0].text) is not None)


class _Chains:
    """The chain of every value an FP8 wgmma accumulates onto, by fixed-point iteration.

    A chain is never larger than the sum of all wgmma K (each wgmma at most once on a path without
    a loop), so ``unbounded`` (that sum + 1) stands for a chain through a loop that does not
    restart, or through a value not followed."""

    def __init__(self, uses: dict, dots: list):
        self.uses = uses
        self.unbounded = 1 + sum(_own_k(d) for d in dots)
        self.links: dict = {}           # definition -> (own chain or None, [(definition, + K)])
        todo = [(d, 0) for d in dots]
        while todo:
            d = todo.pop()
            if d not in self.links:
                self.links[d] = self._link(d)
                todo += [p for p, _ in self.links[d][1]]
        self.chain = {d: -1 for d in self.links}
        while self._relax():
            pass

    def _relax(self) -> bool:
        changed = False
        for d, (own, preds) in self.links.items():
            v = max([-1 if own is None else own] + [self.chain[p] + k for p, k in preds
                                                     if self.chain[p] >= 0])
            if min(v, self.unbounded) > self.chain[d]:
                self.chain[d] = min(v, self.unbounded)
                changed = True
        return changed

    def _link(self, d):
        if d is None:
            return self.unbounded, []
        owner, i = d
        if isinstance(owner, Region):
            loop = owner.owner
            if loop is not None and loop.name == "scf.for" and i >= 1:
                return None, self._loop_values(loop, i - 1)
            return self.unbounded, []
        args = self.uses[owner]
        if owner.name == "ttng.warp_group_dot":
            if len(args) > 3 and _is_const(args[3], "false"):
                return _own_k(owner), []
            return None, [(args[2], _own_k(owner))]
        if owner.name == "ttng.warp_group_dot_wait":
            return None, [(args[i], 0)]
        if owner.name == "scf.for":
            return None, self._loop_values(owner, i)
        if owner.name in ("scf.if", "ttg.warp_specialize"):
            return None, [(y, 0) for r in owner.regions for y in self._yielded(r, i)]
        if _is_const(d, r"dense<0\.000000e\+00>"):
            return 0, []
        return self.unbounded, []

    def _loop_values(self, loop: Op, i: int) -> list:
        return [(self.uses[loop][3 + i], 0)] + [(y, 0) for y in self._yielded(loop.regions[0], i)]

    def _yielded(self, region: Region, i: int) -> list:
        last = region.ops[-1] if region.ops else None
        if last is None or last.name not in ("scf.yield", "ttg.warp_yield"):
            return []
        return self.uses[last][i:i + 1]

    def why_unbounded(self, dot: Op) -> str:
        """What makes the chain of ``dot`` unbounded: the first value not followed, else the
        first loop-carried value on its way."""
        order, todo = [], [(dot, 0)]
        while todo:
            d = todo.pop(0)
            if d not in order:
                order.append(d)
                todo += [p for p, _ in self.links[d][1]]
        for d in order:
            if self.links[d][0] == self.unbounded:
                what = "an undefined value" if d is None else _describe(d)
                return f"it accumulates onto {what}, which rule (2) does not follow"
        loop_arg = next(d for d in order if isinstance(d[0], Region) and self.chain[d] == self.unbounded)
        return (f"its accumulator is carried across iterations of the scf.for (iter_arg "
                f"{loop_arg[0].args[loop_arg[1]][1]}) through a wgmma that does not restart")


def _describe(d) -> str:
    owner, i = d
    if isinstance(owner, Region):
        return f"the region argument {owner.args[i][1]}"
    return f"`{_short(owner)}`"


def _promotion_errors(dots: list, uses: dict, promote_every: int) -> list:
    chains = _Chains(uses, dots)
    errors = []
    for dot in dots:
        k = chains.chain[(dot, 0)]
        if k <= promote_every:
            continue
        why = chains.why_unbounded(dot) if k == chains.unbounded else f"its chain covers K = {k}"
        errors.append(f"FP8 wgmma `{_short(dot)}` accumulates more than promote_every = "
                      f"{promote_every} elements of K before a promotion (rule (2): restart with "
                      f"useC = false or a zero accumulator): {why}")
    return errors


# ---------------------------------------------------------------------------------------------


def verify_fp8(text: str, kernel_name: str, promote_every: int = 0) -> None:
    """Check (1), and (2) when ``promote_every > 0``, on a TTGIR module's text; raises
    ``CompileError`` on a violation."""
    m = Module(text)
    dots = [op for op in _walk(m.root) if op.name == "ttng.warp_group_dot" and _is_fp8(op)]
    aliases = _aliases(text)
    errors = [e for dot in dots for e in _k_major_errors(dot, aliases)]
    if promote_every > 0 and dots:
        errors += _promotion_errors(dots, _bind_uses(m), promote_every)
    if errors:
        raise CompileError(f"FP8 verifier: kernel '{kernel_name}': {errors[0]}",
                           notes=[f"kernel '{kernel_name}': {e}" for e in errors[1:]])
