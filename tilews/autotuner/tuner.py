"""Tuning one jit function for one call, and TileLang's builder, ``AutoTuner``.

``tune(variants, configs, args, kwargs, ...)`` is what ``@autotune`` and ``AutoTuner.run`` share:
each configuration is compiled as ``jit.compile(*args, **{**kwargs, **config})``, where ``jit`` is
the function with the configuration's ``"pass_configs"`` merged over its own
(``Variants``); with a disk-cache key whose record exists, only the stored winner is compiled (no
timing) and gets the stored ``.latency``/``.config``/``.ref_latency``; otherwise ``search`` runs
and its winner is recorded.

Builder: ``AutoTuner.from_kernel(kernel=factory, configs=[...]).set_compile_args(...)
.set_profile_args(...).run(...) -> AutotuneResult``, where ``factory`` takes the configuration's
values as keywords and returns a ``@T.prim_func``.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from tilews.jit import jit
from tilews.profiler import TensorSupplyType

from . import cache
from .capture import get_autotune_inputs
from .result import AutotuneResult
from .search import ProfileArgs, SearchPlan, search

PASS_CONFIGS = "pass_configs"   # the configuration key that is no parameter


def checked_configs(configs, param_names: Sequence[str], fn_name: str) -> list[dict]:
    """``configs`` as a list, each a dict whose keys are parameters of the function or
    ``"pass_configs"`` (a dict); else ``ValueError``/``TypeError`` naming the key."""
    configs = list(configs)
    if not configs:
        raise ValueError(f"autotune: no configurations to tune for '{fn_name}' (configs is empty)")
    for config in configs:
        if not isinstance(config, dict):
            raise TypeError(f"autotune: each configuration must be a dict of parameter values, got "
                            f"{config!r}")
        unknown = [k for k in config if k != PASS_CONFIGS and k not in param_names]
        if unknown:
            raise ValueError(f"autotune: configuration key '{unknown[0]}' is not a parameter of "
                             f"'{fn_name}' (its parameters: {', '.join(param_names)}; or "
                             f"'{PASS_CONFIGS}')")
        if not isinstance(config.get(PASS_CONFIGS) or {}, dict):
            raise TypeError(f"autotune: '{PASS_CONFIGS}' of a configuration must be a dict, got "
                            f"{config[PASS_CONFIGS]!r}")
    return configs


def parameters(config: dict) -> dict:
    """The configuration's parameter values (without ``"pass_configs"``)."""
    return {k: v for k, v in config.items() if k != PASS_CONFIGS}


class Variants:
    """The jit function and its copies with per-configuration pass configs merged in (one copy per
    distinct dict, so each copy's kernel cache serves later calls)."""

    def __init__(self, jit_fn):
        self.base = jit_fn
        self._copies: dict = {}
        self._lock = threading.Lock()

    def get(self, pass_configs: Optional[dict]):
        if not pass_configs:
            return self.base
        key = cache.call_key(pass_configs)
        with self._lock:
            if key not in self._copies:
                self._copies[key] = self.base.with_pass_configs(pass_configs)
            return self._copies[key]


def tune(variants: Variants, configs: list[dict], args: tuple, kwargs: dict, *,
         profile: ProfileArgs, plan: SearchPlan, inputs: Optional[list], key: Optional[str]):
    """The best kernel for this call (see the module docstring)."""
    def compile_one(config: dict):
        jit_fn = variants.get(config.get(PASS_CONFIGS))
        return jit_fn.compile(*args, **{**kwargs, **parameters(config)})

    record = cache.load(key, configs) if key is not None else None
    if record is not None:
        kernel = compile_one(configs[record.index])
        kernel.latency, kernel.ref_latency = record.latency, record.ref_latency
        kernel.config = dict(configs[record.index])
        return kernel
    index, kernel = search(configs, compile_one, profile, plan, inputs)
    if key is not None:
        cache.save(key, cache.Record(index, kernel.latency, kernel.ref_latency), configs[index])
    return kernel


