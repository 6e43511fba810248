"""Shared memory planned by lifetime (issue 38 item 4): ``lowering.liveness`` ranges,
``plan_buffers`` letting buffers of disjoint lifetimes share bytes, the interpreter catching two
live buffers planted on the same bytes, the Gluon emitter spelling shared bytes as views of one
arena, and a DeepSeek-style MLA decode (one latent KV head, a rotary part beside it) that only
fits Hopper's 232448 bytes when its output tile reuses the query's bytes."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilews
import tilews.language as T
from tilews.lowering.errors import SharedOverlapError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.interpreter.backend import INTERPRET
from tilews.lowering.liveness import live_ranges
from tilews.lowering.pipeline import lower
from tilews.lowering.plans import SharedMemoryPlan
from tilews.ops.decode import attend_program
from tilews.ops.decode import mla_decode_program as mla_decode
from tilews.triton_ext.gluon.backend import HOPPER

from .helpers import gluon_program, marked_line, poisoned, randn

F16, F32 = T.float16, T.float32


# ---------------------------------------------------------------------------------------------
# an MLA decode: a block of query heads against one shared latent KV head (and its rotary part):
# tilews.ops.decode's program (one block per (head block, batch) tile, no split, the whole cache)

def mla_reference(q, q_pe, kv, k_pe):
    q, q_pe, kv, k_pe = (t.double() for t in (q, q_pe, kv, k_pe))
    scores = (torch.einsum("bhd,bnd->bhn", q, kv[:, :, 0]) +
              torch.einsum("bhd,bnd->bhn", q_pe, k_pe[:, :, 0])) / math.sqrt(q.shape[-1] + q_pe.shape[-1])
    return torch.einsum("bhn,bnd->bhd", torch.softmax(scores, dim=-1), kv[:, :, 0])


def mla_inputs(heads, kv_len, dim, pe_dim, seed=0, batch=1):
    shapes = [(batch, heads, dim), (batch, heads, pe_dim), (batch, kv_len, 1, dim),
              (batch, kv_len, 1, pe_dim)]
    return [randn(*s, dtype=torch.float16, seed=seed + i) for i, s in enumerate(shapes)]


def arrivals(lowered: bool = False) -> list:
    """The program's ``Arrivals`` argument (one split: unused), preceded by its length where a
    lowered kernel is run (its ``arrival_slots`` parameter)."""
    return [1, torch.zeros(1, dtype=torch.int32)] if lowered else [torch.zeros(1, dtype=torch.int32)]


def test_mla_decode_numerics_on_the_interpreter():
    heads, kv_len, dim, pe_dim = 64, 256, 128, 32
    kernel = tilews.compile(mla_decode(heads, kv_len, dim, pe_dim, block_N=32), target="interpret")
    plan = kernel.ir_after.plan(SharedMemoryPlan)
    assert ("out_tile", "q_tile") in plan.reuses          # the output tile lands on the query's bytes
    args = mla_inputs(heads, kv_len, dim, pe_dim)
    out = poisoned(1, heads, dim, dtype=torch.float16)
    kernel(*args, *arrivals(), out)
    torch.testing.assert_close(out.double(), mla_reference(*args), rtol=2e-2, atol=2e-2)


def test_mla_decode_fits_hopper():
    """TileLang's example sizes: without reuse the tiles need 294984 bytes; the output tile reuses
    the query's bytes (dead after the loop), so the plan peaks under 232448."""
    kernel = lower(build_kernel(mla_decode(128, 8192, 512, 64)), HOPPER)
    plan = kernel.plan(SharedMemoryPlan)
    assert ("out_tile", "q_tile") in plan.reuses
    ranges = {n: (o, b) for n, o, b in plan.ranges}
    assert ranges["out_tile"] == ranges["q_tile"] == (ranges["q_tile"][0], 65536)
    tiles = sum(b for n, _, b in plan.ranges if n != "out_tile")
    assert tiles <= plan.total_bytes <= tiles + 1024 <= HOPPER.caps.smem_bytes


# ---------------------------------------------------------------------------------------------
# small programs: which buffers share


def two_stages(M=32, N=64):
    """Scale a tile through one shared buffer, then add 1 through another: the second buffer's
    lifetime starts after the first's ends, so it reuses its bytes."""
    @T.prim_func
    def main(A: T.Tensor([M, N], F32), Out: T.Tensor([M, N], F32)):
        with T.Kernel(1, threads=128) as bx:
            first = T.alloc_shared([M, N], F32)
            second = T.alloc_shared([M, N], F32)
            frag = T.alloc_fragment([M, N], F32)
            T.copy(A[0:M, 0:N], first)
            T.copy(first, frag)
            for i, j in T.Parallel(M, N):
                frag[i, j] = frag[i, j] * 2.0
            T.copy(frag, second)
            T.copy(second, frag)
            for i, j in T.Parallel(M, N):
                frag[i, j] = frag[i, j] + 1.0
            T.copy(frag, Out[0:M, 0:N])
    return main


