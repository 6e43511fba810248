"""Ready-made ops written in the tile language: ``tilews.ops.attention``,
``tilews.ops.matmul_bias_act``."""
from .attention import attention
from .epilogue import matmul_bias_act

__all__ = ["attention", "matmul_bias_act"]
