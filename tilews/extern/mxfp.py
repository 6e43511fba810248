"""The fp4 (e2m1) -> bfloat16 "twiddling" decoder of TileLang's ``dequantize_gemm/quantize/
mxfp.py``, in the tile language: ``decode_fp4_to_bf16_twiddling(src, dst, N=8)``.

Each of the N groups of 4 bytes at ``src`` (bytes b0..b3 of group i) gives 8 values at
``dst[8 i ...]``: the 16-bit words u = (b0 << 8) | b1 and v = (b2 << 8) | b3 each hold four fp4
fields, scattered: value j of a word has its sign, two exponent bits (high, low) and mantissa bit
at the word's bits

    j = 0: 15, (8, 7), 6      j = 1: 12, (5, 4), 3
    j = 2: 9, (2, 1), 0       j = 3: 14, (11, 10), 13

and ``dst[8 i + j]`` is value j of u, ``dst[8 i + 4 + j]`` value j of v. A field (s, e, m) is the
e2m1 number (-1)^s * m / 2 for e = 0, else (-1)^s * (1 + m / 2) * 2^(e - 1) (0, 0.5, ..., 6),
exactly as bfloat16. This is the arithmetic of TileLang's ``ref_program_twiddling``
(``torch_convert_bit_twiddling``): it reads each 16-bit word as a bfloat16 whose exponent is the
field's, biased by 126, and multiplies by 2^126.
"""
from __future__ import annotations

import tilews.language as T
from tilews.lowering import ir
from tilews.lowering.frontend.extern import register

from ._common import bits, count, indices, library_macro, pointer

NAME = "decode_fp4_to_bf16_twiddling"
_FIELDS = ((15, 8, 7, 6), (12, 5, 4, 3), (9, 2, 1, 0), (14, 11, 10, 13))   # s, e_hi, e_lo, m
_MOST = 64                      # groups per call: a bound on the unrolled code, not a rule


def decode_fp4_to_bf16_twiddling(src, dst, N=8):
    src = pointer(NAME, "the packed source", src)
    dst = pointer(NAME, "the output", dst, ir.DType.BF16)
    _decode(src, dst, count(NAME, N, _MOST))


@library_macro
def _decode(src, dst, n):
    for i in indices(n):
        for half in indices(2):
            for j in indices(4):
                dst[8 * i + 4 * half + j] = _value(src, 4 * i + 2 * half, _FIELDS[j])


def _value(src, byte: int, field: tuple):
    """The e2m1 field at word bits ``field`` of the word (src byte ``byte`` << 8) | next byte."""
    s, e_hi, e_lo, m = (_bit(src, byte, p) for p in field)
    e = e_hi * 2 + e_lo
    quarters = T.if_then_else(e == 0, m * 2, (m + 2) << e)    # |value| * 4, an integer
    magnitude = T.cast(quarters, ir.DType.F32) * 0.25
    return T.cast(T.if_then_else(s == 1, -magnitude, magnitude), ir.DType.BF16)


def _bit(src, byte: int, p: int):
    """Bit p of the big-endian 16-bit word at bytes ``byte``, ``byte + 1``."""
    return bits(src, 8 * byte + p - 8 if p >= 8 else 8 * (byte + 1) + p, 1)


register(NAME, decode_fp4_to_bf16_twiddling, (NAME,))
