"""BitBLAS's lop3 decoders (TileLang's ``dequantize_gemm/quantize/lop3.py``): packed unsigned or
signed b-bit integers (b = 4, 2, 1) -> float16, in the tile language.

**Layout.** ``interleave_weight(qweight, b, "float16")`` reorders each 32-bit word of packed
weights so that a decoder finds element k of a call (0 <= k < N <= 8) at bit
``b * (k // 2) + 4 * b * (k % 2)`` of the little-endian bytes the source pointer points at: even
elements in the low bits, odd ones 4b bits higher. So ``decode(interleave(w))`` gives the
elements of ``w`` in their natural order (element j at bit b * j). A call decodes N values (8 by
default) from the first 4 (b = 4), 2 (b = 2) or 1 (b = 1) bytes.

**Values**, for the field q of element k, each step rounded to float16 as the CUDA code's f16x2
instructions round it:

* ``decode_i{b}u_to_f16``: q; ``decode_i{b}s_to_f16``: q - 8 (b = 4), q - 2 (b = 2), 2q - 1
  (b = 1).
* ``..._scale(src, dst, scale, N)``: that times ``scale[0]`` (as float16).
* ``..._scale_zeros_original(src, dst, scale, zeros, N)``: (v - zeros[0]) * scale[0].
* ``..._scale_zeros_rescale(...)``: v * scale[0] - |zeros[0]| in one rounding (a fused
  multiply-add: b = 4, 1; computed in float32, then rounded to float16), and
  (v * scale[0]) - zeros[0] in two (b = 2).
* ``..._scale_zeros_quantized(...)``: (q - zeros[0]) * scale[0], zeros[0] an integer in
  [0, 1024).
* ``_offset`` forms (b = 4): the first N / 2 values use ``scale[0]`` (``zeros[0]``), the rest
  ``scale[offset]`` (``zeros[offset]``); ``..._scale_zeros_quantized_offset(src, dst, scale,
  qzeros, scale_offset, zero_offset, group_offset, N)`` takes each half's zero from 4-bit field
  ``group_offset`` of ``qzeros[0]`` and ``qzeros[zero_offset]``.

Unsigned data only for the zeros forms, as in BitBLAS. Every name is registered with the
signature ``lop3.b32``: TileLang's source of each contains it.
"""
from __future__ import annotations

import tilews.language as T
from tilews.lowering import ir
from tilews.lowering.frontend import semantic
from tilews.lowering.frontend.extern import register

from ._common import bits, count, indices, library_macro, pointer

_F16 = ir.DType.F16
_F32 = ir.DType.F32
_I32 = ir.DType.I32
_SIGNATURE = ("lop3.b32",)
_MOST = 8                       # values per call: one 32-bit word of int4, 16 bits of int2, ...


@library_macro
def _decode(dst, n, value):
    for k in indices(n):
        dst[k] = value(k)