def carried(M=32, N=64, steps=3):
    """``acc`` is read at the top of each iteration before it is written: live around the back
    edge, so ``tmp`` (written and read inside each iteration) cannot take its bytes."""
    @T.prim_func
    def main(A: T.Tensor([M, N], F32), Out: T.Tensor([M, N], F32)):
        with T.Kernel(1, threads=128) as bx:
            acc = T.alloc_shared([M, N], F32)
            tmp = T.alloc_shared([M, N], F32)
            frag = T.alloc_fragment([M, N], F32)
            T.copy(A[0:M, 0:N], acc)
            for k in T.serial(steps):
                T.copy(acc, frag)
                T.copy(frag, tmp)
                T.copy(tmp, frag)
                for i, j in T.Parallel(M, N):
                    frag[i, j] = frag[i, j] * 0.5 + 1.0
                T.copy(frag, acc)
            T.copy(acc, Out[0:M, 0:N])
    return main


def reduced_then_staged(M=64, N=64, K=64, steps=4):
    """Each step adds its product into ``Acc`` through the shared tile ``red`` (on Hopper a bulk
    reduce-add, still reading ``red`` after the statement) and then stages the same product in
    ``tmp`` for its store."""
    @T.prim_func
    def main(A: T.Tensor([steps * M, K], F16), B: T.Tensor([K, N], F16), Acc: T.Tensor([M, N], F32),
             Out: T.Tensor([steps * M, N], F16)):
        with T.Kernel(1, threads=256) as bx:
            A_s = T.alloc_shared([M, K], F16)
            B_s = T.alloc_shared([K, N], F16)
            red = T.alloc_shared([M, N], F32)
            tmp = T.alloc_shared([M, N], F16)
            acc = T.alloc_fragment([M, N], F32)
            half = T.alloc_fragment([M, N], F16)
            T.copy(B[0, 0], B_s)
            for k in T.Pipelined(steps, num_stages=2):
                T.copy(A[k * M, 0], A_s)
                T.gemm(A_s, B_s, acc, clear_accum=True)
                T.copy(acc, red)
                T.atomic_add(Acc[0, 0], red)
                T.copy(acc, half)
                T.copy(half, tmp)
                T.copy(tmp, Out[k * M, 0])
    return main


def lower_for(prim, config):
    return lower(build_kernel(prim), config)


def test_sequential_buffers_reuse_bytes():
    kernel = lower_for(two_stages(), INTERPRET)
    lives = live_ranges(kernel)
    assert lives["first"].stop < lives["second"].start
    plan = kernel.plan(SharedMemoryPlan)
    assert plan.reuses == (("second", "first"),)
    assert plan.total_bytes == 32 * 64 * 4
    assert plan.reused() == ((0, 32 * 64 * 4, ("first", "second")),)


def test_a_buffer_live_around_the_back_edge_keeps_its_bytes():
    kernel = lower_for(carried(), INTERPRET)
    lives = live_ranges(kernel)
    assert lives["acc"].overlaps(lives["tmp"])
    assert kernel.plan(SharedMemoryPlan).reuses == ()
    assert kernel.plan(SharedMemoryPlan).total_bytes == 2 * 32 * 64 * 4


def test_a_reduce_added_tile_keeps_its_bytes_until_the_add_has_read_it():
    """A bulk reduce-add reads its shared tile asynchronously, like a bulk store: the tile stays
    live until the next bulk wait (here after the loop: overlap_store defers it), so ``tmp``,
    written while the add may still be reading, must not take ``red``'s bytes (it did: the add's
    tile ended its life at the add)."""
    kernel = lower_for(reduced_then_staged(), HOPPER)
    plan = kernel.plan(SharedMemoryPlan)
    assert not {("tmp", "red"), ("red", "tmp")} & set(plan.reuses)
    ranges = {name: (offset, offset + size) for name, offset, size in plan.ranges}
    assert ranges["tmp"][1] <= ranges["red"][0] or ranges["red"][1] <= ranges["tmp"][0]


def test_rings_and_roles_never_share():
    """The pipelined rings are live over the whole loop and touched by producer and consumer;
    only the query (handed over through its preload barrier) lends its bytes to the output."""
    kernel = lower_for(mla_decode(64, 256, 128, 32, block_N=32), HOPPER)
    lives = live_ranges(kernel)
    consumer = lives["out_tile"].role
    assert consumer is not None and lives["q_tile"].role == consumer
    assert lives["kv_tile"].role is None and lives["kpe_tile"].role is None   # both roles, in loops
    assert lives["p_tile"].role == consumer
    assert lives["p_tile"].overlaps(lives["q_tile"])          # the loop holds both
    assert not lives["out_tile"].overlaps(lives["q_tile"])
    for ring in ("kv_tile", "kpe_tile"):
        for other in lives:
            assert other == ring or lives[ring].overlaps(lives[other])
    assert kernel.plan(SharedMemoryPlan).reuses == (("out_tile", "q_tile"),)


