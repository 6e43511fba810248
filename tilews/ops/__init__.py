"""Ready-made ops written in the tile language: ``tilews.ops.attention``,
``tilews.ops.matmul_bias_act``, ``tilews.ops.fp8_scaled_mm``, and ``tilews.ops.matmul`` with its
schedules (``tune``, ``run``, ``matmul_schedule``, ``Schedule``)."""
from .attention import attention
from .epilogue import matmul_bias_act
from .fp8 import fp8_scaled_mm
from .matmul import matmul, matmul_schedule, run, tune
from .schedule import Schedule

__all__ = ["Schedule", "attention", "fp8_scaled_mm", "matmul", "matmul_bias_act", "matmul_schedule",
           "run", "tune"]
