"""tilews.ops.matmul and the launch fast path on an sm_90 GPU: every schedule against float64
torch at LLM-like and ragged shapes (no NaN, rel err < 1e-2), a runtime-M kernel re-launched
directly across Triton's specializations (M = 1 is a constant to Triton, 16 | M and not), TMA
descriptors cached per address and re-encoded for a new one, and the op under CUDA graphs."""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T
from tilews.ops import gemm_programs, matmul, run
from tilews.ops.schedule import Schedule
from tilews.testing import rel_err

pytestmark = pytest.mark.gpu

SCHEDULES = ["tiled 64x128x64 s6 t128 g8", "tiled 128x128x64 s4 t128 g8",
             "persistent 128x256x64 s3 t256 g8", "split_k 64x128x64 s6 t128 x4",
             "split_k 64x64x64 s8 t128 x3", "split_k_fused 16x64x128 s4 t128 x2",
             "split_k_fused 64x128x64 s4 t128 x3", "split_k_fused 128x128x64 s4 t128 x2",
             "split_k_fused 128x256x64 s3 t256 x2", "swap_ab 16x128x64 s6 t128",
             "swap_ab 32x128x64 s6 t128", "stream_k 128x256x64 s3 t256 g8",
             "stream_k 128x128x64 s6 t128 g4"]


def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")


def _inputs(M, N, K, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", generator=g).to(dtype)
    b = torch.randn(K, N, device="cuda", generator=g).to(dtype)
    return a, b


@pytest.mark.parametrize("text", SCHEDULES)
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (17, 1000, 1232), (128, 520, 4096), (333, 264, 136)])
def test_every_schedule_matches_float64(text, shape):
    _hopper()
    M, N, K = shape
    a, b = _inputs(M, N, K)
    c = run(a, b, None, Schedule.from_text(text))
    assert c.shape == (M, N) and c.dtype == torch.bfloat16
    assert rel_err(c, a.double() @ b.double()) < 1e-2


def test_matmul_picks_a_schedule_per_shape_and_reuses_kernels():
    _hopper()
    for M in (1, 16, 33, 512, 2048):
        a, b = _inputs(M, 1536, 2048, seed=M)
        for out in (None, torch.float32):
            c = matmul(a, b, out)
            assert c.dtype == (out or torch.bfloat16)
            assert rel_err(c, a.double() @ b.double()) < 1e-2


def test_a_runtime_m_kernel_relaunches_directly_across_specializations():
    _hopper()
    k = tilews.jit(out_idx=[-1], target="hopper")(gemm_programs.tiled.fn)(
        T.dynamic("M"), 256, 512, block_M=64, block_N=128, block_K=64, num_stages=4)
    results = {}
    for rnd in range(3):                       # the second and third rounds launch directly
        for M in (1, 16, 17, 64, 1, 200):
            a, b = _inputs(M, 256, 512, seed=M + 100 * rnd)
            results[(rnd, M)] = rel_err(k(a, b), a.double() @ b.double())
    assert max(results.values()) < 1e-2, results
    launcher = k.program._host[2]
    # M = 1 (a constant to Triton), 16 | M, and neither: three compiled specializations
    assert len(launcher.compiled) == 3, list(launcher.compiled)
    assert all(d.raw is not None for d in launcher.compiled.values())


