"""``tilews-bench`` / ``python -m tilews.bench``: tilews kernels against cuBLAS, cuDNN and plain
Triton (and, with the metal target, mlx and torch on MPS), checked and timed in the same run.

    tilews-bench gemm [--shapes square,ragged,1024x1024x512] [--dtype bf16|fp16]
                      [--targets hopper,triton,interpret,metal] [--quick] [--rounds N]
                      [--json PATH] [--csv PATH] [--plot PATH]
    tilews-bench gemm --preset llm     (--preset is another name for --shapes)
    tilews-bench gemm --preset decode --variants ops,ws   (only the tilews variants named so)
    tilews-bench epilogue [--shapes llm,4096x4096x4096:gelu] [the same options]
    tilews-bench attention [--shapes long,4x32x4096x128:causal,8x16x2048x64] [the same options]
    tilews-bench attention --backward | --varlen [the same options]
    tilews-bench decode [--shapes gqa,mla,8x32x8x8192x128:gqa] [the same options]
    tilews-bench fp8 [--shapes llm,4096x4096x4096:row-fast] [the same options]
    tilews-bench all [the same options]
    tilews-bench launch [--dtype bf16|fp16] [--calls N] [--rounds N] [--json PATH]

Shapes: MxNxK for gemm; MxNxK:relu|gelu|silu for epilogue (act(alpha * A @ B + bias)); BxHxSxD:
causal|noncausal for attention; MxNxK:tensor|tensor-fast|row|row-fast|block for fp8 (the scales'
granularity, and -fast for use_fast_accum). A shape without its ``:mode`` runs every mode. With
``all``, each ``--shapes`` entry goes to the workloads it is a preset or a shape of (``cpu``: all
of them). GEMM presets include ``llm`` (M 1 to 8192 at an LLM's projection shapes) and ``ragged``.
``launch`` times one cached call of a tiny GEMM (a tilews kernel, a raw Triton launch,
``torch.matmul``, ``tilews.ops.matmul``) in microseconds (``tilews.bench.launch``).

Exit code: 0 when every row is correct, 1 when a row FAILed (wrong numbers) or raised, 2 for a bad
command line (output paths are checked before anything is built or timed), 130 when Ctrl-C
(SIGINT) stopped the run: it then prints and writes the rows of the shapes that finished, the JSON
with ``"incomplete"`` saying so (null for a complete run) and the CSV with a first line
``# incomplete: ...``. A row whose kernel
cannot run that shape here (N/A: an SDPA backend, or torch's block-wise FP8 GEMM, that does not
take it) is no failure. The table is printed last.
"""
from __future__ import annotations

import argparse
import os
from typing import Optional, Sequence

from . import console, launch, machine as machines
from .plot import write_plot
from .report import write_csv, write_json
from .results import Report
from .runner import Impl, plan, run_shape, steps
from .shapes import Shape, ShapeError, assign_shapes, form, parse_shapes
from .workload import DTYPES, Case, Pending, Workload
from .workloads import registry

