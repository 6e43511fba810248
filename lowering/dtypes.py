"""Element types: one record per dtype, the only table of their names and spellings.

``DType`` is what the IR carries. Everything else a backend, the runtime or the interpreter needs
to know about a dtype is a field of its ``DTypeRecord`` (``dt.record``), so adding a dtype or a
backend means filling one row, never a new table:

* ``short``: the printer's name (the enum value); ``tilelang``: the ``T.*`` name;
* ``bits``, ``kind`` ("float", "int", "uint" or "bool");
* ``torch``: the attribute of ``torch`` (``dt.torch_dtype`` resolves it, importing torch);
* ``numpy``: the numpy dtype holding it bit-exactly (``ml_dtypes`` names for bf16 and fp8;
  ``dt.numpy_dtype`` resolves it);
* ``triton``: the name in ``triton.language`` and Gluon (``tl.<name>``, ``gl.<name>``);
* ``signature``: the type of a scalar parameter in a Triton kernel signature;
* ``msl``: the Metal Shading Language type ("" where Metal has none).
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class DTypeRecord:
    short: str
    tilelang: str
    bits: int
    kind: str
    torch: str
    numpy: str
    triton: str
    signature: str
    msl: str


_RECORDS = (
    #           short     tilelang        bits kind    torch            numpy             triton        sig     msl
    DTypeRecord("bf16", "bfloat16", 16, "float", "bfloat16", "bfloat16", "bfloat16", "bf16", "bfloat"),
    DTypeRecord("f16", "float16", 16, "float", "float16", "float16", "float16", "fp16", "half"),
    DTypeRecord("f32", "float32", 32, "float", "float32", "float32", "float32", "fp32", "float"),
    DTypeRecord("f64", "float64", 64, "float", "float64", "float64", "float64", "fp64", ""),
    DTypeRecord("i8", "int8", 8, "int", "int8", "int8", "int8", "i8", "char"),
    DTypeRecord("i16", "int16", 16, "int", "int16", "int16", "int16", "i16", "short"),
    DTypeRecord("i32", "int32", 32, "int", "int32", "int32", "int32", "i32", "int"),
    DTypeRecord("i64", "int64", 64, "int", "int64", "int64", "int64", "i64", "long"),
    DTypeRecord("u8", "uint8", 8, "uint", "uint8", "uint8", "uint8", "u8", "uchar"),
    DTypeRecord("u16", "uint16", 16, "uint", "uint16", "uint16", "uint16", "u16", "ushort"),
    DTypeRecord("u32", "uint32", 32, "uint", "uint32", "uint32", "uint32", "u32", "uint"),
    DTypeRecord("u64", "uint64", 64, "uint", "uint64", "uint64", "uint64", "u64", "ulong"),
    DTypeRecord("bool", "bool", 1, "bool", "bool", "bool", "int1", "i1", "bool"),
    DTypeRecord("f8e4m3", "float8_e4m3fn", 8, "float", "float8_e4m3fn", "float8_e4m3fn",
                "float8e4nv", "fp8e4nv", "uchar"),
    DTypeRecord("f8e5m2", "float8_e5m2", 8, "float", "float8_e5m2", "float8_e5m2", "float8e5",
                "fp8e5", "uchar"),
)


_BY_SHORT = {r.short: r for r in _RECORDS}


# TileLang's dtypes of fewer than 8 bits: names a program may hold (``T.int4``) but no tensor may
# have here (``DType(name)`` says so)
SUB_BYTE_NAMES = ("int1", "int2", "int4", "uint1", "uint2", "uint4", "float4_e2m1fn",
                  "float6_e2m3fn", "float6_e3m2fn")


class DType(str, enum.Enum):
    """Element types. ``dt.value`` is the printer's short name (``"f16"``). As in TileLang, a
    dtype is also the string of its TileLang name: ``T.float16 == "float16"``,
    ``str(T.float16) == "float16"``, ``getattr(torch, T.float16)``.

    ``DType(x)`` (``T.dtype(x)``) accepts a dtype, any spelling in ``DTYPE_ALIASES``, a torch or
    numpy dtype, or the Python types ``bool``/``int``/``float``. Calling a dtype builds a typed
    value in a kernel: ``T.float32(1.0)`` is a float32 constant, ``T.int32(x)`` casts ``x``.
    """

    def __new__(cls, short: str):
        member = str.__new__(cls, _BY_SHORT[short].tilelang)
        member._value_ = short
        return member

    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"
    F64 = "f64"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    BOOL = "bool"
    F8E4M3 = "f8e4m3"
    F8E5M2 = "f8e5m2"

    @classmethod
    def _missing_(cls, value):
        found = _coerce(value)
        if found is None and value in SUB_BYTE_NAMES:
            raise ValueError(f"dtype {value!r} has fewer than 8 bits, which tilews does not "
                             f"support: store packed values in a uint8 (or wider) tensor and "
                             f"decode them with shifts and masks")
        if found is None:
            raise ValueError(f"unknown dtype {value!r}; a dtype is T.float16 (...), one of the names "
                             f"{', '.join(sorted(DTYPE_ALIASES))}, a torch or numpy dtype, or "
                             f"bool/int/float")
        return found

    @property
    def record(self) -> DTypeRecord:
        return _BY_SHORT[self._value_]

    @property
    def bits(self) -> int:
        return self.record.bits

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    bytes = itemsize   # TileLang's name

    @property
    def is_float(self) -> bool:
        return self.record.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.record.kind in ("int", "uint")

    def wrap(self, v: int) -> int:
        """Integer ``v`` as this integer dtype holds it: its low ``bits`` bits, two's complement
        for a signed type (what integer arithmetic of this type gives on every target)."""
        v &= (1 << self.bits) - 1
        return v - (1 << self.bits) if self.record.kind == "int" and v >> (self.bits - 1) else v

    @property
    def is_fp8(self) -> bool:
        return self.is_float and self.bits == 8

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.record.torch)

    def as_torch(self):
        """The torch dtype (TileLang's spelling of ``torch_dtype``)."""
        return self.torch_dtype

    @property
    def numpy_dtype(self):
        import numpy as np
        if self.record.numpy in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            import ml_dtypes
            return np.dtype(getattr(ml_dtypes, self.record.numpy))
        return np.dtype(self.record.numpy)

    def rounded(self, value: float) -> float:
        """``value`` rounded to the nearest value of this float type (ties to even): the value an
        IR constant of this type holds (docs/design.md, numeric contract)."""
        import numpy as np
        return float(np.asarray(value, dtype=np.float64).astype(self.numpy_dtype))

    def __call__(self, value):
        """A value of this dtype in a kernel: a Python number becomes a typed constant, a runtime
        value is converted (``T.cast``): by the frontend's ``cast``, registered when the frontend
        is imported (``register_cast``), so this module imports no frontend."""
        if _kernel_cast is None:
            raise RuntimeError(f"T.{self.record.tilelang}(...) builds a kernel value: import "
                               f"tilews.language first")
        return _kernel_cast(value, self)

    def __repr__(self) -> str:
        return f"T.{self.record.tilelang}"

    def __str__(self) -> str:
        return self.record.tilelang

    __format__ = str.__format__
    __hash__ = str.__hash__   # equal to the TileLang name, so hashed like it


assert set(_BY_SHORT) == {d.value for d in DType}, "every DType has exactly one record"

# what calling a dtype does in a kernel (``DType.__call__``): the frontend's cast
_kernel_cast = None


def register_cast(cast) -> None:
    """Called once by the frontend (``frontend/values.py``) with its ``cast(value, dtype)``."""
    global _kernel_cast
    _kernel_cast = cast


class Pointer:
    """``T.ptr``: a device address. As an element type (``T.Tensor([n], T.ptr)``, a pointer table)
    it is ``int64``, as in TileLang: ``T.make_tensor`` turns an element into a typed view.
    ``T.ptr()`` is ``T.ptr`` (TileLang's call spelling)."""

    def __call__(self, *args, **kwargs) -> "Pointer":
        return self

    def __repr__(self) -> str:
        return "T.ptr"


POINTER = Pointer()


def _coerce(value) -> "DType | None":
    """The DType ``value`` spells (see ``DType``), None if it spells none."""
    if isinstance(value, Pointer):
        return DType.I64
    if isinstance(value, str):
        return DTYPE_ALIASES.get(value)
    python = {bool: DType.BOOL, int: DType.I32, float: DType.F32}
    if isinstance(value, type) and value in python:
        return python[value]
    module = getattr(value, "__module__", None) or type(value).__module__
    if module == "torch":
        return from_torch(value)
    if module.split(".")[0] in ("numpy", "ml_dtypes"):
        import numpy as np
        try:
            return DTYPE_ALIASES.get(np.dtype(value).name)
        except TypeError:
            return None
    return None


@functools.lru_cache(maxsize=None)
def from_torch(torch_dtype) -> DType | None:
    """The DType of a torch dtype (None for one tilews does not have); every op call asks."""
    name = str(torch_dtype).removeprefix("torch.")
    return next((d for d in DType if d.record.torch == name), None)


# TileLang / numpy / C spellings accepted wherever a dtype is expected.
DTYPE_ALIASES = {d.record.tilelang: d for d in DType}
DTYPE_ALIASES.update({d.value: d for d in DType})
DTYPE_ALIASES.update({"float": DType.F32, "half": DType.F16, "double": DType.F64,
                      "int": DType.I32, "float8_e4m3": DType.F8E4M3, "bf16": DType.BF16,
                      "fp16": DType.F16, "fp32": DType.F32, "fp8_e4m3": DType.F8E4M3,
                      "fp8_e5m2": DType.F8E5M2, "e4m3_float8": DType.F8E4M3,
                      "e5m2_float8": DType.F8E5M2, "short": DType.I16, "long": DType.I64,
                      "uint": DType.U32, "ulong": DType.U64,
                      "tfloat32": DType.F32, "custom[tfloat32]": DType.F32})   # T.tfloat32