def test_metal_never_shares():
    from tilews.metal.backend import METAL
    kernel = lower_for(two_stages(16, 16), METAL)
    assert kernel.plan(SharedMemoryPlan).reuses == ()


@pytest.mark.parametrize("target", ["interpret", "triton"])
def test_correct_reuse_computes_the_right_answer(target):
    kernel = tilews.compile(two_stages(), target=target)
    a = randn(32, 64, seed=3)
    out = poisoned(32, 64)
    kernel(a, out)
    torch.testing.assert_close(out.double(), a.double() * 2 + 1, rtol=1e-6, atol=1e-6)


def test_correct_reuse_compiles_for_hopper():
    kernel = tilews.compile(two_stages(), target="hopper")
    assert kernel.ir_after.plan(SharedMemoryPlan).reuses == (("second", "first"),)


def test_planted_overlap_of_two_live_buffers_is_caught():
    """Put the KV ring on the query's bytes (both live through the loop): the producer's KV
    copy overwrites the query, and the consumer's first gemm reads the corruption."""
    heads, kv_len, dim, pe_dim = 64, 64, 64, 32
    kernel = lower_for(mla_decode(heads, kv_len, dim, pe_dim, block_N=32), INTERPRET)
    plan = kernel.plan(SharedMemoryPlan)
    q_at = dict((n, o) for n, o, _ in plan.ranges)["q_tile"]
    planted = tuple((n, q_at if n == "kv_tile" else o, b) for n, o, b in plan.ranges)
    kernel = kernel.with_plan(dataclasses.replace(plan, ranges=planted))
    from tilews.lowering.interpreter import run
    args = mla_inputs(heads, kv_len, dim, pe_dim) + arrivals(lowered=True) + [poisoned(1, heads, dim, dtype=torch.float16)]
    with pytest.raises(SharedOverlapError) as err:
        run(kernel, args)
    message = str(err.value)
    assert f":{marked_line(attend_program, '# <- read')}:" in message
    assert "'q_tile'" in message and "'kv_tile'" in message


def test_gluon_spells_shared_bytes_as_views_of_one_arena():
    """MLA decode at head dim 256 stays on Gluon: the output tile is a view of the query's arena
    and Triton's allocation is what the plan says."""
    kernel = lower_for(mla_decode(128, 1024, 256, 64), HOPPER)
    plan = kernel.plan(SharedMemoryPlan)
    assert plan.reuses == (("out_tile", "q_tile"),)
    prog = gluon_program(kernel)
    assert "smem_arena = gl.allocate_shared_memory(gl.int8" in prog.source
    assert "out_tile = smem_arena.slice(0, 32768)._reinterpret(gl.float16, [64, 256]" in prog.source
    assert plan.total_bytes <= prog.metadata["shared"] <= plan.total_bytes + 1024


def test_mla_decode_compiles_for_hopper_within_its_shared_memory():
    """The whole program on target "hopper" at TileLang's example sizes: where Gluon takes it,
    Triton's allocation of the emitted module; where Gluon refuses (the tl path), Triton's
    allocation of the tl kernel compiled for sm_90. Either stays within 232448 bytes."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-m", "tests.test_shared_lifetimes"], capture_output=True,
                          text=True, timeout=600, env=env, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-6000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["route"] in ("hopper", "hopper -> triton"), found
    assert 0 < found["shared"] <= HOPPER.caps.smem_bytes, found


def _hopper_shared() -> dict:
    """(route, shared bytes of the compiled kernel) of the MLA decode on target "hopper"."""
    from tilews.lowering.plans import AsyncPlan
    from .test_tl_backend import _compile_for_gpu
    program = build_kernel(mla_decode(128, 8192, 512, 64))
    kernel = lower(program, HOPPER)
    if kernel.find_plan(AsyncPlan) is not None:
        return {"route": "hopper", "shared": gluon_program(kernel).metadata["shared"]}
    return {"route": "hopper -> triton", "shared": _compile_for_gpu(program).metadata.shared}


if __name__ == "__main__":
    print(json.dumps(_hopper_shared()))


def test_pingpong_roles_reusing_their_own_bytes_pass_the_ttgir_check():
    """Three split consumers taking turns (opt-in ping-pong) each store their output tile in their
    query tile's bytes after the loop. Each role arrives on the turn barrier while its Q Kᵀ wgmma
    is in flight and later writes that arena after waiting on the same barrier: its own program
    order, not a release to another partition, so the TTGIR check (ws_verifier) accepts it, and it
    compiles for sm_90."""
    from tilews.ops.attention import mha_fwd_program
    from .helpers import load
    prim = mha_fwd_program(2, 8, 4096, 64, False, block_M=192, block_N=128, threads=384, num_stages=2)
    prog = load(build_kernel(prim), "gluon", HOPPER.replace(pingpong=True))
    plan = prog.kernel.plan(SharedMemoryPlan)
    assert {("O_shared_0", "Q_shared_0"), ("O_shared_1", "Q_shared_1")} <= set(plan.reuses)
    assert any(n.startswith("pingpong:") for n in prog.kernel.notes)
