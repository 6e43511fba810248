"""Every example runs as a script on the CPU targets and checks itself against torch."""
from __future__ import annotations

import pytest

from examples import gemm, softmax, ws_gemm


@pytest.mark.parametrize("example", [gemm, softmax, ws_gemm], ids=lambda m: m.__name__)
def test_example_main(example, capsys):
    assert example.main([]) == 0
    out = capsys.readouterr().out
    assert "rel err" in out
