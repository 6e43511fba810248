"""FP8 -> half decoding in MSL (``tilews.metal.fp8_decode``): every code of e4m3fn and e5m2, decoded
by a small kernel run on the CPU harness, equals torch's float8 -> float16 conversion bit for bit
(NaN: NaN of the same sign, payloads aside); and which helper decodes which tilews dtype."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tilews.lowering.dtypes import DType
from tilews.metal import harness
from tilews.metal.fp8_decode import FP8_DECODE_MSL, decoder
from tilews.metal.source import MslKernel, MslParam

THREADS = 64


def decode_kernel(dtype: DType) -> MslKernel:
    """out[i] = decode(codes[i]) over 256 codes: 4 threadgroups of 64 threads."""
    body = (f"    uint i = threadgroup_position_in_grid.x * {THREADS} + thread_index_in_threadgroup;\n"
            f"    out[i] = {decoder(dtype)}(codes[i]);\n")
    return MslKernel(name=f"decode_{dtype.value}", header=FP8_DECODE_MSL, body=body,
                     params=(MslParam("codes", "uchar", written=False),
                             MslParam("out", "half", written=True, read=False)),
                     attributes=("threadgroup_position_in_grid", "thread_index_in_threadgroup"),
                     threads=THREADS)


@pytest.mark.parametrize("dtype", [DType.F8E4M3, DType.F8E5M2])
def test_every_code_decodes_as_torch_does(dtype):
    try:
        kernel = harness.build(decode_kernel(dtype))
    except harness.HarnessUnavailable as e:
        pytest.skip(str(e))
    codes = np.arange(256, dtype=np.uint8)
    out = np.full(256, np.nan, dtype=np.float16)
    kernel.run([codes, out], grid=(256 // THREADS, 1, 1))

    want = torch.from_numpy(codes).view(dtype.torch_dtype).to(torch.float16).numpy()
    got_bits, want_bits = out.view(np.uint16), want.view(np.uint16)
    nan = np.isnan(want)
    assert nan.sum() == (2 if dtype == DType.F8E4M3 else 6)     # e4m3fn: 0x7F, 0xFF only
    assert np.array_equal(np.isnan(out), nan)
    wrong = np.flatnonzero((got_bits != want_bits) & ~nan)
    assert wrong.size == 0, [(hex(c), hex(got_bits[c]), hex(want_bits[c])) for c in wrong[:8]]
    assert np.array_equal(got_bits[nan] >> 15, want_bits[nan] >> 15)   # NaN keeps the code's sign


def test_decoder_names_the_helper_of_each_fp8_dtype():
    assert decoder(DType.F8E4M3) == "fp8_e4m3fn_to_half"
    assert decoder(DType.F8E5M2) == "fp8_e5m2_to_half"
    assert decoder("float8_e4m3fn") == "fp8_e4m3fn_to_half"       # any dtype spelling
    for name in ("fp8_e4m3fn_to_half", "fp8_e5m2_to_half"):
        assert f"inline half {name}(uchar b)" in FP8_DECODE_MSL
    with pytest.raises(ValueError, match=r"no MSL fp8 decoder for dtype T.float16; the fp8 dtypes "
                                         r"are T.float8_e4m3fn, T.float8_e5m2"):
        decoder(DType.F16)
