"""``--json PATH`` and ``--csv PATH``: every number of a run, with the device and the versions."""
from __future__ import annotations

import csv
import json

from .results import Report, Row
from .shapes import shape_text

CSV_FIELDS = ["workload", "shape", "dtype", "impl", "kind", "target", "interpreted", "status",
              "rel_err", "tolerance", "ms", "ms_runs", "spread_pct", "flops", "tflops", "input_sets",
              "build_s", "message"]


def write_json(report: Report, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report.as_json(), f, indent=2)
        f.write("\n")


def write_csv(report: Report, path: str) -> None:
    """One line per row (the device named on each); the versions are in the JSON. Per reference:
    the median ratio over the rounds (``vs X``) and the min and max of the per-round ratios. An
    interrupted run's file starts with a comment line, ``# incomplete: <why>``."""
    refs = list(dict.fromkeys(ref for r in report.rows for ref in r.ratio_rounds))
    with open(path, "w", newline="") as f:
        if report.incomplete:
            f.write(f"# incomplete: {report.incomplete}\n")
        writer = csv.writer(f)
        writer.writerow(["device"] + CSV_FIELDS
                        + [f"vs {ref}{end}" for ref in refs for end in ("", " min", " max")])
        for row in report.rows:
            ratios = [x for ref in refs for x in _ratios(row, ref)]
            writer.writerow([report.machine.name] + _fields(row) + ratios)


def _ratios(row: Row, ref: str) -> list:
    """The median ratio to ``ref`` and the min and max of its per-round ratios; blanks if none."""
    if ref not in row.ratio_rounds:
        return ["", "", ""]
    return [row.ratios[ref], *row.ratio_range[ref]]


def _fields(row: Row) -> list:
    data = row.as_json()
    data["shape"] = shape_text(row.shape)
    data["ms_runs"] = ";".join(f"{ms:.6g}" for ms in row.ms_runs)
    return ["" if data[k] is None else data[k] for k in CSV_FIELDS]
