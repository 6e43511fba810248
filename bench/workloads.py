"""The registry of benchmarked workloads: name -> its ``Workload`` (or ``Pending``).

Imports point one way: this module imports the workload modules (``gemm``, ``epilogue``,
``attention``, ``decode``, ``fp8``), which import ``workload`` (what a workload provides); nothing they
import imports this module.
"""
from __future__ import annotations

from typing import Union

from .workload import Pending, Workload


def registry() -> dict[str, Union[Workload, Pending]]:
    from . import attention, attention_backward, attention_varlen, decode, epilogue, fp8, gemm
    return {"gemm": gemm.WORKLOAD, "epilogue": epilogue.WORKLOAD, "attention": attention.WORKLOAD,
            "attention-backward": attention_backward.WORKLOAD,
            "attention-varlen": attention_varlen.WORKLOAD, "decode": decode.WORKLOAD,
            "fp8": fp8.WORKLOAD}
