"""Cold compile cost of the Hopper attention program, guarded by what it is made of, not by time.

Triton's code generator builds one operation per arithmetic node of the emitted Gluon source each
time it visits it, and it visits a ``range`` loop's body twice (once to find what the loop
carries): a node inside two nested loops is built four times. Attention's persistent kernel once
spelled the tile's coordinates (the tile index divided by the grid's extents, with floor
corrections) in full at every use, and its cold compile spent as long building and folding them
as LLVM spent on the whole kernel (``scripts/profile_compile.py``, docs/performance.md's "Cold
compile"). ``triton_ext/gluon/invariants.py`` names each loop body's repeated invariant scalars
once per iteration; these tests count the nodes, weighted by those visits, and the tile
arithmetic's spellings.
"""
from __future__ import annotations

import ast

from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.triton_ext.gluon import emit
from tilews.triton_ext.gluon.backend import HOPPER

from tilews.ops.attention import blocks, mha_fwd_program

# the program scripts/profile_compile.py times: D128, causal, the op's GPU blocks, on an H100's
# 132 SMs (so the persist pass makes it persistent)
NUM_SMS = 132


def attention_source() -> str:
    program = mha_fwd_program(1, 32, 4096, 128, True, **blocks(128, True))
    return emit(lower(build_kernel(program), HOPPER.replace(num_sms=NUM_SMS)))


def codegen_visits(source: str) -> int:
    """The operations Triton's code generator builds for ``source``: each arithmetic node, call
    or comparison counted once per visit, 2**(the ``range``/``while`` loops around it)
    (``gl.static_range`` bodies are unrolled, not visited twice)."""
    total = 0

    def visit(node: ast.AST, loops: int) -> None:
        nonlocal total
        for child in ast.iter_child_nodes(node):
            inner = loops
            if isinstance(node, (ast.For, ast.While)) and child in node.body:
                unrolled = isinstance(node, ast.For) and isinstance(node.iter, ast.Call) \
                    and ast.unparse(node.iter.func).endswith("static_range")
                inner += 0 if unrolled else 1
            if isinstance(child, (ast.BinOp, ast.BoolOp, ast.Compare, ast.Call, ast.UnaryOp)):
                total += 2 ** inner
            visit(child, inner)

    visit(ast.parse(source), 0)
    return total


def test_attention_tile_coordinates_spelled_once_per_role():
    """Each role computes its tile's index once per tile: the persistent loop's index times the
    SM count appears once in each of the three roles (producer, two consumers), not at each of
    the ~70 uses it had."""
    source = attention_source()
    assert source.count("def main_ws") == 3
    assert source.count(f"tile_iter * {NUM_SMS}") == 3


def test_attention_codegen_visits_bounded():
    """The weighted node count of attention's emitted source: 3745 when every use spelled its
    scalars in full, 1753 with the invariants named; the bound leaves room for small changes of
    the kernel and fails if repeated scalar arithmetic comes back."""
    visits = codegen_visits(attention_source())
    assert visits <= 2000, visits


def test_codegen_visits_counts_loop_bodies_twice():
    """The measure itself: a node in a loop body counts twice, in two nested loops four times,
    in an unrolled loop once."""
    src = ("def f(n):\n    a = n + 1\n    for i in range(n):\n        b = i * 2\n"
           "        for j in range(n):\n            c = j - 1\n"
           "    for k in gl.static_range(4):\n        d = k + 1\n")
    # n + 1: 1; range(n): 1; i * 2: 2; range(n) inside: 2; j - 1: 4; gl.static_range(4): 1; k + 1: 1
    assert codegen_visits(src) == 1 + 1 + 2 + 2 + 4 + 1 + 1


def test_a_varlen_kernels_sequence_bounds_are_read_once_per_tile():
    """The varlen forward reads its sequence's bounds from ``cu_seqlens``, which the kernel never
    writes: each role loads them once per tile at the tile loop's top, none inside a K/V loop
    (they were reloaded at every block: 44 loads in the source, 70-112 ``ld.global`` in the
    PTX). A load of a buffer the kernel writes keeps its place (``test_a_written_buffer...``)."""
    from tilews.ops.attention import mha_fwd_varlen_program
    for causal in (False, True):
        program = mha_fwd_varlen_program(16, 16, 128, causal, store_lse=True, block_M=128, block_N=128,
                                         num_stages=2, threads=256)
        source = emit(lower(build_kernel(program), HOPPER.replace(num_sms=NUM_SMS)))
        tree = ast.parse(source)
        inner = [n for n in ast.walk(tree) if isinstance(n, ast.For) and n.target.id == "k"]
        assert inner
        for loop in inner:
            loads = [c for c in ast.walk(loop) if isinstance(c, ast.Call) and ast.unparse(c.func) == "gl.load"
                     and ast.unparse(c.args[0]).startswith("cu_seqlens")]
            assert not loads, ast.unparse(loads[0])
        assert source.count("gl.load(cu_seqlens") <= 16, source.count("gl.load(cu_seqlens")


def test_a_written_buffers_elements_stay_where_they_are_read():
    """Only buffers the kernel never writes are read ahead: a scalar buffer another statement
    writes could change between the reads."""
    from tilews.lowering import ir
    from tilews.triton_ext.gluon import invariants
    loc = ir.Loc("t.py", 1)
    n = ir.Var("n", ir.DType.I32, ir.VarKind.PARAM)
    k = ir.Var("k", ir.DType.I32, ir.VarKind.LOOP)
    L = ir.Buffer("L", (n,), ir.DType.I32, ir.Scope.GLOBAL)
    read = ir.Load(L, (ir.BinOp(ir.BinOpKind.ADD, n, ir.Const(1, ir.DType.I32), ir.DType.I32),))
    uses = ir.Cmp(ir.CmpKind.LT, k, read, loc)
    body = ir.Seq((ir.Store(L, (k,), ir.Select(uses, k, read, ir.DType.I32), loc),
                   ir.Store(L, (ir.Const(0, ir.DType.I32),), read, loc)))
    assert read in invariants._repeated(body, {}, frozenset({L}))
    assert read not in invariants._repeated(body, {}, frozenset())
