"""TileLang's ``tilelang.language.dtypes`` as far as its examples reach it: ``dtype`` (tilews's
``DType``: ``dtype("float16").bits``) and ``_TORCH_DTYPE_TO_STR``, each torch dtype tilews has
mapped to its TileLang name (``torch.float16`` -> ``"float16"``)."""
from tilews.lowering.ir import DType as dtype

_TORCH_DTYPE_TO_STR = {d.torch_dtype: d.record.tilelang for d in dtype}

__all__ = ["_TORCH_DTYPE_TO_STR", "dtype"]
