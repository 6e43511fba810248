"""tilews.autotuner: @autotune above @tilews.jit, and the AutoTuner builder (TileLang's surface).

Small GEMMs on the interpreter. Where a test needs one configuration to be slower, it uses
16x16 tiles against 64x64 ones: on a 64^3 GEMM the interpreter runs about 10x more statements.
"""
from __future__ import annotations

import ast
import importlib
import json
import os
import threading

import pytest
import torch

import tilews
import tilews.autotuner as autotuner_pkg
import tilews.language as T
from tilews.autotuner import (AutoTuner, AutotuneResult, autotune, get_autotune_inputs,
                              set_autotune_inputs)
from tilews.autotuner import search as search_module
from tilews.autotuner import tuner as tuner_module

from .helpers import randn

jit_module = importlib.import_module("tilews.jit")  # the module; tilews.jit is the decorator

N = 64
FAST = {"block_M": 64, "block_N": 64, "block_K": 64}
SLOW = {"block_M": 16, "block_N": 16, "block_K": 16}
QUICK = dict(warmup=1, rep=3)      # iteration counts: keep the tests fast


def matmul(M, N, K, block_M=32, block_N=32, block_K=32, scale=1.0, tag=None):
    """C = scale * A @ B (``scale`` != 1 makes a configuration wrong on purpose; ``tag`` does
    nothing: a parameter to leave out of the tuning key)."""
    @T.prim_func
    def main(A: T.Tensor((M, K), T.float32), B: T.Tensor((K, N), T.float32),
             C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), T.float32)
            B_s = T.alloc_shared((block_K, block_N), T.float32)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=1):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_f)
            for i, j in T.Parallel(block_M, block_N):
                C_f[i, j] = C_f[i, j] * scale
            T.copy(C_f, C[by * block_M, bx * block_N])
    return main


def jitted():
    return tilews.jit(out_idx=[-1], target="interpret")(matmul)


