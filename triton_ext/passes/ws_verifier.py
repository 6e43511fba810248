"""ws_verifier: check a warp-specialized TTGIR module before Triton lowers it to LLVM.

Checks, for every ``ttg.warp_specialize`` op (its ``default`` region and ``partitionN`` regions
run concurrently); a violation is a ``CompileError`` naming the kernel and the partitions:

(a) Shared memory. A buffer is *used by* a partition when it is allocated inside it or referenced
    there (directly, through ``ttg.memdesc_*`` views, or captured as a warp_specialize operand;
    an outer buffer counts for every partition that uses it). Buffers used by different
    partitions must have disjoint byte ranges ``[allocation.offset, + size of the memdesc type)``.
    Overlaps within one partition, or with buffers no partition uses, are Triton's own
    lifetime-based reuse and are allowed.
(b) wgmma completion, per partition, in program order (loop bodies twice, for the back edge).
    An async ``ttng.warp_group_dot`` result is pending until it passes a
    ``ttng.warp_group_dot_wait {pendings = N}`` that covers it (at least N later wgmma issued
    before the wait). A pending value may only flow into another wgmma's accumulator, a wait, or
    a ``scf.yield``/``ttg.warp_yield``; any other use reads the accumulator too early. A
    ``ttng.arrive_barrier`` *releases* the buffers that another partition writes after waiting on
    that barrier (the last ``wait_barrier`` before the write); it must not happen while a wgmma
    reading such a buffer at a possibly equal stage index is outstanding. (A partition's own
    writes after its own waits are in its program order, which this check does not model.)
(c) Warp groups. A partition holding a ``ttng.warp_group_dot`` runs a multiple of 4 warps and
    starts at a multiple of 4 (``warpGroupStartIds``; the default partition starts at 0).

Stage. The input is the module Triton's "ttgir" stage returns (``asm["ttgir"]``, the module
entering "llir"). No stage output of Triton 3.6 carries shared offsets or warp-group starts:
``make_llir`` assigns them (``allocate_warp_groups``, ``scf_to_cf``, inliner,
``allocate_shared_memory_nv``) in the same pipeline that lowers to LLVM. ``allocate`` replays
that prefix, with the same capability and PTX version, on a copy parsed from text, so (a) and (c)
see the offsets and starts Triton is about to assign; (b) reads the structured (scf) module.

Assumed: the text is MLIR's default printing (one op per line, regions opened by a trailing
``{`` and closed by a leading ``}``), structured (scf) for (b). Two SSA stage indices are
different stages only when provably so: constants, or ``(x + a) % S`` vs ``(x + b) % S``
(``& (S - 1)`` alike); an index carried from an earlier loop iteration may equal any. Scratch
buffers (layout conversions, the warp_specialize capture area) have no printed size and are not
checked. Partitions are named as in TTGIR: ``default`` (the role holding the gemm) and
``partitionN`` (the other roles in order, then Triton's padding partitions).
"""
from __future__ import annotations

import itertools
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Optional

from tilews.lowering.errors import CompileError

_NAME = r"%[\w$.]+"
_USE = re.compile(rf"{_NAME}(?:#\d+)?")
_RESULTS = re.compile(rf"^({_NAME}(?::\d+)?(?:,\s*{_NAME}(?::\d+)?)*)\s+=\s+")
_DEFS = re.compile(rf"({_NAME})(?::\s|\s=\s)")       # `%arg: type` and `%iv = %init`
_REGION = re.compile(r"^(default|partition(\d+))\b(.*?)(?:num_warps\((\d+)\))?\s*\{$")
_BARRIER_OPS = {"ttng.init_barrier", "ttng.wait_barrier", "ttng.arrive_barrier",
                "ttng.barrier_expect", "ttng.inval_barrier"}
_WRITE_OPS = {"ttng.async_tma_copy_global_to_local", "ttg.local_store",
              "ttg.async_copy_global_to_local", "ttng.async_tma_gather"}
_PASS_THROUGH = {"scf.yield", "scf.condition", "ttg.warp_yield"}


@dataclass(eq=False)
class Op:
    name: str
    text: str
    results: list
    operands: list                      # (scope, name) keys
    regions: list = field(default_factory=list)

    def attr(self, key: str) -> Optional[int]:
        m = re.search(rf"\b{re.escape(key)} = (-?\d+)", self.text)
        return int(m.group(1)) if m else None


