"""TileLang's ``tilelang.utils`` as far as its examples reach it: ``tilews.utils.tensor``
(``torch_assert_close``, ``get_tensor_supply``, ``TensorSupplyType``)."""
from .tensor import TensorSupplyType, get_tensor_supply, torch_assert_close

__all__ = ["TensorSupplyType", "get_tensor_supply", "torch_assert_close"]
