"""``--plot PATH``: a PNG of each tilews kernel's ratio to each reference, per shape: the median over
the rounds, with the per-round min..max as an error bar (matplotlib, Agg canvas: no display
needed). Without matplotlib the plot is skipped with a message."""
from __future__ import annotations

from typing import Optional

from .machine import optional_module
from .results import Report
from .shapes import shape_text


def write_plot(report: Report, path: str) -> Optional[str]:
    """Write the PNG; None when written, else why it was skipped."""
    if optional_module("matplotlib") is None:
        return "matplotlib is not installed"
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tilews = [r for r in report.rows if r.kind == "tilews"]
    shapes = list(dict.fromkeys(shape_text(r.shape) for r in tilews))
    series = list(dict.fromkeys((f"{r.impl} [{r.target}]", ref) for r in tilews for ref in r.ratios))
    fig = Figure(figsize=(max(6.0, 1.2 * len(shapes) + 3), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(series))
    for i, (kernel, ref) in enumerate(series):
        rows = {shape_text(r.shape): r for r in tilews
                if f"{r.impl} [{r.target}]" == kernel and ref in r.ratio_rounds}
        xs = [x + (i - (len(series) - 1) / 2) * width for x, s in enumerate(shapes) if s in rows]
        mid = [rows[s].ratios[ref] for s in shapes if s in rows]
        low, high = ([rows[s].ratio_range[ref][end] for s in shapes if s in rows] for end in (0, 1))
        # the bar is the median over the rounds; its error bar spans the per-round min..max
        yerr = [[m - lo for m, lo in zip(mid, low)], [hi - m for m, hi in zip(mid, high)]]
        ax.bar(xs, mid, width, yerr=yerr, capsize=2, label=f"{kernel} vs {ref}")
    if not series:
        ax.text(0.5, 0.5, "no timed tilews kernel", ha="center", va="center", transform=ax.transAxes)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(shapes)), shapes, rotation=20, ha="right")
    ax.set_ylabel("reference ms / tilews ms  (> 1: tilews faster)")
    title = f"tilews-bench {report.command}, {report.dtype}, {report.machine.name}"
    if report.interpreted and not report.machine.gpu:
        title += "\ninterpreter timings: not comparable"
    ax.set_title(title, fontsize=10)
    if series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    return None