@dataclass(eq=False)
class Region:
    """A region of an op: a scope of value names (MLIR reuses names in sibling regions); an
    ``isolated`` one (a function, a worker partition) sees no names from outside."""
    label: str
    args: list
    scope: int
    owner: Optional[Op] = None
    num_warps: Optional[int] = None
    ops: list = field(default_factory=list)
    isolated: bool = False


def _walk(region: Region):
    for op in region.ops:
        yield op
        for r in op.regions:
            yield from _walk(r)


def _strip_locs(line: str) -> str:
    out, i = [], 0
    while (j := line.find(" loc(", i)) >= 0:
        out.append(line[i:j])
        k, depth = j + 4, 0
        while k < len(line):
            c = line[k]
            if c == '"':
                k = line.index('"', k + 1)
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1
    return "".join(out) + line[i:]


class Module:
    """A TTGIR module parsed from text: an op tree, SSA definitions, view resolution."""

    def __init__(self, text: str):
        m = re.search(r'"ttg\.num-warps" = (\d+)', text)
        self.num_warps = int(m.group(1)) if m else None
        self.defs: dict = {}            # key -> (Op or Region, index)
        self.root = Region("", [], 0)
        # every region is a scope (MLIR reuses value names in sibling regions); a name resolves
        # to its innermost definition, looking no further out than an isolated region
        # (functions, worker partitions)
        self._fresh = itertools.count(1)
        self._names: dict = {0: set()}
        self.root.isolated = True
        stack = [self.root]             # the open regions, innermost last
        for raw in text.splitlines():
            s = _strip_locs(raw).strip()
            if s.startswith("{-#"):     # dialect resources end the module
                break
            if not s or s[0] in "#/":
                continue
            if s.startswith("}"):
                closed = stack.pop()
                if s.endswith("{"):     # `} else {`, `}, {`: the same op's next region
                    self._open(closed.owner, "", [], False, stack)
                continue
            if s.startswith("^"):       # CF block label: its arguments stay opaque
                continue
            rm = _REGION.match(s)
            if rm:                      # a region of the warp_specialize op just parsed
                r = self._open(stack[-1].ops[-1], rm.group(1), _DEFS.findall(rm.group(3)),
                               bool(rm.group(2)), stack)
                r.num_warps = int(rm.group(4)) if rm.group(4) else None
                continue
            parsed = self._parse(s, stack)
            if parsed is None:          # not an op line this reader knows: skipped
                continue
            op, defs = parsed
            stack[-1].ops.append(op)
            if s.endswith("{"):
                self._open(op, "", defs, op.name == "tt.func", stack)

    def _open(self, owner, label, args, isolated: bool, stack: list) -> Region:
        scope = next(self._fresh)
        self._names[scope] = set(args)
        r = Region(label, [(scope, a) for a in args], scope, owner, isolated=isolated)
        owner.regions.append(r)
        for i, key in enumerate(r.args):
            self.defs[key] = (r, i)
        stack.append(r)
        return r

    def _key(self, name: str, stack: list) -> tuple:
        """The key of a use of ``name``: its innermost visible definition's scope."""
        for region in reversed(stack):
            if name in self._names[region.scope]:
                return region.scope, name
            if region.isolated:
                break
        return stack[-1].scope, name

    def _parse(self, s: str, stack: list):
        results, body = [], s
        m = _RESULTS.match(s)
        if m:
            for r in m.group(1).split(","):
                name, _, n = r.strip().partition(":")
                results += [f"{name}#{i}" for i in range(int(n))] if n else [name]
            body = s[m.end():]
        m = re.match(r'"?([\w.]+)"?', body)
        if m is None:
            return None
        name, rest = m.group(1), body[m.end():]
        defs = _DEFS.findall(rest)
        scope = stack[-1].scope
        op = Op(name, s, [(scope, r) for r in results],
                [self._key(u, stack) for u in _USE.findall(rest) if u not in defs])
        self._names[scope].update(results)
        for i, key in enumerate(op.results):
            self.defs[key] = (op, i)
        return op, defs

    def ws_ops(self) -> list:
        return [op for op in _walk(self.root) if op.name == "ttg.warp_specialize"]

    def resolve(self, key):
        """(the local_alloc a memdesc value views, its ``memdesc_index`` nearest the alloc) or None."""
        index = None
        while key in self.defs:
            owner, i = self.defs[key]
            if isinstance(owner, Region):
                if not owner.label.startswith("partition"):
                    return None
                key = owner.owner.operands[i]           # a captured warp_specialize operand
                continue
            if owner.name == "ttg.local_alloc":
                return owner, index
            if not owner.name.startswith("ttg.memdesc_"):
                return None
            if owner.name == "ttg.memdesc_index":
                index = owner.operands[1]
            key = owner.operands[0]
        return None

    def _sym(self, key):
        op = self.defs.get(key, (None,))[0]
        if isinstance(op, Op) and op.name == "arith.constant":
            m = re.match(r"\S+ = arith\.constant (-?\d+)", op.text)
            if m:
                return ("c", int(m.group(1)))
        if isinstance(op, Op) and op.name in ("arith.remsi", "arith.remui", "arith.andi"):
            mod = self._sym(op.operands[1])
            if op.name == "arith.andi":     # x & (2^n - 1) == x % 2^n
                pow2 = mod[0] == "c" and mod[1] >= 0 and not mod[1] & (mod[1] + 1)
                mod = ("c", mod[1] + 1) if pow2 else ("v",)
            if mod[0] == "c" and mod[1] > 0:
                x, off = op.operands[0], 0
                inner = self.defs.get(x, (None,))[0]
                if isinstance(inner, Op) and inner.name in ("arith.addi", "arith.subi"):
                    a, b = (self._sym(k) for k in inner.operands)
                    if b[0] == "c":
                        x, off = inner.operands[0], b[1] if inner.name == "arith.addi" else -b[1]
                    elif a[0] == "c" and inner.name == "arith.addi":
                        x, off = inner.operands[1], a[1]
                return ("m", x, off % mod[1], mod[1])
        return ("v", key)

    def may_alias(self, i, j) -> bool:
        """Whether stage indices ``i`` and ``j`` (keys, None: unindexed) may be equal."""
        if i is None or j is None or i == j:
            return True
        a, b = self._sym(i), self._sym(j)
        if a[0] == b[0] == "c":
            return a[1] == b[1]
        if a[0] == b[0] == "m" and a[1] == b[1] and a[3] == b[3]:
            return a[2] == b[2]
        return True


