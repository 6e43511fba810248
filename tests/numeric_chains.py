"""Random elementwise chains for ``test_fuzz_numeric``: the grammar, a chain's kernel source, and
its float64 reference (docs/design.md §3, the numeric contract, emulated step by step).

A chain reads ``v = X[g]`` and applies steps, each in the type the contract gives it:
``+ - *`` with an input (``X``, ``Z``: float, ``K``: int32) or a Python constant (which takes
``v``'s type), ``/`` by ``Z`` or a constant, ``min``/``max``, ``abs``, negation, ``//`` and ``%``
(floor semantics, on ints and floats), casts among float32, float16, bfloat16 and int32, a
round trip through an FP8 type; a chain may end with a math function (``exp``, ``exp2``,
``log``, ``sqrt``, on arguments where it is defined and finite). The result is stored to ``O``
(a store converts with a cast's rounding). Values stay within +-1000 (the generator tracks a
bound), divisors are never zero, so no step overflows or divides by zero.
"""
from __future__ import annotations

import dataclasses
import textwrap

import torch
from hypothesis import strategies as st

FLOATS = ("float32", "float16", "bfloat16")
FP8 = ("float8_e4m3fn", "float8_e5m2")
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
         "int32": torch.int32, "float8_e4m3fn": torch.float8_e4m3fn,
         "float8_e5m2": torch.float8_e5m2}
WIDTH = {"float8_e4m3fn": 0, "float8_e5m2": 0, "float16": 1, "bfloat16": 1, "float32": 2}
FLOAT_CONSTS = (0.1, 0.3, -0.7, 1.5, -2.75, 3.0)
INT_CONSTS = (1, 2, 3, -3, 5, -7)
# largest magnitude of each input: X in [-2, 2], |Z| in [0.5, 2], K in +-[1, 7]
LARGEST = {"X": 2.0, "Z": 2.0, "K": 7}
CAP = 1000.0
MATH = ("exp", "exp2", "log", "sqrt")
_OPERAND_STEPS = ("arith", "div", "min", "max", "mod", "floordiv")


def promote(a: str, b: str) -> str:
    """A binary operation's type (``lowering/frontend/values.promote`` on these types)."""
    if a == b:
        return a
    if a in WIDTH and b in WIDTH:
        return "float32" if WIDTH[a] == WIDTH[b] else max(a, b, key=WIDTH.get)
    return a if a in WIDTH else b


@dataclasses.dataclass(frozen=True)
class Chain:
    length: int         # elements (not a multiple of the block: a ragged last block)
    block: int          # elements per block
    staging: str        # "global" (X[g] read directly) | "fragment" | "shared" (a T.copy first)
    x: str              # X's dtype
    z: str              # Z's dtype
    steps: tuple        # ("arith", op, operand) | ("div", operand) | ("min"|"max", operand) |
                        # ("abs",) | ("neg",) | ("mod"|"floordiv", operand) | ("cast", dtype) |
                        # ("fp8", dtype) | ("math", fn); operand: "X" | "Z" | "K" | a number
    explicit: bool      # the store spelled T.cast(v, out) (else the store converts)
    out: str            # O's dtype
    seed: int

    @property
    def has_math(self) -> bool:
        return any(s[0] == "math" for s in self.steps)

    @property
    def math_type(self) -> str | None:
        """The type the final math function computes in (None without one)."""
        types = step_types(self)
        return types[-1] if self.has_math else None


def _magnitude(operand) -> float:
    return LARGEST[operand] if isinstance(operand, str) else abs(operand)


def _smallest(operand) -> float:
    """The smallest magnitude of a divisor."""
    return {"Z": 0.5, "K": 1.0}[operand] if isinstance(operand, str) else abs(operand)


