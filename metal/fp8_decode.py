"""FP8 to half in MSL: Metal has no fp8 types, so fp8 tensors travel as ``uchar`` and a kernel
decodes each byte to ``half`` in registers before the half simdgroup MMA.

``FP8_DECODE_MSL`` is header text (an ``MslKernel.header`` part) defining

* ``half fp8_e5m2_to_half(uchar b)``: e5m2 is the high byte of a half (same sign, exponent width
  and bias), so the decode is a shift and a bit cast, exact for every code (subnormals, infinities
  and NaN included);
* ``half fp8_e4m3fn_to_half(uchar b)``: e4m3fn (bias 7, 3 mantissa bits, no infinities) by bit
  arithmetic: normals rebias the exponent (+8); subnormals ``m * 2^-9`` are normal halfs and are
  normalized explicitly; ``0x7F``/``0xFF`` are NaN (a quiet half NaN with the code's sign); zero
  keeps its sign. No half arithmetic is used, so no fast-math flushing can change a value.

Both use only what the contract (notes/metal-contract.md) lets emitted MSL contain: ``uchar``,
``ushort``, integer arithmetic, ``?:`` and ``as_type``. ``decoder(dtype)`` names the helper for a
tilews fp8 dtype.
"""
from __future__ import annotations

from tilews.lowering.dtypes import DType

FP8_DECODE_MSL = """\
inline half fp8_e5m2_to_half(uchar b) {
    return as_type<half>(ushort(ushort(b) << 8));
}

inline half fp8_e4m3fn_to_half(uchar b) {
    const ushort sign = ushort(ushort(b & 0x80) << 8);
    const ushort mag = ushort(b & 0x7F);             // 4 exponent bits, 3 mantissa bits
    const ushort mant = ushort(mag & 0x7);
    // a subnormal is mant * 2^-9: its leading bit at position 2 - shift sets the half exponent
    const ushort shift = mant >= 4 ? 0 : mant >= 2 ? 1 : 2;
    const ushort subnormal = mant == 0 ? ushort(0)
        : ushort(((8 - shift) << 10) | (((mant << shift) & 0x3) << 8));
    const ushort bits = mag == 0x7F ? ushort(0x7E00)          // NaN: e4m3fn has no infinities
        : (mag >> 3) == 0 ? subnormal                          // zero or subnormal
        : ushort((mag << 7) + (8 << 10));                      // normal: exponent bias 7 -> 15
    return as_type<half>(ushort(sign | bits));
}
"""

_DECODERS = {DType.F8E4M3: "fp8_e4m3fn_to_half", DType.F8E5M2: "fp8_e5m2_to_half"}


def decoder(dtype: DType) -> str:
    """The name of the ``FP8_DECODE_MSL`` function that decodes one byte of ``dtype`` to half."""
    return fp8_function(_DECODERS, dtype, "decoder")


def fp8_function(names: dict, dtype, what: str) -> str:
    """``names[dtype]`` (an MSL helper per FP8 dtype), or a ValueError naming the FP8 dtypes."""
    try:
        return names[DType(dtype)]
    except (KeyError, ValueError):
        raise ValueError(f"no MSL fp8 {what} for dtype {dtype!r}; the fp8 dtypes are "
                         f"{', '.join(repr(d) for d in names)}") from None