def _name(op: Op) -> str:
    return op.results[0][1].lstrip("%") if op.results else op.name


def _nbytes(op: Op) -> int:
    dims, elem = re.findall(r"!ttg\.memdesc<((?:\d+x)+)(\w+)", op.text)[-1]
    n = 1
    for d in dims.rstrip("x").split("x"):
        n *= int(d)
    return n * max(8, int(re.search(r"\d+", elem).group())) // 8


def _who(m: Module, r: Region) -> str:
    n = m.num_warps if r.label == "default" else r.num_warps
    return f"'{r.label}' ({n} warp{'s' * (n != 1)})"


def _short(op: Op) -> str:
    return op.text.split(" {")[0].split(" : ")[0]


# ---------------------------------------------------------------------------------------------
# (a) shared allocations of concurrent partitions, (c) warp groups: on the allocated module


def _check_overlaps(m: Module, ws: Op, errors: list) -> None:
    used = []
    for r in ws.regions:
        bufs = {op for op in _walk(r) if op.name == "ttg.local_alloc"}
        bufs |= {res[0] for op in _walk(r) for k in op.operands if (res := m.resolve(k))}
        used.append((r, {b for b in bufs if b.attr("allocation.offset") is not None}))
    seen = set()
    for i, (p, xs) in enumerate(used):
        for q, ys in used[i + 1:]:
            for x in xs:
                for y in ys:
                    ox, oy = x.attr("allocation.offset"), y.attr("allocation.offset")
                    disjoint = ox >= oy + _nbytes(y) or oy >= ox + _nbytes(x)
                    if x is y or disjoint or frozenset((x, y)) in seen:
                        continue
                    seen.add(frozenset((x, y)))
                    errors.append(f"partitions {_who(m, p)} and {_who(m, q)} run concurrently but "
                                  f"share shared memory: {_name(x)} [{ox}, {ox + _nbytes(x)}) "
                                  f"overlaps {_name(y)} [{oy}, {oy + _nbytes(y)})")


