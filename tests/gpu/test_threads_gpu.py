"""The thread level on a CUDA GPU (target ``auto``: Hopper's chain, else ``triton``), against
float64 torch with outputs poisoned: TileLang's GEMV forms (split-K with shared atomics, the TVM
thread allreduce, the tile-level reducer), shuffles and warp reductions, a ragged per-thread
loop. The CPU tests of the same programs (tests/test_threads_*.py) run them on the interpreter,
Triton's CPU interpreter and the Metal harness; this file runs them on the machine."""
from __future__ import annotations

import pytest
import torch

import tilews

from ..helpers import randn
from ..thread_programs import splitk_gemv as split_k_gemv
from ..test_threads_gluon import DEQUANT_GEMMS, close
from ..test_threads_reduce import _tree, gemv_alloc_reducer, shuffles, splitk_gemv_vectorized_tvm

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("N,K,block_n,reduce_threads", [(4096, 4096, 4, 32), (1000, 1030, 2, 32)])
def test_split_k_gemv_with_shared_atomics(N, K, block_n, reduce_threads):
    if K % 8:
        K = K - K % 8                      # the program loads 8 halves per thread
    kern = tilews.compile(split_k_gemv(N, K, block_n, reduce_threads))
    a = randn(K, dtype=torch.float16, seed=1).cuda()
    b = randn(N, K, dtype=torch.float16, seed=2).cuda()
    c = torch.full((N,), float("nan"), dtype=torch.float16, device="cuda")
    kern(a, b, c)
    torch.testing.assert_close(c.double(), b.double() @ a.double(), rtol=1e-2, atol=5e-2)


@pytest.mark.parametrize("N,K", [(4096, 4096), (14336, 4096), (96, 512)])
def test_tvm_allreduce_gemv(N, K):
    a = randn(K, dtype=torch.float16, seed=3).cuda()
    b = randn(N, K, dtype=torch.float16, seed=4).cuda()
    c = tilews.jit(splitk_gemv_vectorized_tvm)(a, b, 2, 32)
    torch.testing.assert_close(c.double(), b.double() @ a.double(), rtol=1e-2, atol=5e-2)


def test_reducer_gemv():
    M, N = 1000, 4096
    a = randn(M, N, dtype=torch.float16, seed=5).cuda()
    x = randn(N, dtype=torch.float16, seed=6).cuda()
    out = tilews.jit(gemv_alloc_reducer)(a, x, block_M=64, block_N=128, threads=128)
    torch.testing.assert_close(out.double(), a.double() @ x.double(), rtol=1e-2, atol=5e-2)


def test_shuffles_and_warp_reduction():
    a = torch.randint(-1000, 1000, (64,), dtype=torch.int32,
                      generator=torch.Generator().manual_seed(6))
    outs = tilews.jit(out_idx=[1, 2, 3, 4, 5])(shuffles)()(a.cuda())
    butterfly, tree = (o.cpu() for o in outs[:2])
    assert torch.equal(butterfly, a.view(2, 32).sum(dim=1).repeat_interleave(32))
    assert torch.equal(tree, _tree(a))


@pytest.mark.parametrize("name", sorted(DEQUANT_GEMMS))
@pytest.mark.parametrize("size", [(256, 256, 256), (512, 1024, 2048)], ids=["256", "512x1024x2048"])
def test_dequant_gemms_on_hopper(name, size):
    """TileLang-style dequantizing GEMMs warp-specialized on Gluon: the tile-level unpacking and
    the per-thread dequant steps reading and writing runs of shared tiles (row slices); the one
    storing at strided thread-computed indices on tl."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")
    if name == "int4_per_thread":
        pytest.skip("tl spells its strided per-thread stores into the shared tile as a one-hot over "
                    "the tile: correct on the CPU targets, but minutes on the GPU (it did not "
                    "finish in 4 minutes with the other cases)")
    program, inputs, reference, out_dtype = DEQUANT_GEMMS[name]
    A, qB, Scale = inputs(*size)
    C = torch.full((size[0], size[1]), float("nan"), dtype=out_dtype)
    kern = tilews.compile(program(*size), target="hopper")
    got = C.cuda()
    kern(A.cuda(), qB.cuda(), Scale.cuda(), got)
    close(got.cpu(), reference(A, qB, Scale))
    assert kern.report.backend == ("tl" if name == "int4_per_thread" else "gluon"), kern.report
