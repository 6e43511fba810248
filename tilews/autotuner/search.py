"""The search: compile every configuration, check and time each one, keep the fastest.

Contract of ``search(configs, compile_one, profile, plan, inputs)``:
* Every configuration is compiled by ``compile_one(config)`` before any is timed, the first on
  the calling thread, the others in up to ``TILEWS_COMPILE_WORKERS`` threads (default: the CPU
  count; 1: one after the other on the calling thread), built first by as many forked processes
  where ``TILEWS_COMPILE_PROCESSES`` is on (off by default) and the on-disk cache is on
  (``tilews.jit.compile_each``). A compile that raises is that configuration's failure (``"compile failed: <error>"``); the search goes on
  without it. The trials, their kernels and failures, are the same whatever the worker count.
* The compiled kernels are then measured one at a time, in the configurations' order, on the
  calling thread's device, each within ``plan.timeout`` seconds (0 or less: no limit):
  1. inputs: ``inputs`` if given (copied once, so the caller's tensors are never written), else
     ``profile.supply_prog(params)`` (``params``: the kernel's input ``KernelParam``s, with
     ``.name``, ``.shape`` and ``.dtype``), else the profiler's generated ones
     (``profile.supply_type``); with ``profile.cache_input_tensors``, generated inputs are made
     once per input signature;
  2. unless ``profile.skip_check`` or no ``profile.ref_prog``: the reference check,
     ``profile.manual_check_prog(outputs, reference_outputs)`` (lists) if given, else
     ``profiler.assert_allclose`` with ``rtol``/``atol``/``max_mismatched_ratio``; an
     ``AssertionError`` drops the configuration;
  3. the latency: ``profiler.do_bench(n_warmup=plan.warmup, n_repeat=plan.rep,
     backend=profile.backend)`` in ms (iteration counts, as in TileLang's autotuner). With
     ``plan.early_stop``, once some configuration has a latency, ``do_bench`` gets
     ``early_stop_baseline`` = the best latency times ``plan.early_stop_factor``: a configuration
     whose 5-run estimate exceeds it keeps the estimate as its latency.
  A configuration that raises, fails its check, or runs past the timeout is dropped, with the
  reason recorded. A timed-out run cannot be stopped: its thread is left to finish on its own.
* The best kernel (minimum latency, the first on ties) gets ``.latency``, ``.config`` (the
  configuration dict) and ``.ref_latency`` (``ref_prog`` timed once, on the best kernel's inputs;
  ``None`` without ``ref_prog``) and is returned with its configuration's index. If no
  configuration survives: ``RuntimeError`` listing each configuration's failure.

Why threads and processes for the compiles: threads need nothing to pickle and pay imports
once, but overlap only what runs outside the GIL and outside ``passes.checking``'s lock: Gluon's
in-process build, most of a Hopper compile, runs one at a time per process. So, with
``TILEWS_COMPILE_PROCESSES`` (off by default) and the on-disk cache on, ``compile_each`` first
has the configurations after the first built by forked children (``tilews.compile_processes``)
and then compiles each here, loading the children's builds. On the 2-core development CPU, busy with other work, neither gives
a speed-up (six ``examples/gemm.py`` configurations for ``hopper``, cold caches); ``python -m
tilews.bench.compile_workers`` measures serial, threads and processes where cores are free.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from tilews.jit import compile_each
from tilews.profiler import TensorSupplyType

from .result import Trial

logger = logging.getLogger("tilews.autotuner")


@dataclass(frozen=True)
class ProfileArgs:
    """How each configuration is fed, checked and clocked (``AutoTuner.set_profile_args``,
    ``autotune(...)``; ``backend``: ``do_bench``'s)."""
    supply_type: TensorSupplyType = TensorSupplyType.Auto
    ref_prog: Optional[Callable] = None
    supply_prog: Optional[Callable] = None
    rtol: float = 1e-2
    atol: float = 1e-2
    max_mismatched_ratio: float = 0.01
    skip_check: bool = False
    manual_check_prog: Optional[Callable] = None
    cache_input_tensors: bool = False
    backend: str = "event"

    def __post_init__(self):
        if not isinstance(self.supply_type, TensorSupplyType):
            raise ValueError(f"supply_type must be a TensorSupplyType "
                             f"({', '.join(t.name for t in TensorSupplyType)}), got "
                             f"{self.supply_type!r}")

    @property
    def has_callbacks(self) -> bool:
        """A user program takes part in the measurement (no tuning result may be reused from disk:
        a callback has no identity that survives the process)."""
        return any(p is not None for p in (self.ref_prog, self.supply_prog, self.manual_check_prog))


@dataclass(frozen=True)
class SearchPlan:
    """How hard each configuration is timed: iteration counts, per-configuration timeout (s),
    early stop."""
    warmup: int = 25
    rep: int = 100
    timeout: float = 100
    early_stop: bool = False
    early_stop_factor: float = 2.0

    def __post_init__(self):
        if self.early_stop and self.early_stop_factor < 1.0:
            raise ValueError(f"early_stop_factor must be >= 1.0, got {self.early_stop_factor}")


class _Rejected(Exception):
    """A configuration whose outputs failed the reference check."""


class _TimedOut(Exception):
    """A configuration's measurement ran past the timeout."""


def search(configs: list[dict], compile_one: Callable[[dict], Any], profile: ProfileArgs,
           plan: SearchPlan, inputs: Optional[list] = None) -> tuple[int, Any]:
    """(index of the best configuration, its kernel); see the module docstring."""
    trials = _compile_all(configs, compile_one)
    source = _InputSource(profile, inputs)
    best: Optional[int] = None
    for index, trial in enumerate(trials):
        if trial.failure is not None:
            continue
        baseline = None
        if plan.early_stop and best is not None:
            baseline = trials[best].latency * plan.early_stop_factor
        try:
            trial.latency = _within(plan.timeout, _measure, trial.kernel, source, profile, plan,
                                    baseline)
        except _Rejected as e:
            trial.failure = f"reference check failed: {e}"
        except _TimedOut:
            trial.failure = f"timed out after {plan.timeout:g} s"
        except Exception as e:  # noqa: BLE001  (any error of a candidate drops only that candidate)
            trial.failure = f"failed while running: {_describe(e)}"
        logger.info("autotune: %s", trial.describe())
        if trial.latency is not None and (best is None or trial.latency < trials[best].latency):
            best = index
    if best is None:
        raise RuntimeError("autotune: no configuration compiled and passed benchmarking:\n"
                           + "\n".join("  " + t.describe() for t in trials))
    kernel = trials[best].kernel
    kernel.latency, kernel.config = trials[best].latency, dict(configs[best])
    kernel.ref_latency = _reference_latency(kernel, source, profile, plan)
    return best, kernel


def _compile_all(configs: list[dict], compile_one: Callable[[dict], Any]) -> list[Trial]:
    return compile_each(configs, lambda config: _compile(config, compile_one))


def _compile(config: dict, compile_one: Callable[[dict], Any]) -> Trial:
    try:
        return Trial(config, kernel=compile_one(config))
    except Exception as e:  # noqa: BLE001  (a configuration that does not compile is skipped)
        return Trial(config, failure=f"compile failed: {_describe(e)}")


def _measure(kernel, source: "_InputSource", profile: ProfileArgs, plan: SearchPlan,
             baseline: Optional[float]) -> float:
    profiler = kernel.get_profiler(profile.supply_type)
    ins = source.inputs_for(kernel, profiler)
    if profile.ref_prog is not None and not profile.skip_check:
        try:
            _check(kernel, profiler, ins, profile)
        except AssertionError as e:
            raise _Rejected(str(e) or "the outputs differ from ref_prog's") from None
    return profiler.do_bench(n_warmup=plan.warmup, n_repeat=plan.rep, input_tensors=ins,
                             backend=profile.backend, early_stop_baseline=baseline)


def _check(kernel, profiler, ins: list, profile: ProfileArgs) -> None:
    if profile.manual_check_prog is None:
        profiler.assert_allclose(profile.ref_prog, input_tensors=ins, rtol=profile.rtol,
                                 atol=profile.atol,
                                 max_mismatched_ratio=profile.max_mismatched_ratio)
        return
    refs, outs = _as_list(profile.ref_prog(*ins)), _as_list(kernel(*ins))
    if len(outs) != len(refs):
        raise AssertionError(f"the kernel returned {len(outs)} output(s), ref_prog {len(refs)}")
    profile.manual_check_prog(outs, refs)


def _reference_latency(kernel, source: "_InputSource", profile: ProfileArgs,
                       plan: SearchPlan) -> Optional[float]:
    if profile.ref_prog is None:
        return None
    profiler = kernel.get_profiler(profile.supply_type)
    return profiler.do_bench(profile.ref_prog, n_warmup=plan.warmup, n_repeat=plan.rep,
                             input_tensors=source.inputs_for(kernel, profiler),
                             backend=profile.backend)


class _InputSource:
    """The inputs each configuration is measured on (step 1 of the module docstring)."""

    def __init__(self, profile: ProfileArgs, fixed: Optional[list]):
        self.profile = profile
        self.fixed = None if fixed is None else [_copy(v) for v in fixed]
        self._made: dict = {}

    def inputs_for(self, kernel, profiler) -> list:
        if self.fixed is not None:
            return self.fixed
        params = [p for p in kernel.params if not p.is_output]
        if not self.profile.cache_input_tensors:
            return self._make(params, profiler)
        signature = tuple((p.name, p.shape, p.dtype) for p in params)
        if signature not in self._made:
            self._made[signature] = self._make(params, profiler)
        return self._made[signature]

    def _make(self, params: list, profiler) -> list:
        if self.profile.supply_prog is not None:
            return list(self.profile.supply_prog(params))
        return profiler.supply()


def _within(timeout: float, fn: Callable, *args):
    """``fn(*args)`` on a helper thread (bound to the caller's CUDA device), ``_TimedOut``
    after ``timeout`` seconds; called directly when ``timeout`` is 0 or less."""
    if not timeout or timeout <= 0:
        return fn(*args)
    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    box: dict[str, Any] = {}

    def work():
        try:
            if device is not None:
                torch.cuda.set_device(device)
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001  (handed back to the calling thread)
            box["error"] = e

    worker = threading.Thread(target=work, name="tilews-autotune-bench", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise _TimedOut
    if "error" in box:
        raise box["error"]
    return box["value"]


def _copy(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _as_list(outputs) -> list:
    if outputs is None:
        return []
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _describe(error: BaseException) -> str:
    text = str(error).strip().replace("\n", "\n    ")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
