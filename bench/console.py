"""The terminal: a progress bar while the bench runs (rich, when it is installed and stderr is a
terminal; plain step lines otherwise), then the notes and, last of all, the results table (rich
on a terminal; a plain Markdown table otherwise, ready to paste into an issue)."""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Optional

from .machine import optional_module
from .results import Report, Row
from .runner import Advance
from .shapes import shape_text

INTERPRETER_NOTE = (
    "No CUDA GPU here: tilews runs in its reference interpreter (target 'interpret'), under "
    "Triton's CPU interpreter (target 'triton') or, off a Mac, on the CPU harness that runs Metal "
    "kernels as C++ (target 'metal'), and the torch references run on the CPU (the "
    "GPU-only ones, SDPA's cuDNN and flash backends, are unavailable). These are "
    "INTERPRETER TIMINGS: they show that every kernel runs and is correct, and are NOT comparable "
    "with GPU numbers, nor with each other.")
GPU_INTERPRETED_NOTE = "Rows on target 'interpret' are interpreter timings, not comparable with the others."
RATIO_NOTE = ("vs X = median over the {rounds} interleaved rounds of X's ms / this row's ms in the "
              "same round (> 1: faster than X), then (min..max) of those per-round ratios; ms = median "
              "over the rounds, ± = spread of this kernel's timings over the rounds (a difference below "
              "it is noise)")


@contextlib.contextmanager
def progress(total: int) -> Iterator[Advance]:
    rich_progress = optional_module("rich.progress") if sys.stderr.isatty() else None
    if rich_progress is None:
        done = [0]

        def advance(label: str) -> None:
            done[0] += 1
            print(f"[{done[0]}/{total}] {label}", file=sys.stderr, flush=True)
        yield advance
        return
    from rich.console import Console
    columns = (rich_progress.BarColumn(), rich_progress.MofNCompleteColumn(),
               rich_progress.TimeElapsedColumn(), rich_progress.TextColumn("{task.description}", markup=False))
    with rich_progress.Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=total)
        yield lambda label: bar.update(task, advance=1, description=label)


def print_notes(report: Report, notes: list[str]) -> None:
    """Everything that has to be said before the table: what was not run (here, or for a
    shape), failures, files."""
    lines = [f"{what}: unavailable ({why})" for what, why in report.unavailable.items()]
    lines += [f"{name}: not yet available. {msg}" for name, msg in report.pending.items()]
    lines += [f"{r.status.upper()} {shape_text(r.shape)} {r.impl} [{r.target}]: {r.message}"
              for r in report.failures]
    lines += [f"{shape_text(r.shape)} {r.impl} [{r.target}]: unavailable ({r.message})"
              for r in report.rows if r.status == "unavailable"]
    lines += notes
    if report.incomplete:
        lines.append(f"INCOMPLETE: {report.incomplete}")
    if report.interpreted:
        lines.append(GPU_INTERPRETED_NOTE if report.machine.gpu else INTERPRETER_NOTE)
    for line in lines:
        print(line)


def print_table(report: Report) -> None:
    if not report.rows:
        return
    headers, cells = _cells(report)
    title = (f"tilews-bench {report.command} · {report.dtype} · {report.machine.name} · "
             f"torch {report.versions['torch']} · triton {report.versions['triton']}")
    if report.interpreted and not report.machine.gpu:
        title += " · INTERPRETER TIMINGS (not comparable)"
    failed = len(report.failures)
    verdict = f"{failed} row(s) FAILED" if failed else "all rows correct"
    if report.incomplete:
        verdict = f"INCOMPLETE (interrupted), {verdict}"
    if report.exit_code:
        verdict += f": exit code {report.exit_code}"
    note = RATIO_NOTE.format(rounds=report.rounds)
    rich_table = optional_module("rich.table") if sys.stdout.isatty() else None
    if rich_table is None:
        _plain(title, headers, cells, f"{note}. {verdict}.")
        return
    from rich import box
    from rich.console import Console
    table = rich_table.Table(title=title, caption=f"{note}\n{verdict}", box=box.SIMPLE_HEAD)
    for h in headers:
        table.add_column(h, no_wrap=True)
    for row in cells:
        table.add_row(*row)
    out = Console()
    # Never squeeze columns away: a table wider than the terminal wraps instead.
    out.width = max(out.width, out.measure(table, options=out.options.update(max_width=1000)).maximum)
    out.print(table)


def _cells(report: Report) -> tuple[list[str], list[list[str]]]:
    refs = list(dict.fromkeys(r.impl for r in report.rows if r.kind == "reference"))
    headers = ["shape", "kernel", "target", "check", "ms", "±", "TFLOP/s"] + [f"vs {r}" for r in refs]
    return headers, [[shape_text(r.shape), r.impl, r.target, _check(r), _num(r.ms, ".4g"),
                      "" if r.spread_pct is None else f"{r.spread_pct:.1f}%", _num(r.tflops, ".4g")]
                     + [_ratio(r, ref) for ref in refs] for r in report.rows]


def _ratio(r: Row, ref: str) -> str:
    """``1.02x (0.99..1.04)``: the median over the rounds, then the per-round min and max."""
    if ref not in r.ratio_rounds:
        return "-"
    low, high = r.ratio_range[ref]
    return f"{r.ratios[ref]:.2f}x ({low:.2f}..{high:.2f})"


def _check(r: Row) -> str:
    if r.status == "error":
        return "ERROR"
    if r.status == "unavailable":
        return "N/A"
    err = "NaN" if r.rel_err is None else f"{r.rel_err:.1e}"
    return f"{'OK' if r.status == 'ok' else 'FAIL'} {err}"


def _num(x: Optional[float], fmt: str, suffix: str = "") -> str:
    return "-" if x is None else f"{x:{fmt}}{suffix}"


def _plain(title: str, headers: list[str], cells: list[list[str]], caption: str) -> None:
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    print(f"\n{title}\n")
    print(line(headers))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print(line(row))
    print(f"\n{caption}")
