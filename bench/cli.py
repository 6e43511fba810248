"""``tilews-bench`` / ``python -m tilews.bench``: tilews kernels against cuBLAS, cuDNN and plain
Triton, checked and timed in the same run.

    tilews-bench gemm [--shapes square,ragged,1024x1024x512] [--dtype bf16|fp16]
                      [--targets hopper,triton,interpret] [--quick] [--rounds N]
                      [--json PATH] [--csv PATH] [--plot PATH]
    tilews-bench fp8 | attention | all

Exit code: 0 when every row is correct, 1 when a row FAILed (wrong numbers) or raised, 2 for a bad
command line (output paths are checked before anything is built or timed). The table is printed
last.
"""
from __future__ import annotations

import argparse
import os
from typing import Optional, Sequence

from . import console, machine as machines
from .plot import write_plot
from .report import write_csv, write_json
from .results import Report
from .runner import plan, run_shape, steps
from .shapes import ShapeError, parse_shapes
from .workload import DTYPES, Case, Pending, Workload, registry

TARGETS = ("hopper", "triton", "interpret")
ROUNDS = {True: 5, False: 2}      # default --rounds on a GPU / without one (interpreter timings)
OUTPUTS = ("json", "csv", "plot")  # the options that name a file to write
COMMANDS = {"gemm": "bf16/fp16 GEMM against torch.matmul (cuBLAS) and a plain Triton tl.dot kernel",
            "fp8": "FP8 scaled GEMM against torch._scaled_mm (tilews has no FP8 kernels yet)",
            "attention": "attention forward against SDPA cuDNN/flash (tilews has no attention kernels yet)",
            "all": "every workload above (the ones tilews lacks are reported as not yet available)"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for option in OUTPUTS:   # before anything is built or timed: a run must not end unwritable
        path = getattr(args, option)
        why = unwritable(path)
        if why:
            parser.exit(2, f"{parser.prog} {args.command}: error: --{option} {path}: {why}\n")
    machine = machines.detect()
    workloads = registry()
    chosen = list(workloads) if args.command == "all" else [args.command]
    report = Report(args.command, args.dtype, args.targets or default_targets(machine), machine,
                    machines.versions(), args.rounds or ROUNDS[machine.gpu])
    runs = []
    for name in chosen:
        w = workloads[name]
        if isinstance(w, Pending):
            report.pending[name] = w.message
            continue
        try:
            shapes = parse_shapes(args.shapes or w.default_preset(machine, args.quick), w.presets, w.dims)
        except ShapeError as e:
            parser.exit(2, f"{parser.prog} {args.command}: error: {e}\n")
        runs.append((w, shapes))
    _run(report, runs, args.quick)
    notes = _write_files(report, args)
    console.print_notes(report, notes)
    console.print_table(report)
    return report.exit_code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tilews-bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--shapes", help="comma list of presets (gemm: " + ", ".join(_gemm_presets())
                         + ") and shapes like 1024x1024x512; default: 'bench' on a GPU ('gpu-quick' "
                         "with --quick), 'cpu' without one")
    options.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    options.add_argument("--targets", type=_targets,
                         help="comma list of tilews targets: hopper, triton, interpret (default: "
                              "hopper,triton on a GPU, interpret,triton without one)")
    options.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    options.add_argument("--rounds", type=_positive, metavar="N",
                         help="interleaved timing rounds per shape; each ratio is the median over "
                              f"them (default: {ROUNDS[True]} on a GPU, {ROUNDS[False]} without one)")
    options.add_argument("--json", metavar="PATH", help="write every number, the device and versions")
    options.add_argument("--csv", metavar="PATH", help="write one line per row")
    options.add_argument("--plot", metavar="PATH", help="write a PNG of the ratios per shape")
    for name, text in COMMANDS.items():
        sub.add_parser(name, parents=[options], help=text, description=text)
    return parser


def default_targets(machine: machines.Machine) -> list[str]:
    return ["hopper", "triton"] if machine.gpu else ["interpret", "triton"]


def unwritable(path: Optional[str]) -> Optional[str]:
    """Why ``path`` cannot be written as an output file, or None (also for no path)."""
    if not path:
        return None
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "is a directory, not a file"
    if not os.path.exists(directory):
        return f"cannot write it: the directory {directory} does not exist"
    if not os.path.isdir(directory):
        return f"cannot write it: {directory} is not a directory"
    if not os.access(directory, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "cannot write it: permission denied"
    return None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _targets(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TARGETS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: targets are a comma list of {', '.join(TARGETS)}")
    return list(dict.fromkeys(names))


def _gemm_presets() -> list[str]:
    from .gemm import PRESETS
    return list(PRESETS)


def _run(report: Report, runs: list[tuple[Workload, list]], quick: bool) -> None:
    planned = []
    for w, shapes in runs:
        impls, unavailable = plan(w, report.targets, report.machine)
        report.unavailable.update(unavailable)
        planned.append((w, shapes, impls))
    with console.progress(sum(len(s) * steps(i, report.rounds) for _, s, i in planned)) as advance:
        for w, shapes, impls in planned:
            for shape in shapes:
                case = Case(shape, DTYPES[report.dtype], report.machine)
                report.rows += run_shape(w, case, impls, quick, report.rounds, advance)


def _write_files(report: Report, args: argparse.Namespace) -> list[str]:
    notes = []
    if args.json:
        write_json(report, args.json)
        notes.append(f"wrote {args.json}")
    if args.csv:
        write_csv(report, args.csv)
        notes.append(f"wrote {args.csv}")
    if args.plot:
        skipped = write_plot(report, args.plot)
        notes.append(f"plot skipped: {skipped}" if skipped else f"wrote {args.plot}")
    return notes