def _field(src, b: int, k: int):
    """Element k's b-bit field in the interleaved layout."""
    return bits(src, b * (k // 2) + 4 * b * (k % 2), b)


def _base(src, b: int, signed: bool, k: int):
    """Element k as float16, before scales and zeros."""
    q = T.cast(_field(src, b, k), _F16)
    if not signed:
        return q
    return q + q - 1 if b == 1 else q - (1 << (b - 1))


def _half(n: int, k: int, offset):
    """Index of the scale (zero) of element k in the _offset forms: 0, or ``offset`` for the
    second half of the values."""
    return 0 if k < n // 2 else offset


def _plain(name: str, b: int, signed: bool):
    def impl(src, dst, N=8):
        src, dst, n = _args(name, src, dst, N)
        _decode(dst, n, lambda k: _base(src, b, signed, k))
    return impl


def _scaled(name: str, b: int, signed: bool):
    def impl(src, dst, scale, N=8):
        _scale_only(name, b, signed, src, dst, scale, 0, N)
    return impl


def _scaled_offset(name: str, b: int, signed: bool):
    def impl(src, dst, scale, offset=0, N=8):
        _scale_only(name, b, signed, src, dst, scale, offset, N)
    return impl


def _scale_only(name: str, b: int, signed: bool, src, dst, scale, offset, N) -> None:
    src, dst, n = _args(name, src, dst, N)
    scale = pointer(name, "scale", scale)
    _decode(dst, n, lambda k: _base(src, b, signed, k) * T.cast(scale[_half(n, k, offset)], _F16))


def _zeros(name: str, b: int, mode: str):
    def impl(src, dst, scale, zeros, N=8):
        _with_zeros(name, b, mode, src, dst, scale, zeros, 0, N)
    return impl


def _zeros_offset(name: str, b: int, mode: str):
    def impl(src, dst, scale, zeros, offset=0, N=8):
        _with_zeros(name, b, mode, src, dst, scale, zeros, offset, N)
    return impl


def _with_zeros(name: str, b: int, mode: str, src, dst, scale, zeros, offset, N) -> None:
    src, dst, n = _args(name, src, dst, N)
    scale, zeros = pointer(name, "scale", scale), pointer(name, "zeros", zeros)

    def value(k):
        s = T.cast(scale[_half(n, k, offset)], _F16)
        z = zeros[_half(n, k, offset)]
        if mode == "quantized":
            return _quantized(name, src, b, k, z, s)
        v = _base(src, b, False, k)
        if mode == "original":
            return (v - T.cast(z, _F16)) * s
        if b == 2:                      # rescale, two roundings
            return v * s - T.cast(z, _F16)
        fused = T.cast(v, _F32) * T.cast(s, _F32) - T.abs(T.cast(T.cast(z, _F16), _F32))
        return T.cast(fused, _F16)      # rescale, one multiply-add
    _decode(dst, n, value)


def _quantized(name: str, src, b: int, k: int, zero, s):
    if not zero.dtype.is_int:
        raise semantic.err(f"{name}: the zeros are quantized zero points (integers), got "
                           f"{zero.dtype}")
    return T.cast(T.cast(_field(src, b, k), _I32) - T.cast(zero, _I32), _F16) * s


def _quantized_offset(name: str):
    def impl(src, dst, scale, qzeros, scale_offset=0, zero_offset=0, group_offset=0, N=8):
        src, dst, n = _args(name, src, dst, N)
        scale, qzeros = pointer(name, "scale", scale), pointer(name, "qzeros", qzeros)

        def value(k):
            s = T.cast(scale[_half(n, k, scale_offset)], _F16)
            zero = (qzeros[_half(n, k, zero_offset)] >> (4 * group_offset)) & 0xF
            return _quantized(name, src, 4, k, zero, s)
        _decode(dst, n, value)
    return impl


def _args(name: str, src, dst, n):
    return (pointer(name, "the packed source", src), pointer(name, "the output", dst, _F16),
            count(name, n, _MOST, 2))


def _table() -> dict:
    table = {}
    for b in (4, 2, 1):
        for sign in "us":
            stem = f"decode_i{b}{sign}_to_f16"
            table[stem] = _plain(stem, b, sign == "s")
            table[stem + "_scale"] = _scaled(stem + "_scale", b, sign == "s")
        for mode in ("original", "rescale", "quantized")[:3 if b > 1 else 2]:
            name = f"decode_i{b}u_to_f16_scale_zeros_{mode}"
            table[name] = _zeros(name, b, mode)
    for sign in "us":
        name = f"decode_i4{sign}_to_f16_scale_offset"
        table[name] = _scaled_offset(name, 4, sign == "s")
    for mode in ("original", "rescale"):
        name = f"decode_i4u_to_f16_scale_zeros_{mode}_offset"
        table[name] = _zeros_offset(name, 4, mode)
    name = "decode_i4u_to_f16_scale_zeros_quantized_offset"
    table[name] = _quantized_offset(name)
    return table


_TABLE = _table()
NAMES = tuple(_TABLE)           # every decoder this module registers
for _name, _impl in _TABLE.items():
    register(_name, _impl, _SIGNATURE)