def _candidates(t: str, bound: float, types: dict[str, str]) -> list[tuple[tuple, float]]:
    """(step, its result's bound) for each step allowed on a value of type ``t`` bounded by
    ``bound``."""
    out = []
    consts = INT_CONSTS if t == "int32" else INT_CONSTS + FLOAT_CONSTS
    for operand in ("X", "Z", "K") + consts:
        m = _magnitude(operand)
        rt = _result_type(("arith", "+", operand), t, types)
        for op in "+-*":
            out.append((("arith", op, operand), bound * m if op == "*" else bound + m))
        for fn in ("min", "max"):
            out.append(((fn, operand), max(bound, m)))
        if operand == "X":          # divisors are never zero
            continue
        if rt != "int32":
            out.append((("div", operand), bound / _smallest(operand)))
        out.append((("mod", operand), m))
        out.append((("floordiv", operand), bound / _smallest(operand) + 1))
    out += [(("abs",), bound), (("neg",), bound)]
    out += [(("cast", dtype), bound) for dtype in FLOATS + ("int32",) if dtype != t]
    if t != "int32":
        out += [(("fp8", dtype), min(bound, 448.0) if dtype == "float8_e4m3fn" else bound)
                for dtype in FP8]
    return [(s, b) for s, b in out if b <= CAP]


def _result_type(s: tuple, t: str, types: dict[str, str]) -> str:
    """The type of ``v`` after step ``s`` on a ``v`` of type ``t``; ``types``: the inputs'."""
    if s[0] == "cast":
        return s[1]
    if s[0] in _OPERAND_STEPS and isinstance(s[-1], str):
        return promote(t, types[s[-1]])
    return t


def step_types(c: Chain) -> list[str]:
    """The type of ``v`` before the first step and after each."""
    types, inputs = [c.x], {"X": c.x, "Z": c.z, "K": "int32"}
    for s in c.steps:
        types.append(_result_type(s, types[-1], inputs))
    return types


@st.composite
def chains(draw) -> Chain:
    block = draw(st.sampled_from((16, 32, 64, 12, 24)))
    length = draw(st.integers(1, 3 * block))
    x, z = draw(st.sampled_from(FLOATS)), draw(st.sampled_from(FLOATS))
    types = {"X": x, "Z": z, "K": "int32"}
    t, bound, steps = x, LARGEST["X"], []
    for _ in range(draw(st.integers(1, 6))):
        options = _candidates(t, bound, types)
        step, bound = options[draw(st.integers(0, len(options) - 1))]
        t = _result_type(step, t, types)
        steps.append(step)
    if t != "int32" and draw(st.booleans()):
        steps.append(("math", draw(st.sampled_from(MATH))))
    outs = FLOATS if steps[-1][0] == "math" else FLOATS + ("int32",)
    return Chain(length=length, block=block,
                 staging=draw(st.sampled_from(("global", "fragment", "shared"))),
                 x=x, z=z, steps=tuple(steps), explicit=draw(st.booleans()),
                 out=draw(st.sampled_from(outs)), seed=draw(st.integers(0, 2**16)))


# ----------------------------------------------------------------------------------------------
# the kernel's source

_SPELLING = {"arith": "{v} {op} {w}", "div": "{v} / {w}", "min": "T.min({v}, {w})",
             "max": "T.max({v}, {w})", "abs": "T.abs({v})", "neg": "-{v}", "mod": "{v} % {w}",
             "floordiv": "{v} // {w}", "cast": "T.cast({v}, T.{to})",
             "fp8": "T.cast(T.cast({v}, T.{to}), T.{t})", "exp": "T.exp(T.min({v}, 8.0))",
             "exp2": "T.exp2(T.min({v}, 10.0))", "log": "T.log(T.abs({v}) + 1.0)",
             "sqrt": "T.sqrt(T.abs({v}))"}


def _expr(s: tuple, v: str, g: str, t: str) -> str:
    """Step ``s`` applied to ``v`` (of type ``t``) at element ``g``, spelled."""
    operand = s[-1]
    w = f"{operand}[{g}]" if isinstance(operand, str) else repr(operand)
    spelling = _SPELLING[s[1] if s[0] == "math" else s[0]]
    return spelling.format(v=v, w=w, op=s[1] if s[0] == "arith" else None, to=operand, t=t)