def settings_key(compile_args: dict, profile: ProfileArgs, plan: SearchPlan, **more) -> dict:
    """Everything besides the function and the call that goes into the disk-cache key."""
    return {"compile": compile_args, "profile": dataclasses.asdict(profile),
            "plan": dataclasses.asdict(plan), **more}


@dataclass(frozen=True)
class CompileArgs:
    """``AutoTuner.set_compile_args``: how each configuration is compiled (``tilews.jit``'s
    arguments; TileLang's ``execution_backend``, ``target_host`` and ``verbose`` have no effect)."""
    out_idx: Any = None
    target: str = "auto"
    execution_backend: Optional[str] = None
    target_host: Any = None
    verbose: bool = False
    pass_configs: Optional[dict] = None

    def jit(self, fn: Callable):
        return jit(out_idx=self.out_idx, target=self.target or "auto",
                   pass_configs=self.pass_configs)(fn)


class AutoTuner:
    """TileLang's builder (see the module docstring)."""

    def __init__(self, fn: Callable, configs):
        self.fn, self.configs = fn, configs
        self.compile_args = CompileArgs()
        self.profile_args = ProfileArgs()
        self._inputs: Optional[list] = None

    @classmethod
    def from_kernel(cls, kernel: Callable, configs) -> "AutoTuner":
        return cls(kernel, configs)

    def set_compile_args(self, out_idx=None, target="auto", execution_backend=None,
                         target_host=None, verbose=False, pass_configs=None) -> "AutoTuner":
        self.compile_args = CompileArgs(out_idx, target, execution_backend, target_host, verbose,
                                        pass_configs)
        return self

    def set_profile_args(self, warmup: int = 25, rep: int = 100, timeout: float = 30,
                         supply_type=TensorSupplyType.Auto, ref_prog=None, supply_prog=None,
                         rtol: float = 1e-2, atol: float = 1e-2, max_mismatched_ratio: float = 0.01,
                         skip_check: bool = False, manual_check_prog=None,
                         cache_input_tensors: bool = False, backend: str = "event") -> "AutoTuner":
        """As TileLang: ``warmup``, ``rep`` and ``timeout`` here are accepted, but ``run``'s are
        the ones used. Inputs set by an enclosing ``with set_autotune_inputs(...)`` are taken
        now."""
        self.profile_args = ProfileArgs(
            supply_type=supply_type, ref_prog=ref_prog, supply_prog=supply_prog, rtol=rtol,
            atol=atol, max_mismatched_ratio=max_mismatched_ratio, skip_check=skip_check,
            manual_check_prog=manual_check_prog, cache_input_tensors=cache_input_tensors,
            backend=backend)
        self._inputs = get_autotune_inputs()
        return self

    def run(self, warmup: int = 25, rep: int = 100, timeout: float = 180,
            use_pipeline: bool = False, enable_grouped_compile: bool = False, group_compile_size: int = 2,
            benchmark_devices=None, benchmark_multi_gpu: bool = False, early_stop: bool = False,
            early_stop_factor: float = 2.0) -> AutotuneResult:
        """Tune and return the best configuration's ``AutotuneResult``. Configurations compile in
        ``TILEWS_COMPILE_WORKERS`` threads (``search``) and are timed on the current device, so
        TileLang's scheduling switches (``use_pipeline``, ``enable_grouped_compile``,
        ``group_compile_size``, ``benchmark_devices``, ``benchmark_multi_gpu``) are accepted and
        have no effect."""
        plan = SearchPlan(warmup, rep, timeout, early_stop, early_stop_factor)
        jit_fn = self.compile_args.jit(self.fn)
        configs = checked_configs(self.configs() if callable(self.configs) else self.configs,
                                  jit_fn.param_names, jit_fn.__name__)
        key = None
        if not self.profile_args.has_callbacks:
            key = cache.disk_key(self.fn, configs, {},
                                 settings_key(dataclasses.asdict(self.compile_args),
                                              self.profile_args, plan))
        kernel = tune(Variants(jit_fn), configs, (), {}, profile=self.profile_args, plan=plan,
                      inputs=self._inputs if self._inputs is not None else get_autotune_inputs(),
                      key=key)
        return AutotuneResult.of(kernel)
