"""Ready-made ops written in the tile language: ``tilews.ops.attention``,
``tilews.ops.matmul_bias_act``, ``tilews.ops.fp8_scaled_mm``."""
from .attention import attention
from .epilogue import matmul_bias_act
from .fp8 import fp8_scaled_mm

__all__ = ["attention", "fp8_scaled_mm", "matmul_bias_act"]