def chain_source(c: Chain) -> str:
    B, L = c.block, c.length
    g = f"bx * {B} + i"
    body = []
    if c.staging != "global":
        body += [f"x_t = T.alloc_{c.staging}(({B},), T.{c.x})", f"T.copy(X[bx * {B}], x_t)"]
    body += [f"for i in T.Parallel({B}):", f"    if {g} < {L}:",
             f"        v0 = {'X[' + g + ']' if c.staging == 'global' else 'x_t[i]'}"]
    types = step_types(c)
    for k, s in enumerate(c.steps):
        body.append(f"        v{k + 1} = " + _expr(s, f"v{k}", g, types[k]))
    last = f"v{len(c.steps)}"
    body.append(f"        O[{g}] = " + (f"T.cast({last}, T.{c.out})" if c.explicit else last))
    params = (f"X: T.Tensor(({L},), T.{c.x}), Z: T.Tensor(({L},), T.{c.z}), "
              f"K: T.Tensor(({L},), T.int32), O: T.Tensor(({L},), T.{c.out})")
    return "\n".join([
        '"""A program generated by tests/test_fuzz_numeric.py (an elementwise chain)."""',
        "import tilews.language as T", "", "",
        "def make():",
        "    @T.prim_func",
        f"    def main({params}):",
        f"        with T.Kernel({-(-L // B)}, threads=128) as bx:",
        textwrap.indent("\n".join(body), " " * 12),
        "    return main", ""])


# ----------------------------------------------------------------------------------------------
# inputs and the float64 reference

def chain_inputs(c: Chain) -> dict[str, torch.Tensor]:
    """X in [-2, 2], |Z| in [0.5, 2], K in +-[1, 7]: random, never zero."""
    g = torch.Generator().manual_seed(c.seed)
    n = c.length
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    x = (torch.randn(n, generator=g) * 0.75).clamp(-2, 2)
    x = torch.where(x == 0, 0.5, x)
    z = sign * (0.5 + 1.5 * torch.rand(n, generator=g))
    k = (torch.randint(1, 8, (n,), generator=g) * torch.where(torch.rand(n, generator=g) < 0.5,
                                                              -1, 1)).int()
    return {"X": x.to(TORCH[c.x]), "Z": z.to(TORCH[c.z]), "K": k}


def rnd(v: torch.Tensor, t: str) -> torch.Tensor:
    """``v`` (float64) converted to ``t`` as the contract's casts do, back in float64."""
    if t == "int32":
        return v.trunc()
    if t == "float8_e4m3fn":
        v = v.clamp(-448, 448)
    return v.float().to(TORCH[t]).double()


def _floor_mod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Python's ``a % b`` before its rounding: the exact ``fmod`` plus ``b`` where the signs
    differ."""
    r = torch.fmod(a, b)
    return torch.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


def chain_reference(c: Chain, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, None]:
    """O by the contract, in float64: each step's exact result rounded once to its type (float64
    then float32 then the type: each rounding innocuous for + - * / sqrt, 53 >= 2*24 + 2 and
    24 >= 2*11 + 2); math functions in float64, rounded once."""
    vals = {name: inp.double() for name, inp in inputs.items()}
    types = step_types(c)
    v = vals["X"]
    for s, t_in, t in zip(c.steps, types, types[1:]):
        kind = s[0]
        if kind in _OPERAND_STEPS:
            operand = s[-1]
            w = rnd(vals[operand], t) if isinstance(operand, str) else \
                rnd(torch.full_like(v, float(operand)), t)
            v = rnd(v, t)
            if kind == "arith":
                v = rnd({"+": v + w, "-": v - w, "*": v * w}[s[1]], t)
            elif kind == "div":
                v = rnd(v / w, t)
            elif kind in ("min", "max"):
                v = torch.minimum(v, w) if kind == "min" else torch.maximum(v, w)
            elif kind == "mod":
                v = rnd(_floor_mod(v, w), t)
            else:
                v = torch.floor(v / w) if t == "int32" else torch.floor(rnd(v / w, t))
        elif kind in ("abs", "neg"):
            v = v.abs() if kind == "abs" else -v
        elif kind == "cast":
            v = rnd(v, t)
        elif kind == "fp8":
            v = rnd(rnd(v, s[1]), t)
        else:
            v = rnd(_math(s[1], v, t), t)
    return rnd(v, c.out), None


def _math(fn: str, v: torch.Tensor, t: str) -> torch.Tensor:
    if fn == "exp":
        return torch.exp(torch.minimum(v, rnd(torch.tensor(8.0), t)))
    if fn == "exp2":
        return torch.exp2(torch.minimum(v, rnd(torch.tensor(10.0), t)))
    if fn == "log":
        return torch.log(rnd(v.abs() + 1.0, t))
    return torch.sqrt(v.abs())
