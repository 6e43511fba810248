"""float to FP8 in MSL: the bytes a kernel stores into an FP8 tensor (``uchar`` in memory).

``FP8_ENCODE_MSL`` is header text defining ``uchar fp8_e4m3fn_from_float(float f)`` and
``uchar fp8_e5m2_from_float(float f)``, rounding to nearest even as torch's ``Tensor.to`` does:

* magnitudes from the top value's rounding boundary up, and infinities: e4m3fn has no infinity
  and saturates to its largest value, 448 (0x7E with the sign), as torch does; e5m2 gives
  infinity (0x7C; from 61440, which rounds up past 57344); NaN stays NaN (0x7F);
* normal results: the float's exponent rebased and its mantissa rounded in integer arithmetic
  (add half an FP8 ulp minus one, plus the kept mantissa's lowest bit, then shift: ties go to
  even);
* results below the smallest normal (e4m3fn 2^-6, e5m2 2^-14): adding a power of two whose float
  ulp is the FP8 subnormal step (2^14, ulp 2^-9, for e4m3fn; 2^7, ulp 2^-16, for e5m2) makes the
  float adder round the value onto the subnormal grid; the low bits of the sum are the code.

Only ``uint``/``uchar`` arithmetic, ``as_type`` and one float addition: the contract's subset
(notes/metal-contract.md). ``encoder(dtype)`` names the function for a tilews FP8 dtype.
"""
from __future__ import annotations

from tilews.lowering.dtypes import DType

from .fp8_decode import fp8_function

FP8_ENCODE_MSL = """\
inline uchar fp8_e4m3fn_from_float(float f) {
    uint bits = as_type<uint>(f);
    const uint sign = bits & 0x80000000u;
    bits ^= sign;
    uint code;
    if (bits >= (1087u << 20)) {                    // >= 480 or inf: the largest value, 448
        code = bits > (255u << 23) ? 0x7Fu : 0x7Eu; // (no infinities); NaN stays NaN
    } else if (bits < (121u << 23)) {               // below 2^-6: subnormal steps of 2^-9
        const float grid = as_type<float>(141u << 23);           // 2^14: its ulp is 2^-9
        code = as_type<uint>(as_type<float>(bits) + grid) - (141u << 23);
    } else {                                        // normal: rebase exponent, round mantissa
        const uint odd = (bits >> 20) & 1u;
        code = min((bits + ((7u - 127u) << 23) + 0x7FFFFu + odd) >> 20, 0x7Eu);  // 464..480: 448
    }
    return uchar(code | (sign >> 24));
}

inline uchar fp8_e5m2_from_float(float f) {
    uint bits = as_type<uint>(f);
    const uint sign = bits & 0x80000000u;
    bits ^= sign;
    uint code;
    if (bits >= (143u << 23)) {                     // >= 65536, inf or NaN
        code = bits > (255u << 23) ? 0x7Fu : 0x7Cu;
    } else if (bits < (113u << 23)) {               // below 2^-14: subnormal steps of 2^-16
        const float grid = as_type<float>(134u << 23);           // 2^7: its ulp is 2^-16
        code = as_type<uint>(as_type<float>(bits) + grid) - (134u << 23);
    } else {
        const uint odd = (bits >> 21) & 1u;
        code = (bits + ((15u - 127u) << 23) + 0xFFFFFu + odd) >> 21;
    }
    return uchar(code | (sign >> 24));
}
"""

_ENCODERS = {DType.F8E4M3: "fp8_e4m3fn_from_float", DType.F8E5M2: "fp8_e5m2_from_float"}


def encoder(dtype: DType) -> str:
    """The name of the ``FP8_ENCODE_MSL`` function that encodes a float as one byte of ``dtype``."""
    return fp8_function(_ENCODERS, dtype, "encoder")