def _check_warp_groups(m: Module, ws: Op, errors: list) -> None:
    starts = re.search(r"warpGroupStartIds = array<i32: ([\d, ]+)>", ws.text)
    starts = [int(v) for v in starts.group(1).split(",")] if starts else None
    for r in ws.regions:
        if not any(op.name == "ttng.warp_group_dot" for op in _walk(r)):
            continue
        default = r.label == "default"
        warps = m.num_warps if default else r.num_warps
        start = 0 if default else (starts[int(r.label[9:])] if starts else None)
        if warps % 4 or (start is not None and start % 4):
            at = f", starting at warp {start}," if start is not None else ""
            errors.append(f"partition {_who(m, r)}{at} holds wgmma; wgmma needs whole warp groups: "
                          f"a multiple of 4 warps starting at a multiple of 4")


# ---------------------------------------------------------------------------------------------
# (b) wgmma completion: on the structured module


@dataclass(eq=False)
class _Dot:
    op: Op
    reads: list                         # (local_alloc, index key) of its shared operands
    seq: int


class _Flow:
    """Program-order walk of one partition: outstanding wgmma and pending (unwaited) values.

    ``run``'s state is (``out``: the outstanding ``_Dot``, oldest first; ``carried``: the ``_Dot``
    outstanding at some loop back edge, whose stage index is an SSA value of an earlier iteration
    and so may equal any). ``carried`` holds the objects themselves, never their ``id()``: a
    ``_Dot`` no longer referenced is freed, and a later one may get its id."""

    def __init__(self, m: Module, region: Region, guards: dict, who: str, errors: list):
        self.m, self.guards, self.who, self.errors = m, guards, who, errors
        self.pending: dict = {}
        self.seq = 0
        self.reported: set = set()
        self.run(region.ops, ([], set()))

    def get(self, key) -> frozenset:
        return self.pending.get(key, frozenset())

    def report(self, op: Op, msg: str) -> None:
        if op not in self.reported:
            self.reported.add(op)
            self.errors.append(msg)

    def read(self, op: Op, keys) -> None:
        for k in keys:
            for d in self.get(k):
                self.report(op, f"partition {self.who} reads the result of `{_short(d.op)}` in "
                                f"`{_short(op)}` before a warp_group_dot_wait covers it")

    def run(self, ops: list, st) -> list:
        out, carried = st
        for op in ops:
            if op.name == "ttng.warp_group_dot" and "isAsync = true" in op.text:
                self.read(op, op.operands[:2] + op.operands[3:])
                self.seq += 1
                d = _Dot(op, [res for k in op.operands[:2] if (res := self.m.resolve(k))], self.seq)
                out.append(d)
                self.pending[op.results[0]] = frozenset([d])
            elif op.name == "ttng.warp_group_dot_wait":
                keep = op.attr("pendings") or 0
                del out[:max(0, len(out) - keep)]
                for r, k in zip(op.results, op.operands):
                    self.pending[r] = self.get(k) & frozenset(out)
            elif op.name in _PASS_THROUGH:
                return [self.get(k) for k in op.operands]
            elif op.name == "scf.for":
                self.read(op, op.operands[:3])
                inits = [self.get(k) for k in op.operands[3:]]
                body, before, carry = op.regions[0], list(out), inits
                for again in (False, True):
                    if again:
                        carried |= set(out)
                    for a, p in zip(body.args[1:], carry):
                        self.pending[a] = p
                    ys = self.run(body.ops, st) or inits
                    carry = [a | b for a, b in zip(inits, ys)]
                for r, p in zip(op.results, carry):
                    self.pending[r] = p
                out[:] = sorted(set(out) | set(before), key=lambda d: d.seq)
            elif op.name == "scf.if":
                self.read(op, op.operands)
                branches = [(list(out), carried) for _ in op.regions] or [(list(out), carried)]
                ys = [self.run(r.ops, b) for r, b in zip(op.regions, branches)]
                merged = set(out) if len(op.regions) < 2 else set()
                for b, _ in branches:
                    merged |= set(b)
                out[:] = sorted(merged, key=lambda d: d.seq)
                for i, r in enumerate(op.results):
                    self.pending[r] = frozenset().union(*(y[i] for y in ys if len(y) > i))
            else:
                self.read(op, op.operands)
                for r in op.results:      # a fresh value (sibling regions may reuse a name)
                    self.pending.pop(r, None)
                if op.name == "ttng.arrive_barrier":
                    self.arrive(op, out, carried)
                for r in op.regions:
                    self.run(r.ops, st)
        return []

    def arrive(self, op: Op, out: list, carried: set) -> None:
        res = self.m.resolve(op.operands[0])
        if res is None:
            return
        bar, bar_index = res
        for buf, writer in self.guards.get(bar, ()):
            if _who(self.m, writer) == self.who:
                # the partition's own later write is ordered by its program order, not by this
                # arrive (its ping-pong turn barrier, or bytes it reuses by lifetime)
                continue
            for d in out:
                for base, index in d.reads:
                    if base is buf and (d in carried or self.m.may_alias(bar_index, index)):
                        self.report(op, f"partition {self.who} releases {_name(buf)} (arrive on "
                                        f"{_name(bar)}) while `{_short(d.op)}` may still read it (no "
                                        f"warp_group_dot_wait covers it before the arrive); partition "
                                        f"{_who(self.m, writer)} overwrites {_name(buf)} after waiting "
                                        f"on {_name(bar)}")
                        return