TARGETS = ("hopper", "triton", "interpret", "metal")
ROUNDS = {True: 5, False: 2}      # default --rounds on a GPU / without one (interpreter timings)
OUTPUTS = ("json", "csv", "plot")  # the options that name a file to write
COMMANDS = {"gemm": "bf16/fp16 GEMM against torch.matmul (cuBLAS) and a plain Triton tl.dot kernel",
            "epilogue": "GEMM with a fused epilogue, act(alpha * A @ B + bias) with act relu, gelu "
                        "(tanh) or silu, against torch.matmul followed by the same epilogue in PyTorch",
            "attention": "attention forward (BHSD, causal or not) against SDPA with its cuDNN and "
                         "flash (FlashAttention-2) backends",
            "decode": "decode attention over a KV cache (GQA, BxHxKVHxSxD:gqa, and DeepSeek MLA, :mla) "
                      "against SDPA's flash, efficient and cuDNN backends and torch flash decoding",
            "fp8": "FP8 (e4m3) scaled GEMM, per-tensor, per-row or block-wise scales, against "
                   "torch._scaled_mm (rowwise for block-wise rows) and torch's block-wise scaled_mm",
            "all": "every workload above",
            "launch": "microseconds per cached call of a tiny 64x64x64 GEMM: a tilews kernel, a raw "
                      "@triton.jit launch, torch.matmul and tilews.ops.matmul"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for option in OUTPUTS:   # before anything is built or timed: a run must not end unwritable
        path = getattr(args, option, None)   # launch writes JSON only
        why = unwritable(path)
        if why:
            parser.exit(2, f"{parser.prog} {args.command}: error: --{option} {path}: {why}\n")
    if args.command == "launch":
        return launch.main(args)
    machine = machines.detect()
    workloads = registry()
    chosen = list(workloads) if args.command == "all" else [workload_name(args)]
    report = Report(args.command, args.dtype, args.targets or default_targets(machine), machine,
                    machines.versions(), args.rounds or ROUNDS[machine.gpu])
    report.pending = {n: workloads[n].message for n in chosen if isinstance(workloads[n], Pending)}
    runnable = [workloads[n] for n in chosen if isinstance(workloads[n], Workload)]
    try:
        shapes = choose_shapes(args.shapes, runnable, machine, args.quick)
    except ShapeError as e:
        parser.exit(2, f"{parser.prog} {args.command}: error: {e}\n")
    for w in runnable:
        if not shapes[w.name]:
            report.unavailable[f"workload {w.name}"] = (f"skipped: no --shapes entry is one of its "
                                                        f"presets or a {form(w.dims, w.modes)} shape")
    unmatched = [n for n in args.variants or () if not any(n in v.name for w in runnable for v in w.variants)]
    if unmatched:
        names = sorted({v.name for w in runnable for v in w.variants})
        parser.exit(2, f"{parser.prog} {args.command}: error: --variants {', '.join(unmatched)}: no "
                       f"tilews variant's name contains it; the variants are: {'; '.join(names)}\n")
    _run(report, [(w, shapes[w.name]) for w in runnable if shapes[w.name]], args.quick, args.variants)
    notes = _write_files(report, args)
    console.print_notes(report, notes)
    console.print_table(report)
    return report.exit_code


def workload_name(args: argparse.Namespace) -> str:
    """The workload a command runs: ``attention --backward`` / ``--varlen`` are workloads of their
    own (``attention-backward``, ``attention-varlen``)."""
    for flag in ("backward", "varlen"):
        if getattr(args, flag, False):
            return f"{args.command}-{flag}"
    return args.command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tilews-bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--shapes", "--preset", dest="shapes", help=_shapes_help())
    options.add_argument("--dtype", choices=list(DTYPES), default="bf16",
                         help="the operands' and result's dtype (fp8: the result's; its operands are "
                              "float8_e4m3fn)")
    options.add_argument("--targets", "--target", dest="targets", type=_targets,
                         help="comma list of tilews targets: hopper, triton, interpret, metal "
                              "(default: hopper,triton on a GPU, interpret,triton without one)")
    options.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    options.add_argument("--variants", type=_names, metavar="NAMES",
                         help="comma list of words: run only the tilews variants whose name contains "
                              "one of them (e.g. 'ops' for tilews.ops.matmul's rows); the references "
                              "always run")
    options.add_argument("--rounds", type=_positive, metavar="N",
                         help="interleaved timing rounds per shape; each ratio is the median over "
                              f"them (default: {ROUNDS[True]} on a GPU, {ROUNDS[False]} without one)")
    options.add_argument("--json", metavar="PATH", help="write every number, the device and versions")
    options.add_argument("--csv", metavar="PATH", help="write one line per row")
    options.add_argument("--plot", metavar="PATH", help="write a PNG of the ratios per shape")
    for name, text in COMMANDS.items():
        if name == "launch":
            launch.add_options(sub.add_parser(name, help=text, description=text), _positive)
        elif name == "attention":
            command = sub.add_parser(name, parents=[options], help=text, description=text)
            which = command.add_mutually_exclusive_group()
            which.add_argument("--backward", action="store_true",
                               help="the backward (dq, dk, dv given dO) against SDPA's cuDNN and "
                                    "flash backward")
            which.add_argument("--varlen", action="store_true",
                               help="tilews.ops.attention_varlen on the same tokens packed (B "
                                    "sequences of S), against the dense kernels")
        else:
            sub.add_parser(name, parents=[options], help=text, description=text)
    return parser


def choose_shapes(text: Optional[str], workloads: Sequence[Workload], machine: machines.Machine,
                  quick: bool) -> dict[str, list]:
    """Each workload's shapes: its default preset without --shapes; with it, every entry must be
    the one workload's, and for ``all`` each entry goes to the workloads it fits."""
    if not text:
        return {w.name: parse_shapes(w.default_preset(machine, quick), w.presets, w.dims, w.modes)
                for w in workloads}
    if len(workloads) == 1:
        w = workloads[0]
        return {w.name: parse_shapes(text, w.presets, w.dims, w.modes)}
    return assign_shapes(text, {w.name: (w.presets, w.dims, w.modes) for w in workloads})


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


def _names(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give a comma list of words from variant names")
    return names


def _targets(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TARGETS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: targets are a comma list of {', '.join(TARGETS)}")
    return list(dict.fromkeys(names))


def _shapes_help() -> str:
    workloads = [w for w in registry().values() if isinstance(w, Workload)]
    return ("comma list of presets (" + "; ".join(f"{w.name}: {', '.join(w.presets)}" for w in workloads)
            + ") and shapes: " + ", ".join(f"{form(w.dims, w.modes)} ({w.name})" for w in workloads)
            + "; a shape without its ':mode' runs every mode. Default: 'bench' on a GPU ('gpu-quick' "
              "with --quick), 'cpu' without one. With 'all', each entry goes to the workloads it fits")


def _run(report: Report, runs: list[tuple[Workload, list]], quick: bool,
         variants: Optional[Sequence[str]] = None) -> None:
    planned = []
    for w, shapes in runs:
        impls, unavailable = plan(w, report.targets, report.machine, variants)
        report.unavailable.update(unavailable)
        planned.append((w, shapes, impls))
    total = sum(steps(_applying(w, i, s), report.rounds) for w, shapes, i in planned for s in shapes)
    done, shapes_total = 0, sum(len(shapes) for _, shapes, _ in planned)
    try:
        with console.progress(total) as advance:
            for w, shapes, impls in planned:
                for shape in shapes:
                    case = Case(shape, DTYPES[report.dtype], report.machine)
                    report.rows += run_shape(w, case, _applying(w, impls, shape), quick, report.rounds,
                                             advance)
                    done += 1
    except KeyboardInterrupt:
        report.incomplete = (f"interrupted (Ctrl-C) after {done} of {shapes_total} shapes; the rows "
                             f"are those of the shapes that finished")


def _applying(workload: Workload, impls: list[Impl], shape: Shape) -> list[Impl]:
    """The kernels run on ``shape``: every tilews variant, and the references that apply to it."""
    applies = {ref.name: ref.applies for ref in workload.references}
    return [i for i in impls if i.kind == "tilews" or applies[i.name](shape)]


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
