"""``longest_first``: a user's causal attention program (TileLang's ``example_mha_fwd_bshd``, its
query blocks looping over ``T.ceildiv((bx + 1) * block_M, block_N)`` key blocks) gets its query
blocks numbered backwards, as ``tilews.ops.attention`` numbers them by hand, so the longest start
first. Compile-only on Hopper (the lowered IR), the lowered Hopper program on the interpreter and
the user's program on ``triton`` (whose pipeline runs the pass too) against a float64
reference."""
import pytest
import torch

import tilews.language as T
from tilews.lowering import interpreter, ir
from tilews.lowering.frontend import build_kernel
from tilews.lowering.passes import longest_first
from tilews.lowering.pipeline import lower
from tilews.lowering.simplify import evaluate
from tilews.lowering.traverse import walk
from tilews.ops.attention import mha_fwd_program
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import poisoned, randn
from .tilelang_compat.test_flash_attention import flashattn_bshd_for


def user_program(batch, heads, seq, dim, causal, **blocks):
    """The frontend IR of the user's program (the example, as tilews's jit builds it)."""
    return flashattn_bshd_for("interpret")(batch, heads, seq, dim, causal, **blocks).ir_before


def trips(kernel: ir.Kernel, at: int) -> int:
    """The pipelined loop's iterations in query block ``bx = at``."""
    loop = next(s for s in walk(kernel.body) if isinstance(s, ir.For) and s.kind is ir.ForKind.PIPELINED)
    env = {kernel.block_vars[0]: at}
    return evaluate(loop.stop, env) - evaluate(loop.start, env)


def reference(q, k, v, causal):
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return out.transpose(1, 2)


GPU_BLOCKS = dict(block_M=128, block_N=128, num_stages=2, threads=256)


@pytest.mark.parametrize("dim", [64, 128])
def test_user_causal_program_starts_its_longest_blocks_first(dim):
    """One block per tile (128 tiles on 132 SMs): numbered backwards. Made persistent (4096
    tiles): its launch order kept, the serpentine rounds deal the tiles."""
    kernel = user_program(1, 4, 4096, dim, True, **GPU_BLOCKS)
    assert (trips(kernel, 0), trips(kernel, 31)) == (1, 32)
    flipped = longest_first.run(kernel, HOPPER)
    assert (trips(flipped, 0), trips(flipped, 31)) == (32, 1)
    notes = "\n".join(lower(kernel, HOPPER.replace(num_sms=132)).notes)
    assert ("longest_first: block index bx numbered backwards (bx -> 31 - bx): the T.Pipelined loop "
            "at line") in notes and "runs 1 iterations at bx = 0 and 32 at bx = 31" in notes, notes
    assert "persist:" not in notes, notes
    persistent = "\n".join(lower(user_program(8, 16, 4096, dim, True, **GPU_BLOCKS),
                                 HOPPER.replace(num_sms=132)).notes)
    assert "persist: 4096 tiles > 132 SMs" in persistent and "split_consumers:" in persistent
    assert "longest_first" not in persistent, persistent


def test_op_and_user_causal_programs_get_the_same_order():
    """The op leaves the order to the compiler: its causal loop runs longest at the last block,
    as the user's does; a non-causal loop runs as long in every block."""
    op = build_kernel(mha_fwd_program(1, 4, 4096, 64, True, layout="bshd"))
    assert (trips(op, 0), trips(op, 31)) == (1, 32)
    assert trips(longest_first.run(op, HOPPER), 0) == 32
    full = user_program(8, 16, 4096, 64, False, **GPU_BLOCKS)
    assert longest_first.run(full, HOPPER) is full


def test_loop_bounds_read_at_run_time_keep_the_order():
    """Iterations that depend on a runtime scalar as well as the block index are unknown here."""

    @T.prim_func
    def rows(X: T.Tensor((4, 64), T.float32), n: T.int32, Y: T.Tensor((4, 64), T.float32)):
        with T.Kernel(4, threads=128) as bx:
            acc = T.alloc_fragment([64], T.float32)
            T.fill(acc, 0)
            for k in T.Pipelined(T.min(bx + 1, n), num_stages=1):
                for j in T.Parallel(64):
                    acc[j] += X[k, j]
            T.copy(acc, Y[bx, :])

    kernel = build_kernel(rows)
    assert longest_first.run(kernel, HOPPER) is kernel


@pytest.mark.parametrize("seed", range(2))
def test_lowered_hopper_program_matches_reference(seed):
    """Eight query blocks of 64 rows on 16 SMs: one block per tile, numbered backwards, on the
    interpreter under different schedules of its roles."""
    kernel = user_program(1, 2, 256, 64, True, block_M=64, block_N=64, num_stages=2, threads=128)
    lowered = lower(kernel, HOPPER.replace(num_sms=16))
    assert any(n.startswith("longest_first:") for n in lowered.notes), lowered.notes
    assert not any(n.startswith("persist:") for n in lowered.notes), lowered.notes
    q, k, v = (randn(1, 256, 2, 64, dtype=torch.float16, seed=seed * 3 + i) for i in range(3))
    out = poisoned(1, 256, 2, 64, dtype=torch.float16)
    interpreter.run(lowered, [q, k, v, out], seed=seed)
    torch.testing.assert_close(out.double(), reference(q, k, v, True), atol=2e-3, rtol=2e-3)


def test_user_causal_program_on_triton():
    """The ``tl`` pipeline numbers the blocks backwards too; Triton's CPU interpreter runs it."""
    kernel = flashattn_bshd_for("triton")(1, 2, 192, 64, True, block_M=64, block_N=64,
                                          num_stages=1, threads=128)
    assert any(n.startswith("longest_first:") for n in kernel.report.notes), kernel.report.notes
    q, k, v = (randn(1, 192, 2, 64, dtype=torch.float16, seed=10 + i) for i in range(3))
    out = kernel(q, k, v)
    torch.testing.assert_close(out.double(), reference(q, k, v, True), atol=2e-3, rtol=2e-3)
