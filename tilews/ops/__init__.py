"""Ready-made ops written in the tile language: ``tilews.ops.attention`` and
``tilews.ops.attention_varlen`` (differentiable), the decode ops ``tilews.ops.decode_attention``
and ``tilews.ops.mla_decode``, ``tilews.ops.matmul_bias_act``, ``tilews.ops.fp8_scaled_mm`` with
its tilings (``tune_fp8``, ``Tiles``), and ``tilews.ops.matmul`` with its schedules (``tune``,
``run``, ``matmul_schedule``, ``Schedule``)."""
from .attention import attention
from . import attention_backward  # noqa: F401  (the op tilews::attention_backward)
from .attention_varlen import attention_varlen
from .decode import decode_attention, mla_decode
from .epilogue import matmul_bias_act
from .fp8 import Tiles, fp8_scaled_mm, tune_fp8
from .matmul import matmul, matmul_schedule, run, tune
from .schedule import Schedule

__all__ = ["Schedule", "Tiles", "attention", "attention_varlen", "decode_attention",
           "fp8_scaled_mm", "matmul", "matmul_bias_act", "matmul_schedule", "mla_decode", "run",
           "tune", "tune_fp8"]