def reference(A, B):
    return A @ B


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Each test tunes into its own empty cache."""
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TILEWS_DISABLE_CACHE", raising=False)
    return tmp_path


@pytest.fixture
def no_search(monkeypatch):
    """Tuning from here on fails the test: only a cache hit or a bypass may answer."""
    def refuse(*_a, **_k):
        raise AssertionError("the autotuner searched")
    monkeypatch.setattr(tuner_module, "search", refuse)


def check_gemm(kernel, scale=1.0):
    a, b = randn(N, N, seed=1), randn(N, N, seed=2)
    torch.testing.assert_close(kernel(a, b), scale * (a @ b), rtol=1e-5, atol=1e-4)


def test_module_exports_tilelang_names():
    namespace = {}
    exec("from tilews.autotuner import *", namespace)
    assert sorted(k for k in namespace if not k.startswith("__")) == [
        "AutoTuner", "AutotuneResult", "autotune", "get_autotune_inputs", "set_autotune_inputs"]
    assert sorted(autotuner_pkg.__all__) == sorted(k for k in namespace if not k.startswith("__"))


def test_picks_the_fastest_configuration():
    tuned = autotune(configs=[SLOW, FAST], ref_prog=reference, **QUICK)(jitted())
    kernel = tuned(N, N, N)
    assert kernel.config == FAST
    assert kernel.latency > 0 and kernel.ref_latency > 0
    check_gemm(kernel)
    assert tuned(N, N, N) is kernel          # the same call again: the in-memory result


def test_configuration_failing_the_reference_check_is_dropped():
    wrong_but_fast = {**FAST, "scale": 2.0}
    tuned = autotune(configs=[wrong_but_fast, SLOW], ref_prog=reference, **QUICK)(jitted())
    kernel = tuned(N, N, N)
    assert kernel.config == SLOW
    check_gemm(kernel)


def test_manual_check_prog_gets_output_and_reference_lists():
    seen = []

    def manual_check(outs, refs):
        seen.append((len(outs), len(refs)))
        torch.testing.assert_close(outs[0], refs[0], rtol=1e-5, atol=1e-4)

    tuned = autotune(configs=[{**FAST, "scale": 3.0}, SLOW], ref_prog=reference,
                     manual_check_prog=manual_check, **QUICK)(jitted())
    assert tuned(N, N, N).config == SLOW
    assert seen == [(1, 1), (1, 1)]


def test_no_configuration_succeeding_is_a_runtime_error_listing_each():
    configs = [{**FAST, "scale": 2.0}, {**SLOW, "block_K": 0}]
    tuned = autotune(configs=configs, ref_prog=reference, **QUICK)(jitted())
    with pytest.raises(RuntimeError) as info:
        tuned(N, N, N)
    message = str(info.value)
    assert "no configuration" in message
    assert f"{configs[0]}: reference check failed" in message
    assert f"{configs[1]}: compile failed" in message


def test_timeout_drops_a_configuration():
    def slow_reference(A, B):
        import time
        time.sleep(1.0)
        return A @ B

    tuned = autotune(configs=[FAST], ref_prog=slow_reference, timeout=0.2, **QUICK)(jitted())
    with pytest.raises(RuntimeError, match=r"timed out after 0.2 s"):
        tuned(N, N, N)


def test_given_configuration_key_bypasses_tuning(no_search):
    tuned = autotune(configs=[SLOW, FAST], **QUICK)(jitted())
    by_keyword = tuned(N, N, N, block_M=32)
    assert by_keyword.latency is None and by_keyword.config is None
    check_gemm(by_keyword)
    positional = tuned(N, N, N, 16)            # block_M given positionally
    assert positional.latency is None
    check_gemm(positional)


def test_unknown_configuration_key_is_a_value_error():
    with pytest.raises(ValueError, match=r"'blk_M' is not a parameter of 'matmul' "
                                         r"\(its parameters: M, N, K, block_M"):
        autotune(configs=[{"blk_M": 32}])(jitted())
    tuned = autotune(configs=lambda M, N, K: [{"block_m": M}])(jitted())
    with pytest.raises(ValueError, match="'block_m' is not a parameter"):
        tuned(N, N, N)


def test_decorator_misuse():
    with pytest.raises(ValueError, match=r"@autotune\(configs="):
        autotune(jitted())
    with pytest.raises(TypeError, match=r"stacked above @tilews.jit"):
        autotune(configs=[FAST])(matmul)


def test_callable_configs_receive_the_call_arguments():
    seen = []

    def configs(M, N, K):
        seen.append((M, N, K))
        return [SLOW, {"block_M": M, "block_N": N, "block_K": K}]

    kernel = autotune(configs=configs, **QUICK)(jitted())(N, N, N)
    assert seen == [(N, N, N)] and kernel.config == FAST


def test_do_not_specialize_shares_one_tuning(monkeypatch):
    searches = []
    real = tuner_module.search
    monkeypatch.setattr(tuner_module, "search", lambda *a, **k: searches.append(1) or real(*a, **k))
    tuned = autotune(configs=[SLOW, FAST], do_not_specialize=["tag"], **QUICK)(jitted())
    first = tuned(N, N, N, tag="a")
    assert tuned(N, N, N, tag="b") is first and len(searches) == 1
    tuned(N, N, 32, tag="a")                   # another shape is another tuning
    assert len(searches) == 2


def test_disk_cache_answers_a_second_tuner(cache_dir, monkeypatch):
    first = autotune(configs=[SLOW, FAST], **QUICK)(jitted())(N, N, N)
    records = list((cache_dir / "autotuner").glob("*.json"))
    assert len(records) == 1
    stored = json.loads(records[0].read_text())
    assert stored["config_index"] == 1 and stored["latency"] == first.latency

    compiled = []
    real = tuner_module.Variants.get
    monkeypatch.setattr(tuner_module.Variants, "get",
                        lambda self, pc: compiled.append(1) or real(self, pc))

    def refuse(*_a, **_k):
        raise AssertionError("the autotuner searched")
    monkeypatch.setattr(tuner_module, "search", refuse)
    second = autotune(configs=[SLOW, FAST], **QUICK)(jitted())(N, N, N)
    assert second is not first and len(compiled) == 1       # only the stored winner compiled
    assert (second.config, second.latency, second.ref_latency) == (FAST, first.latency, None)
    check_gemm(second)


def test_disk_cache_keys_on_the_call_and_can_be_disabled(cache_dir, monkeypatch):
    autotune(configs=[SLOW, FAST], **QUICK)(jitted())(N, N, N)
    autotune(configs=[SLOW, FAST], **QUICK)(jitted())(N, N, 32)   # another call: another record
    assert len(list((cache_dir / "autotuner").glob("*.json"))) == 2
    monkeypatch.setenv("TILEWS_DISABLE_CACHE", "1")
    autotune(configs=[SLOW, FAST], **QUICK)(jitted())(32, N, N)
    assert len(list((cache_dir / "autotuner").glob("*.json"))) == 2


def test_disk_cache_is_bypassed_with_a_reference_program(cache_dir):
    autotune(configs=[SLOW, FAST], ref_prog=reference, **QUICK)(jitted())(N, N, N)
    assert not (cache_dir / "autotuner").exists()


def test_from_kernel_builder():
    def factory(block_M=None, block_N=None, block_K=None, scale=1.0):
        return matmul(N, N, N, block_M, block_N, block_K, scale)

    result = (AutoTuner.from_kernel(kernel=factory, configs=[{**FAST, "scale": 2.0}, SLOW, FAST])
              .set_compile_args(out_idx=[-1], target="interpret")
              .set_profile_args(ref_prog=reference)
              .run(**QUICK))
    assert isinstance(result, AutotuneResult)
    assert result.config == FAST and result.latency == result.kernel.latency > 0
    assert result.ref_latency > 0 and isinstance(result.libcode, str) and result.libcode
    check_gemm(result.kernel)


def test_early_stop_keeps_the_estimate_of_a_clearly_slower_configuration(monkeypatch):
    launches = []       # per profiler (one per configuration timed): kernel launches it made
    real = tilews.Kernel.get_profiler

    def counting(kernel, *args, **kwargs):
        profiler = real(kernel, *args, **kwargs)
        launches.append(0)
        slot, launch = len(launches) - 1, profiler.func

        def counted(*inputs):
            launches[slot] += 1
            return launch(*inputs)
        profiler.func = counted
        return profiler
    monkeypatch.setattr(tilews.Kernel, "get_profiler", counting)

    kernel = autotune(configs=[FAST, SLOW], early_stop=True, early_stop_factor=2.0,
                      warmup=1, rep=20)(jitted())(N, N, N)
    assert kernel.config == FAST
    fast, slow = launches
    assert slow < 20 < fast     # FAST timed in full; SLOW stopped after its estimate

    launches.clear()
    autotune(configs=[FAST, SLOW], warmup=1, rep=20)(jitted())(N, N, N)
    assert launches[0] == launches[1] > 20
    with pytest.raises(ValueError, match="early_stop_factor must be >= 1.0"):
        autotune(configs=[FAST], early_stop=True, early_stop_factor=0.5)


def test_per_configuration_pass_configs_reach_with_pass_configs():
    jit_fn = tilews.jit(out_idx=[-1], target="interpret",
                        pass_configs={"tl.enable_fast_math": True})(matmul)
    received = []
    real = jit_fn.with_pass_configs

    def spy(extra):
        received.append(extra)
        return real(extra)
    jit_fn.with_pass_configs = spy
    fast_ws = {**FAST, "pass_configs": {"tl.disable_warp_specialized": True}}
    kernel = autotune(configs=[SLOW, fast_ws], **QUICK)(jit_fn)(N, N, N)
    assert received == [{"tl.disable_warp_specialized": True}]
    assert kernel.config == fast_ws
    check_gemm(kernel)


def test_set_autotune_inputs_are_the_benchmark_inputs():
    a, b = randn(N, N, seed=5), randn(N, N, seed=6)
    seen = []

    def recording_reference(A, B):
        seen.append((A.clone(), B.clone()))
        return A @ B

    assert get_autotune_inputs() is None
    with set_autotune_inputs(a, b):
        assert get_autotune_inputs() == [a, b]
        autotune(configs=[SLOW, FAST], ref_prog=recording_reference, **QUICK)(jitted())(N, N, N)
    assert get_autotune_inputs() is None
    assert seen and all(torch.equal(x, a) and torch.equal(y, b) for x, y in seen)


def eager_matmul(A, B, block_M=32, block_N=32, block_K=32):
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), T.float32)
    B: T.Tensor((K, N), T.float32)
    C = T.empty((M, N), T.float32)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
        A_s = T.alloc_shared((block_M, block_K), T.float32)
        B_s = T.alloc_shared((block_K, block_N), T.float32)
        C_f = T.alloc_fragment((block_M, block_N), T.float32)
        T.clear(C_f)
        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=1):
            T.copy(A[by * block_M, k * block_K], A_s)
            T.copy(B[k * block_K, bx * block_N], B_s)
            T.gemm(A_s, B_s, C_f)
        T.copy(C_f, C[by * block_M, bx * block_N])
    return C


def test_eager_style_tunes_on_the_call_tensors_and_runs():
    tuned = autotune(configs=[SLOW, FAST], **QUICK)(tilews.jit(target="interpret")(eager_matmul))
    a, b = randn(N, N, seed=3), randn(N, N, seed=4)
    a0, b0 = a.clone(), b.clone()
    torch.testing.assert_close(tuned(a, b), a @ b, rtol=1e-5, atol=1e-4)
    assert torch.equal(a, a0) and torch.equal(b, b0)
    kernel = tuned.compile(a, b)
    assert kernel.config == FAST and kernel.latency > 0
    torch.testing.assert_close(kernel(a, b), a @ b, rtol=1e-5, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# compiling the space: TILEWS_COMPILE_WORKERS threads, or one after the other


COMPILE_ALL = search_module._compile_all


def tune_with_workers(monkeypatch, workers: int, configs: list[dict]):
    """Tune ``configs`` with ``TILEWS_COMPILE_WORKERS=workers``: (the kernel or the error raised,
    the trials compiled as (config, failure, generated source), the compiling threads)."""
    monkeypatch.setenv("TILEWS_COMPILE_WORKERS", str(workers))
    trials, threads = [], set()

    def spy(space, compile_one):
        def one(config):
            threads.add(threading.get_ident())
            return compile_one(config)
        trials.extend(COMPILE_ALL(space, one))
        return trials
    monkeypatch.setattr(search_module, "_compile_all", spy)
    try:
        outcome = autotune(configs=configs, ref_prog=reference, **QUICK)(jitted())(N, N, N)
    except RuntimeError as e:
        outcome = e
    compiled = [(t.config, t.failure, t.kernel and t.kernel.get_kernel_source()) for t in trials]
    return outcome, compiled, threads


@pytest.fixture
def threads_allowed(monkeypatch):
    """Threads on this Python too: ``ast.parse`` (shared recursion state before CPython 3.11.8,
    ``jit.ast_is_thread_safe``) made one at a time, the rest of each compile concurrent."""
    lock, parse = threading.Lock(), ast.parse

    def one_at_a_time(*args, **kwargs):
        with lock:
            return parse(*args, **kwargs)
    monkeypatch.setattr(ast, "parse", one_at_a_time)
    monkeypatch.setattr(jit_module, "ast_is_thread_safe", lambda: True)


def test_parallel_compiles_give_the_serial_trials_and_winner(monkeypatch, threads_allowed):
    bad_tile = {**SLOW, "block_K": 0}
    configs = [SLOW, bad_tile, FAST, {**SLOW, "block_N": 32}]
    serial, serial_trials, serial_threads = tune_with_workers(monkeypatch, 1, configs)
    parallel, parallel_trials, parallel_threads = tune_with_workers(monkeypatch, 3, configs)
    assert serial_threads == {threading.get_ident()} and len(parallel_threads) > 1
    assert parallel_trials == serial_trials
    assert [c for c, _, _ in serial_trials] == configs
    assert [f is None for _, f, _ in serial_trials] == [True, False, True, True]
    assert serial_trials[1][1].startswith("compile failed: ")
    assert serial.config == parallel.config == FAST
    check_gemm(parallel)


def test_a_failing_compile_in_the_middle_is_reported_as_serially(monkeypatch, threads_allowed):
    configs = [{**FAST, "scale": 2.0}, {**SLOW, "block_K": 0}, {**FAST, "scale": 3.0}]
    reports = []
    for workers in (1, 3):
        error, _, _ = tune_with_workers(monkeypatch, workers, configs)
        assert isinstance(error, RuntimeError)
        reports.append(str(error).splitlines())
    kinds = ["reference check failed", "compile failed", "reference check failed"]
    for report in reports:
        starts = [next(i for i, line in enumerate(report)
                       if line.startswith(f"  {config}: {kind}: "))
                  for config, kind in zip(configs, kinds)]
        assert starts == sorted(starts)         # in the configurations' order
    # the compile failure word for word, with its source line (the reference check's lines quote
    # the random inputs' worst element)
    serial, parallel = ("\n".join(r).split(f"  {configs[1]}: ")[1].split(f"  {configs[2]}")[0]
                        for r in reports)
    assert parallel == serial and "shared buffer shape must be positive" in serial


def test_one_compile_worker_compiles_one_after_the_other_on_the_calling_thread(monkeypatch):
    def no_pool(*_a, **_k):
        raise AssertionError("a thread pool was started")
    monkeypatch.setattr(jit_module, "ThreadPoolExecutor", no_pool)
    monkeypatch.setattr(jit_module, "ast_is_thread_safe", lambda: True)
    kernel, trials, threads = tune_with_workers(monkeypatch, 1, [SLOW, FAST])
    assert threads == {threading.get_ident()} and kernel.config == FAST
    assert [c for c, _, _ in trials] == [SLOW, FAST]


def test_hopper_space_compiles_in_threads_to_the_serial_kernels(monkeypatch, threads_allowed):
    """Compile-only (no GPU): ``examples/gemm.py``'s configurations for ``hopper`` through the
    autotuner's compile step; the same Gluon builds (PTX) and failures either way."""
    from examples.gemm import matmul as gemm
    space = [dict(block_N=128, block_K=32), dict(block_N=64, block_K=0),
             dict(block_N=256, block_K=64, threads=256)]
    monkeypatch.setenv("TILEWS_DISABLE_CACHE", "1")     # the parallel round builds too
    compiled = []
    for workers in (1, 3):
        monkeypatch.setenv("TILEWS_COMPILE_WORKERS", str(workers))
        fn = tilews.jit(out_idx=[-1], target="hopper")(gemm.fn)    # its memo empty
        trials = COMPILE_ALL(space, lambda config: fn.compile(256, 256, 256, **config))
        compiled.append([(t.failure, t.kernel and (t.kernel.target, t.kernel.asm["ptx"]))
                         for t in trials])
    serial, parallel = compiled
    assert parallel == serial
    assert [kernel[0] if kernel else None for _, kernel in serial] == ["hopper", None, "hopper"]
    assert serial[1][0].startswith("compile failed: CompileError: ")


