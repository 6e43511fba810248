"""The numeric contract (docs/design.md §3) for 16-bit floats on the Hopper (Gluon) target on an
sm_90 GPU: a GEMM epilogue of float16/bfloat16 ``%``, ``//``, ``/``, ``T.max`` with a constant and
``T.min`` (``half_epilogue``; its Gluon code is checked compile-only in
tests/test_gluon_compile.py) gives the interpreter's numbers exactly (outputs poisoned; the
contract leaves only a zero's sign open, so values are compared with ``torch.equal``)."""
from __future__ import annotations

import pytest
import torch

import tilews
import tilews.language as T

from ..helpers import poisoned
from ..test_gluon_compile import half_epilogue, half_epilogue_inputs

pytestmark = pytest.mark.gpu
DTYPES = {"float16": (T.float16, torch.float16), "bfloat16": (T.bfloat16, torch.bfloat16)}


@pytest.mark.parametrize("dtype", DTYPES)
def test_16bit_epilogue_matches_the_interpreter(dtype):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")
    t_dtype, torch_dtype = DTYPES[dtype]
    results = {}
    for target, device in (("hopper", "cuda"), ("interpret", "cpu")):
        kernel = tilews.jit(target=target)(half_epilogue)(t_dtype)
        if target == "hopper":
            assert kernel.report.target == "hopper", kernel.report.notes
        outs = [poisoned(128, 128, device=device)] + \
               [poisoned(128, 128, dtype=torch_dtype, device=device) for _ in range(3)]
        kernel(*(x.to(device) for x in half_epilogue_inputs(torch_dtype)), *outs)
        results[target] = [o.cpu() for o in outs]
    for name, gpu, ref in zip("RQDX", results["hopper"], results["interpret"]):
        assert not ref.isnan().any(), name
        mismatch = (gpu != ref).sum().item()
        assert mismatch == 0, f"{name}: {mismatch} of {ref.numel()} elements differ from the interpreter"