def _guards(m: Module, ws: Op) -> dict:
    """barrier alloc -> {(buffer alloc, partition region)}: the partition writes the buffer after
    its last wait on that barrier."""
    barriers = {res[0] for op in _walk(m.root) if op.name in _BARRIER_OPS
                if (res := m.resolve(op.operands[0]))}
    guards: dict = {}
    for r in ws.regions:
        last = None
        for op in _walk(r):
            if op.name == "ttng.wait_barrier":
                last = (m.resolve(op.operands[0]) or (last,))[0]
            elif op.name in _WRITE_OPS and last is not None:
                for k in op.operands:
                    if (res := m.resolve(k)) and res[0] not in barriers:
                        guards.setdefault(last, set()).add((res[0], r))
    return guards


# ---------------------------------------------------------------------------------------------


def allocate(text: str, capability: int = 90, ptx_version: Optional[int] = None) -> str:
    """``text`` after the prefix of Triton's ``make_llir`` that assigns warp groups and shared
    offsets (run on a copy, in a fresh context)."""
    from triton._C.libtriton import ir, nvidia, passes
    if ptx_version is None:
        from types import SimpleNamespace
        from triton.backends.nvidia.compiler import get_ptx_version_from_options
        ptx_version = get_ptx_version_from_options(SimpleNamespace(ptx_version=None), capability)
    ctx = ir.context()
    ir.load_dialects(ctx)
    nvidia.load_dialects(ctx)
    with tempfile.TemporaryDirectory(prefix="tilews-ttgir-") as tmp:
        path = os.path.join(tmp, "module.ttgir")
        with open(path, "w") as f:
            f.write(text)
        mod = ir.parse_mlir_module(path, ctx)
    mod.context = ctx
    pm = ir.pass_manager(ctx)
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    passes.ttgpuir.add_allocate_warp_groups(pm)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, capability, ptx_version)
    pm.run(mod, "tilews_ws_verifier")
    return mod.str()


def verify_ttgir(text_or_module, kernel_name: str, *, allocated: Optional[str] = None,
                 capability: int = 90, ptx_version: Optional[int] = None) -> None:
    """Check (a), (b), (c) on a TTGIR module (text or Triton module) of the "ttgir" stage.

    ``allocated``: the same module after ``allocate`` (computed when None, unless the text
    already carries ``allocation.offset``). Raises ``CompileError`` on a violation."""
    text = text_or_module if isinstance(text_or_module, str) else text_or_module.str()
    if "ttg.warp_specialize" not in text:
        return
    if allocated is None:
        allocated = text if "allocation.offset" in text else allocate(text, capability, ptx_version)
    errors: list = []
    structured, placed = Module(text), Module(allocated)
    for ws in structured.ws_ops():
        guards = _guards(structured, ws)
        for r in ws.regions:
            _Flow(structured, r, guards, _who(structured, r), errors)
    for ws in placed.ws_ops():
        _check_overlaps(placed, ws, errors)
        _check_warp_groups(placed, ws, errors)
    if errors:
        raise CompileError(f"TTGIR verifier: kernel '{kernel_name}': {errors[0]}",
                           notes=[f"kernel '{kernel_name}': {e}" for e in errors[1:]])
