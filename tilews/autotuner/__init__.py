"""The autotuner (TileLang's ``tilelang.autotuner``): ``@autotune(configs=...)`` above
``@tilews.jit``, or the ``AutoTuner`` builder, picks the fastest configuration of a kernel.

Modules: ``decorator`` (``autotune``), ``tuner`` (what both share, and ``AutoTuner``), ``search``
(compile, check and time the configurations), ``cache`` (tuning keys, results on disk),
``capture`` (``set_autotune_inputs``), ``result`` (``AutotuneResult``).
"""
from .capture import get_autotune_inputs, set_autotune_inputs
from .decorator import autotune
from .result import AutotuneResult
from .tuner import AutoTuner

__all__ = ["AutoTuner", "AutotuneResult", "autotune", "get_autotune_inputs", "set_autotune_inputs"]
