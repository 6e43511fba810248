"""``@autotune(configs=...)`` stacked above ``@tilews.jit``.

A call ``f(*args, **kwargs)`` of the tuned function:
1. Its key is the call's arguments (``cache.call_key``) without the ``do_not_specialize`` names;
   a key seen before reuses that call's best kernel.
2. ``configs`` (a list, or a callable given the call's arguments that returns one) is checked:
   every key must be a parameter of the function, or ``"pass_configs"``.
3. If the call already gives a value for any configuration key (positionally or by keyword), the
   kernel is compiled from the call as it is, without tuning (its ``.latency`` stays unset).
4. Otherwise each configuration, merged over the call's keywords, is compiled and timed
   (``tuner.tune``). Eager and direct functions are timed on copies of the call's own tensors
   unless ``set_autotune_inputs`` or ``supply_prog`` provide inputs. The result is kept on disk
   (``cache``) unless ``ref_prog``, ``supply_prog`` or ``manual_check_prog`` is set.
5. A factory function's call returns the best ``Kernel`` (with ``.latency``, ``.config``,
   ``.ref_latency``); an eager or direct one runs it on the call's tensors and returns the
   outputs. ``f.compile(*args, **kwargs)`` returns the kernel in every style.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

from tilews.jit import JitFunction
from tilews.profiler import TensorSupplyType

from . import cache
from .capture import get_autotune_inputs
from .search import ProfileArgs, SearchPlan
from .tuner import PASS_CONFIGS, Variants, checked_configs, parameters, settings_key, tune

logger = logging.getLogger("tilews.autotuner")


def autotune(func: Optional[Callable] = None, /, *, configs=None, warmup: int = 25, rep: int = 100,
             timeout: float = 100, supply_type=TensorSupplyType.Auto, ref_prog=None,
             supply_prog=None, rtol: float = 1e-2, atol: float = 1e-2,
             max_mismatched_ratio: float = 0.01, skip_check: bool = False, manual_check_prog=None,
             cache_input_tensors: bool = False, do_not_specialize: Optional[Sequence[str]] = None,
             early_stop: bool = False, early_stop_factor: float = 2.0):
    """Tune a ``@tilews.jit`` function over ``configs`` (see the module docstring). ``warmup`` and
    ``rep`` are iteration counts; ``timeout`` is seconds per configuration."""
    if func is not None or configs is None:
        raise ValueError("autotune needs its configurations: write @autotune(configs=[...]) "
                         "above @tilews.jit")
    profile = ProfileArgs(supply_type=supply_type, ref_prog=ref_prog, supply_prog=supply_prog,
                          rtol=rtol, atol=atol, max_mismatched_ratio=max_mismatched_ratio,
                          skip_check=skip_check, manual_check_prog=manual_check_prog,
                          cache_input_tensors=cache_input_tensors)
    plan = SearchPlan(warmup, rep, timeout, early_stop, early_stop_factor)

    def decorate(jit_fn) -> AutotunedFunction:
        if not isinstance(jit_fn, JitFunction):
            raise TypeError(f"@autotune must be stacked above @tilews.jit (it tunes a tilews.jit "
                            f"function), got {type(jit_fn).__qualname__}")
        return AutotunedFunction(jit_fn, configs, profile, plan, do_not_specialize or ())
    return decorate


class AutotunedFunction:
    """What ``@autotune(...)`` returns (see the module docstring)."""

    def __init__(self, jit_fn, configs, profile: ProfileArgs, plan: SearchPlan,
                 do_not_specialize: Sequence[str]):
        self.jit = jit_fn
        self.configs = configs if callable(configs) else checked_configs(
            configs, jit_fn.param_names, jit_fn.__name__)
        self.profile, self.plan = profile, plan
        self.do_not_specialize = frozenset(do_not_specialize)
        self._variants = Variants(jit_fn)
        self._best: dict = {}     # call key -> (kernel, its configuration or None if not tuned)
        self.__name__, self.__doc__, self.__wrapped__ = jit_fn.__name__, jit_fn.__doc__, jit_fn.fn

    def __call__(self, *args, **kwargs):
        kernel, config = self._best_for(args, kwargs)
        if self.jit.mode == "factory":
            return kernel
        config = config or {}
        run = self._variants.get(config.get(PASS_CONFIGS))
        return run(*args, **{**kwargs, **parameters(config)})

    def compile(self, *args, **kwargs):
        """The best kernel for this call, not run."""
        return self._best_for(args, kwargs)[0]

    def _best_for(self, args: tuple, kwargs: dict):
        bound = cache.bind(self.jit.param_names, args, kwargs)
        call = {name: value for name, value in bound.items() if name not in self.do_not_specialize}
        key = cache.call_key(call)
        if key not in self._best:
            configs = checked_configs(self.configs(*args, **kwargs), self.jit.param_names,
                                      self.__name__) if callable(self.configs) else self.configs
            given = sorted({k for c in configs for k in parameters(c)} & set(bound))
            if given:
                logger.info("autotune: %s given in the call to '%s'; compiling it without tuning",
                            ", ".join(given), self.__name__)
                self._best[key] = (self.jit.compile(*args, **kwargs), None)
            else:
                kernel = self._tune(args, kwargs, call, configs)
                self._best[key] = (kernel, kernel.config)
        return self._best[key]

    def _tune(self, args: tuple, kwargs: dict, call: dict, configs: list[dict]):
        inputs = get_autotune_inputs()
        if inputs is not None and self.profile.supply_prog is not None:
            logger.warning("autotune: supply_prog is ignored inside "
                           "`with set_autotune_inputs(...)`")
        if inputs is None and self.jit.mode != "factory" and self.profile.supply_prog is None:
            inputs = self.jit.kernel_inputs(*args, **{**kwargs, **parameters(configs[0])})
        key = None
        if not self.profile.has_callbacks:
            jit_args = {"target": self.jit.target, "out_idx": self.jit.out_idx,
                        "pass_configs": self.jit.pass_configs}
            key = cache.disk_key(self.jit.fn, configs, call,
                                 settings_key(jit_args, self.profile, self.plan,
                                              do_not_specialize=sorted(self.do_not_specialize)))
        return tune(self._variants, configs, args, kwargs, profile=self.profile, plan=self.plan,
                    inputs=inputs, key=key)