def test_descriptors_are_cached_per_address_and_follow_a_new_one():
    _hopper()
    k = tilews.jit(target="hopper")(gemm_programs.tiled.fn)(
        128, 256, 512, block_M=64, block_N=128, block_K=64, num_stages=4)
    a, b = _inputs(128, 256, 512)
    outs = [torch.full((128, 256), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    for _ in range(2):
        for c in outs:
            c.fill_(float("nan"))
            k(a, b, c)
            assert rel_err(c, a.double() @ b.double()) < 1e-2
    cache = getattr(k.program._host[0].__globals__["_tilews_descriptor"], "entries")
    assert len(cache) == 4                     # a, b, and each of the two outputs
    a2, b2 = _inputs(128, 256, 512, seed=5)   # new addresses: new descriptors
    k(a2, b2, outs[0])
    assert rel_err(outs[0], a2.double() @ b2.double()) < 1e-2


def test_a_tma_kernel_launches_first_from_a_thread_that_never_touched_cuda():
    # Triton encodes TMA descriptors before its launcher binds a CUDA context to the thread
    import threading
    _hopper()
    k = tilews.jit(target="hopper")(gemm_programs.tiled.fn)(
        192, 256, 320, block_M=64, block_N=128, block_K=64, num_stages=2)
    a, b = _inputs(192, 256, 320)
    c = torch.full((192, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    failed = []

    def launch():
        try:
            k(a, b, c)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (reported by the assertion below)
            failed.append(e)

    t = threading.Thread(target=launch)
    t.start()
    t.join()
    assert not failed, failed
    assert rel_err(c, a.double() @ b.double()) < 1e-2


def test_matmul_under_a_cuda_graph():
    _hopper()
    a, b = _inputs(64, 1024, 2048)
    for s in ("split_k 64x128x64 s6 t128 x4", "tiled 64x128x64 s6 t128 g8",
              "split_k_fused 64x128x64 s4 t128 x4", "stream_k 128x128x64 s6 t128 g8"):
        schedule = Schedule.from_text(s)
        run(a, b, None, schedule)              # compiled and launched once outside the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            c = run(a, b, None, schedule)
        for _ in range(3):                     # replays: split_k_fused's counters stay at zero
            a.copy_(torch.randn_like(a))
            c.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert rel_err(c, a.double() @ b.double()) < 1e-2, s


@pytest.mark.parametrize("text, M, backend", [("split_k_fused 16x64x128 s4 t128 x4", 16, "tl"),
                                              ("split_k_fused 64x128x64 s4 t128 x4", 100, "gluon"),
                                              ("stream_k 128x256x64 s3 t256 g8", 1000, "gluon"),
                                              ("stream_k 128x128x64 s6 t128 g8", 4000, "gluon")])
def test_split_k_fused_is_deterministic_and_keeps_streams_apart(text, M, backend):
    """The last-arriving block sums the slices (stream_k: the segments) in order: the same bits
    on every call, with blocks finishing in any order; the arrival counts come back to zero; two
    streams running it at once each count on their own counters. 16-row blocks run as
    triton.language, 64-row ones warp-specialized (partials stored from registers before the
    release). stream_k at 1000 rows: 128 tiles, all shared out over 132 blocks; at 4000: 1008
    tiles, 84 of them shared out after 7 whole waves."""
    _hopper()
    from tilews.ops.arrivals import _counters
    from tilews.ops.matmul import _runner
    schedule = Schedule.from_text(text)
    runner = _runner(schedule, 4096, 4096, torch.bfloat16, torch.bfloat16, "cuda", "tf32")
    runner = runner.runner(M) if schedule.program == "stream_k" else runner
    assert runner.kernels[0].report.backend == backend
    a, b = _inputs(M, 4096, 4096)
    first = run(a, b, None, schedule)
    assert rel_err(first, a.double() @ b.double()) < 1e-2
    for _ in range(30):
        assert torch.equal(run(a, b, None, schedule), first)
    torch.cuda.synchronize()
    assert all(int(c.abs().sum()) == 0 for c in _counters.values())
    streams = [torch.cuda.Stream() for _ in range(2)]
    inputs = [_inputs(M, 4096, 4096, seed=s) for s in (1, 2)]
    torch.cuda.synchronize()
    outs = [[], []]
    for _ in range(20):                        # interleaved launches, both streams busy at once
        for stream, (x, y), out in zip(streams, inputs, outs):
            with torch.cuda.stream(stream):
                out.append(run(x, y, None, schedule))
    torch.cuda.synchronize()
    for (x, y), out in zip(inputs, outs):
        assert rel_err(out[0], x.double() @ y.double()) < 1e-2
        assert all(torch.equal(c, out[0]) for c in out)
    assert all(int(c.abs().sum()) == 0 for c in _counters.values())


def test_launch_hooks_are_called_when_set_and_cost_nothing_when_empty(monkeypatch):
    """A cached call launches through Triton's C launcher directly while no launch hook listens
    (Triton 3.6's empty hook chain counts as none: the kernel's launch metadata is never built);
    a hook that is added (a profiler's) sees every launch, through the kernel's own run."""
    _hopper()
    import triton.knobs as knobs
    from triton.compiler.compiler import CompiledKernel
    a, b = _inputs(256, 256, 512)
    k = tilews.jit(out_idx=[-1], target="hopper")(gemm_programs.tiled.fn)(
        T.dynamic("M"), 256, 512, block_M=64, block_N=128, block_K=64, num_stages=4)
    k(a, b)                                           # compiles
    built = []
    real = CompiledKernel.launch_metadata
    monkeypatch.setattr(CompiledKernel, "launch_metadata",
                        lambda self, *args: built.append(1) or real(self, *args))
    c = k(a, b)
    assert not built and rel_err(c, a.double() @ b.double()) < 1e-2
    seen = []
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        c = k(a, b)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(seen) == 1 and built and rel_err(c, a.double() @ b.double()) < 1e-2


def test_kept_calls_launch_straight_to_the_c_launcher_and_stay_correct(monkeypatch):
    """A kept call (``run``'s, as ``matmul``'s) of a one-kernel Gluon schedule launches through
    ``GluonProgram.bound_launch``: after the first call no call goes through ``Launcher.launch``
    while nothing listens, with new inputs (new addresses, then the first's again: descriptors
    per address), a launch hook added (then every call goes the general way and the hook sees
    it), and under a CUDA graph."""
    _hopper()
    import triton.knobs as knobs
    from tilews.triton_ext.launcher import Launcher
    general = []
    real = Launcher.launch
    monkeypatch.setattr(Launcher, "launch", lambda self, grid, args: general.append(1) or real(self, grid, args))
    schedule = Schedule.from_text("tiled 128x128x64 s4 t128 g8")
    sets = [_inputs(256, 512, 1024, seed=s) for s in range(3)]
    run(*sets[0], None, schedule)                     # the first call of the kind: the general way
    general.clear()
    for a, b in sets + sets[:1]:
        c = run(a, b, None, schedule)
        assert rel_err(c, a.double() @ b.double()) < 1e-2
    assert not general
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        c = run(*sets[1], None, schedule)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert general and seen and rel_err(c, sets[1][0].double() @ sets[1][1].double()) < 1e-2
    general.clear()
    a, b = sets[2]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = run(a, b, None, schedule)
    for seed in (7, 8):
        a.copy_(_inputs(256, 512, 1024, seed=seed)[0])
        c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(c, a.double() @ b.double()) < 1e-2
    assert not general
