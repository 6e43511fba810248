"""What a bench run found: one ``Row`` per (shape, kernel), and the ``Report`` around them that
the terminal table, the JSON, the CSV and the plot are all made from."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Optional

from .machine import Machine
from .shapes import Shape

SCHEMA = 2                      # 2: every kernel timed once per round; ratios are medians over rounds
FAILED = ("fail", "error")      # statuses that make the exit code non-zero
INTERRUPTED_EXIT = 130          # the shell's code for a process stopped by SIGINT (128 + 2)
RATIO_METHOD = ("per shape, every kernel is timed once per round, in an order rotating from round "
                "to round; a ratio is the median over the rounds of the reference's ms / the "
                "kernel's ms in the same round (ratio_range: their min and max)")


@dataclass
class Row:
    workload: str
    shape: Shape
    dtype: str                   # "bf16" | "fp16"
    impl: str                    # "tilews 128x128x64 s3", "torch.matmul", "triton tl.dot"
    kind: str                    # "tilews" | "reference"
    target: str                  # the tilews target, or what runs a reference ("cuBLAS")
    interpreted: bool            # an interpreter ran it: its timing is not comparable
    tolerance: float
    status: str = "ok"           # "ok" | "fail" (wrong numbers) | "error" (raised) | "unavailable"
                                 # (cannot run this shape or dtype here: not a failure)
    message: str = ""
    rel_err: Optional[float] = None
    build_s: Optional[float] = None       # building it (on a GPU, Triton compiles at the first call)
    input_sets: int = 1          # input sets the timing rotated among
    flops: Optional[float] = None         # the workload's FLOP count for this shape
    ms_runs: list[float] = field(default_factory=list)   # one median per round, in round order
    tflops: Optional[float] = None
    # reference -> its ms / this row's ms, one per round (both timed in that same round)
    ratio_rounds: dict[str, list[float]] = field(default_factory=dict)

    @property
    def ms(self) -> Optional[float]:
        return statistics.median(self.ms_runs) if self.ms_runs else None

    @property
    def spread_pct(self) -> Optional[float]:
        """How far apart the timing runs of this kernel were, in % of ``ms``."""
        if len(self.ms_runs) < 2:
            return None
        return (max(self.ms_runs) - min(self.ms_runs)) / self.ms * 100

    @property
    def ratios(self) -> dict[str, float]:
        """reference -> the median over the rounds of the same-round ratio: one slow timing of
        either kernel moves one round's ratio, not the one reported."""
        return {ref: statistics.median(r) for ref, r in self.ratio_rounds.items()}

    @property
    def ratio_range(self) -> dict[str, list[float]]:
        """reference -> [min, max] of the per-round ratios."""
        return {ref: [min(r), max(r)] for ref, r in self.ratio_rounds.items()}

    def as_json(self) -> dict:
        return {**asdict(self), "shape": list(self.shape), "ms": self.ms, "spread_pct": self.spread_pct,
                "ratios": self.ratios, "ratio_range": self.ratio_range}


@dataclass
class Report:
    command: str
    dtype: str
    targets: list[str]
    machine: Machine
    versions: dict[str, Optional[str]]
    rounds: int = 1                                             # interleaved timing rounds per shape
    rows: list[Row] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)   # "target hopper" -> why
    pending: dict[str, str] = field(default_factory=dict)       # workload -> message
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    incomplete: Optional[str] = None    # why the run stopped before its last shape (Ctrl-C)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if r.status in FAILED]

    @property
    def exit_code(self) -> int:
        return INTERRUPTED_EXIT if self.incomplete else 1 if self.failures else 0

    @property
    def interpreted(self) -> bool:
        return any(r.interpreted for r in self.rows)

    @property
    def timing_method(self) -> str:
        if self.machine.gpu:
            return ("median of triton.testing.do_bench (CUDA events, warm-up, L2 flushed); inputs "
                    "rotate among several sets when one set fits in L2")
        return "wall-clock median after a warm-up call (interpreter timings)"

    def as_json(self) -> dict:
        return {"schema": SCHEMA, "command": self.command, "created": self.created,
                "device": self.machine.as_json(), "versions": self.versions, "dtype": self.dtype,
                "targets": self.targets,
                "timing": {"method": self.timing_method, "interpreter_timings": self.interpreted,
                           "rounds": self.rounds, "ratio": RATIO_METHOD},
                "unavailable": self.unavailable, "pending": self.pending, "incomplete": self.incomplete,
                "rows": [r.as_json() for r in self.rows],
                "failures": len(self.failures), "exit_code": self.exit_code}