def test_hopper_space_builds_in_forked_children_and_loads_their_builds(monkeypatch, tmp_path):
    """``TILEWS_COMPILE_PROCESSES``: with 3 workers the configurations after the first are built
    by forked children (each with its own compile server), and this process then loads their
    builds from the artifact store: it runs Triton once (the first configuration), and gets the
    PTX a serial compile gets."""
    from examples.gemm import matmul as gemm
    from tilews.triton_ext.gluon import launch
    space = [dict(block_N=128, block_K=32), dict(block_N=64, block_K=64),
             dict(block_N=256, block_K=64, threads=256)]
    builds = []
    build = launch._run_compile

    def counted(source, spec, kernel, store):
        builds.append(os.getpid())
        return build(source, spec, kernel, store)
    monkeypatch.setattr(launch, "_run_compile", counted)
    compiled = {}
    for workers, processes in ((1, "off"), (3, "on")):
        monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path / f"cache{workers}"))
        monkeypatch.setenv("TILEWS_COMPILE_WORKERS", str(workers))
        monkeypatch.setenv("TILEWS_COMPILE_PROCESSES", processes)
        builds.clear()
        fn = tilews.jit(out_idx=[-1], target="hopper")(gemm.fn)    # its memo empty
        trials = COMPILE_ALL(space, lambda config: fn.compile(256, 256, 256, **config))
        assert all(t.failure is None for t in trials), [t.failure for t in trials]
        compiled[workers] = ([t.kernel.asm["ptx"] for t in trials], list(builds))
    (serial, serial_builds), (parallel, parallel_builds) = compiled[1], compiled[3]
    assert parallel == serial and len(set(serial)) == 3
    assert serial_builds == [os.getpid()] * 3 and parallel_builds == [os.getpid()]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")
