"""Timing as docs/measuring.md says: CUDA-event medians (``triton.testing.do_bench``, warm-up
included) on a GPU through ``tilews.testing.time_ms``, and rotation among several input sets
when one set's operands fit in L2, so no call finds its inputs already cached.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Optional, Sequence

import torch

from tilews.testing import time_ms

MAX_SETS = 32           # enough to cover 2x the L2 of an H100/H200 for any shape >= 1024^3 bf16
CPU_REPS = {True: 3, False: 10}   # --quick -> wall-clock repetitions (interpreter timings)


def sets_needed(working_bytes: int, l2_bytes: Optional[int]) -> int:
    """How many input sets to rotate among: one if a set does not fit in L2 (or there is no L2 to
    defeat), else enough sets to span twice the L2 (at least 2, at most ``MAX_SETS``)."""
    if not l2_bytes or working_bytes >= l2_bytes:
        return 1
    return min(MAX_SETS, max(2, math.ceil(2 * l2_bytes / working_bytes)))


def median_ms(fn: Callable[..., object], sets: Sequence[Sequence[torch.Tensor]],
              device: torch.device, quick: bool) -> float:
    """Median milliseconds of ``fn(*set)``, each call taking the next set in turn."""
    turn = itertools.cycle(sets)
    return time_ms(lambda: fn(*next(turn)), device, reps=CPU_REPS[quick])