def test_forked_children_answer_the_machine_from_their_parent(monkeypatch, tmp_path):
    """On a GPU host the parent has used CUDA before it forks (its first compile asked for the
    device's capability), and CUDA cannot be initialized again in a forked child: a child answers
    ``targets``' questions from the parent's snapshot, so its builds happen. Simulated: torch's
    CUDA queries answer in this process and raise in any other (as torch does after a fork)."""
    import types
    from tilews import compile_processes, targets
    parent = os.getpid()

    def only_here(value):
        def query(*args, **kwargs):
            if os.getpid() != parent:
                raise RuntimeError("Cannot re-initialize CUDA in forked subprocess")
            return value
        return query
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", only_here((9, 0)))
    monkeypatch.setattr(torch.cuda, "current_device", only_here(0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", only_here(types.SimpleNamespace(multi_processor_count=114)))
    monkeypatch.setattr(torch.version, "hip", None)

    def answer(i):
        (tmp_path / f"{i}.txt").write_text(repr((targets.machine(), targets.num_sms(), targets.resolve("auto")[0])))
    compile_processes.prebuild([1, 2, 3], answer, 2)
    want = repr((targets.machine(), 114, "hopper"))
    assert [(tmp_path / f"{i}.txt").read_text() if (tmp_path / f"{i}.txt").exists() else None
            for i in (1, 2, 3)] == [want] * 3


def test_compile_processes_need_the_switch_and_the_artifact_store():
    """Children are forked only where ``TILEWS_COMPILE_PROCESSES`` is on (off by default) and
    the on-disk cache is on (without it a child's build would be lost)."""
    from tilews import compile_processes
    from tilews.lowering.settings import Settings
    assert not compile_processes.usable(Settings())                # off by default
    assert compile_processes.usable(Settings(compile_processes=True)) == hasattr(os, "fork")
    assert not compile_processes.usable(Settings(disable_cache=True, compile_processes=True))
