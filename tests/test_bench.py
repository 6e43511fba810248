"""The bench CLI (``tilews-bench`` / ``python -m tilews.bench``) on the CPU: argument parsing, the
JSON and CSV it writes, the exit code when a kernel is wrong, the plot, graceful degradation
without rich and matplotlib, the epilogue, attention and FP8 workloads (their shapes with a mode,
FLOPs, references that cannot run here or apply to some modes only), ``all``, a workload tilews
has no kernels for yet, the GEMM presets ``llm`` and ``ragged``, the ``tilews.ops.matmul`` rows
(heuristic and tuned) and ``launch`` (microseconds per call of a tiny kernel).

Most tests run in-process on the ``interpret`` target with the user's GEMM program as the only
tilews GEMM variant and ``torch.matmul`` as the only reference (fast, and triton stays
unimported). Three run ``python -m tilews.bench`` in a subprocess, one of them the whole default
``gemm --quick`` (both targets, both references) and one ``launch``.
"""
from __future__ import annotations

import contextlib
import csv
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tilews.bench import attention, cli, epilogue, fp8, gemm, launch, runner
from tilews.bench.shapes import ShapeError, parse_shapes, shape_text
from tilews.bench.timing import MAX_SETS, sets_needed
from tilews.bench.workload import Case, Pending, Reference, Unavailable, Variant

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--targets", "interpret", "--shapes", "64x64x64,100x72x40", "--quick"]
USER_PROGRAM = gemm.WORKLOAD.variants[0]          # examples.gemm.matmul, 128x128x64 tiles
HEURISTIC, TUNED = "tilews.ops.matmul (heuristic)", "tilews.ops.matmul (tuned)"
OPS_VARIANTS = {v.name: v for v in gemm.WORKLOAD.variants if v.name in (HEURISTIC, TUNED)}
EXPLICIT = [v for v in gemm.WORKLOAD.variants if v.name.startswith("tilews explicit T.ws")]


@pytest.fixture(autouse=True)
def torch_only(monkeypatch):
    """torch.matmul is the only reference (the Triton baseline would import triton) and the user's
    program the only tilews variant (the ``tilews.ops.matmul`` rows have their own tests)."""
    monkeypatch.setattr(gemm.WORKLOAD, "references", [gemm.TORCH])
    monkeypatch.setattr(gemm.WORKLOAD, "variants", [USER_PROGRAM])


def bench(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def planted(name: str, body) -> Variant:
    """A variant whose kernel ``body(a, b, c)`` runs on every target."""
    return Variant(name, lambda case, target: body)


# ---- --shapes ----------------------------------------------------------------------------------

def test_presets_and_explicit_shapes_in_order_without_duplicates():
    shapes = parse_shapes("square, 1024x1024x512,4096x4096x4096,ragged", gemm.PRESETS, "MNK")
    assert shapes == [(4096, 4096, 4096), (8192, 8192, 8192), (1024, 1024, 512), *gemm.RAGGED]
    assert parse_shapes("200X136X100", gemm.PRESETS, "MNK") == [(200, 136, 100)]
    assert parse_shapes("cpu", gemm.PRESETS, "MNK") == [(128, 128, 128), (200, 136, 100)]


@pytest.mark.parametrize("text, says", [
    ("1024x1024", "has 2 dimension(s); this workload's shapes are MxNxK"),
    ("squares", "unknown shape preset 'squares'; presets: square, "),
    ("0x64x64", "has a zero dimension"),
    ("64x-1x64", "is not MxNxK with positive integers"),
    ("64x64x64,", "has an empty entry"),
    ("1.5x2x3", "is not MxNxK with positive integers"),
])
def test_bad_shapes_are_clear_errors(text, says, capsys):
    with pytest.raises(ShapeError, match=None) as e:
        parse_shapes(text, gemm.PRESETS, "MNK")
    assert says in str(e.value)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["gemm", "--shapes", text])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "tilews-bench gemm: error:" in err and says in err


@pytest.mark.parametrize("argv, says", [
    (["gemm", "--targets", "cuda"], "targets are a comma list of hopper, triton, interpret"),
    (["gemm", "--dtype", "fp32"], "invalid choice: 'fp32'"),
    (["gemm", "--rounds", "0"], "--rounds: '0' is not a positive integer"),
    (["matmul"], "invalid choice: 'matmul'"),
    ([], "required: {gemm,epilogue,attention,decode,fp8,all,launch}"),
    (["launch", "--calls", "0"], "--calls: '0' is not a positive integer"),
    (["launch", "--shapes", "llm"], "unrecognized arguments: --shapes llm"),
    (["gemm", "--variants", ","], "--variants: ',': give a comma list of words from variant names"),
    (["gemm", "--variants", "128x128,bogus"], "--variants bogus: no tilews variant's name contains it; "
                                             "the variants are: tilews 128x128x64 s3\n"),
])
def test_bad_options_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_defaults_follow_the_machine():
    args = cli.build_parser().parse_args(["gemm"])
    assert (args.shapes, args.dtype, args.targets, args.quick) == (None, "bf16", None, False)
    assert args.rounds is None   # then 5 rounds on a GPU, 2 without one
    assert cli.ROUNDS == {True: 5, False: 2}
    cpu = cli.machines.detect()
    if not cpu.gpu:
        assert cli.default_targets(cpu) == ["interpret", "triton"]
        assert gemm.WORKLOAD.default_preset(cpu, False) == "cpu"


def test_rotation_only_when_a_set_fits_in_l2():
    l2 = 50 * 2**20
    assert sets_needed(3 * 8192 * 8192 * 2, l2) == 1            # 8192^3 bf16: no rotation
    assert sets_needed(3 * 1024 * 1024 * 2, l2) == 17           # 6 MiB sets span 2x L2
    assert sets_needed(3 * 128 * 128 * 2, l2) == MAX_SETS
    assert sets_needed(10 * 2**20, None) == 1                    # CPU: nothing to defeat


# ---- a run: table, JSON, CSV, plot ---------------------------------------------------------------

def test_cpu_run_prints_interpreter_note_then_the_table_last(capsys):
    code, out, _ = bench(capsys, "gemm", *SMALL, "--targets", "interpret,hopper")
    assert code == 0
    lines = out.rstrip().splitlines()
    assert "target hopper: unavailable (needs an H100/H200 (sm_90) to run" in out
    assert "INTERPRETER TIMINGS" in out and "NOT comparable" in out
    assert lines[-1].endswith("all rows correct.")
    table = [ln for ln in lines if ln.startswith("| ")]
    assert table[0].split("|")[1].strip() == "shape" and "vs torch.matmul" in table[0]
    assert [r.split("|")[2].strip() for r in table[1:]] == ["tilews 128x128x64 s3", "torch.matmul"] * 2
    assert all(r.split("|")[4].strip().startswith("OK ") for r in table[1:])
    assert lines.index(table[-1]) > max(i for i, ln in enumerate(lines) if "INTERPRETER" in ln)


def test_json_schema(tmp_path, capsys):
    path = tmp_path / "bench.json"
    code, out, _ = bench(capsys, "gemm", *SMALL, "--dtype", "fp16", "--json", str(path))
    assert code == 0 and f"wrote {path}" in out
    data = json.loads(path.read_text())
    assert data["schema"] == 2 and data["command"] == "gemm" and data["dtype"] == "fp16"
    assert set(data) >= {"created", "device", "versions", "targets", "timing", "unavailable",
                         "pending", "rows", "failures", "exit_code"}
    assert data["device"]["type"] in ("cpu", "cuda") and isinstance(data["device"]["name"], str)
    assert data["versions"]["torch"] == torch.__version__
    assert data["versions"]["tilews"] and data["versions"]["python"] and "triton" in data["versions"]
    assert data["timing"]["rounds"] == 2 and isinstance(data["timing"]["interpreter_timings"], bool)
    assert "median over the rounds" in data["timing"]["ratio"]
    assert (data["failures"], data["exit_code"], data["targets"]) == (0, 0, ["interpret"])
    assert len(data["rows"]) == 4
    types = {"workload": str, "shape": list, "dtype": str, "impl": str, "kind": str, "target": str,
             "interpreted": bool, "tolerance": float, "status": str, "message": str,
             "rel_err": float, "build_s": float, "input_sets": int, "ms_runs": list, "ms": float,
             "tflops": float, "ratios": dict, "ratio_rounds": dict, "ratio_range": dict}
    for row in data["rows"]:
        for key, t in types.items():
            assert isinstance(row[key], t), (key, row[key])
        assert row["status"] == "ok" and row["rel_err"] < 1e-2 and row["dtype"] == "fp16"
        assert len(row["ms_runs"]) == 2   # one per round, references too
        assert row["ms"] > 0 and row["tflops"] > 0
    tilews = [r for r in data["rows"] if r["kind"] == "tilews"]
    assert [r["shape"] for r in tilews] == [[64, 64, 64], [100, 72, 40]]
    assert all(set(r["ratios"]) == {"torch.matmul"} and r["spread_pct"] >= 0 for r in tilews)
    for r in tilews:
        per_round, (low, high) = r["ratio_rounds"]["torch.matmul"], r["ratio_range"]["torch.matmul"]
        assert len(per_round) == 2 and (low, high) == (min(per_round), max(per_round))
        assert low <= r["ratios"]["torch.matmul"] <= high


def test_csv_has_a_line_per_row(tmp_path, capsys):
    path = tmp_path / "bench.csv"
    assert bench(capsys, "gemm", *SMALL, "--csv", str(path))[0] == 0
    rows = list(csv.DictReader(path.open()))
    assert [(r["shape"], r["impl"], r["status"]) for r in rows] == [
        ("64x64x64", "tilews 128x128x64 s3", "ok"), ("64x64x64", "torch.matmul", "ok"),
        ("100x72x40", "tilews 128x128x64 s3", "ok"), ("100x72x40", "torch.matmul", "ok")]
    assert float(rows[0]["vs torch.matmul"]) > 0 and rows[1]["vs torch.matmul"] == ""
    low, mid, high = (float(rows[0][f"vs torch.matmul{end}"]) for end in (" min", "", " max"))
    assert 0 < low <= mid <= high and rows[1]["vs torch.matmul min"] == rows[1]["vs torch.matmul max"] == ""


def test_plot_is_a_png_written_by_matplotlib(tmp_path, capsys):
    path = tmp_path / "ratios.png"
    code, out, _ = bench(capsys, "gemm", *SMALL, "--plot", str(path))
    assert code == 0 and f"wrote {path}" in out
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"Software" in data and b"Matplotlib" in data[:200]   # the tEXt chunk matplotlib writes


def test_without_rich_and_matplotlib(tmp_path, capsys, monkeypatch):
    for name in ("rich", "rich.table", "rich.progress", "matplotlib"):
        monkeypatch.setitem(sys.modules, name, None)   # import fails as if not installed
    path = tmp_path / "ratios.png"
    code, out, err = bench(capsys, "gemm", *SMALL, "--plot", str(path))
    assert code == 0 and not path.exists()
    assert "plot skipped: matplotlib is not installed" in out
    assert "[1/12] 64x64x64 tilews 128x128x64 s3 [interpret]: checked" in err
    assert out.rstrip().splitlines()[-1].endswith("all rows correct.")


# ---- output paths are checked before anything runs -------------------------------------------------

@pytest.mark.parametrize("option", ["--json", "--csv", "--plot"])
@pytest.mark.parametrize("where, says", [
    ("file/out.x", "is not a directory"),           # a path under a regular file: fails even as root
    ("missing/out.x", "does not exist"),
    (".", "is a directory, not a file"),
])
def test_unwritable_output_path_exits_2_before_anything_is_built_or_timed(option, where, says, tmp_path,
                                                                         capsys, monkeypatch):
    """A bad --json/--csv/--plot path used to surface only after every kernel had been compiled
    and timed, losing the whole run."""
    (tmp_path / "file").write_text("a regular file")

    def must_not_run(*args, **kwargs):
        raise AssertionError("built or timed before the output paths were checked")
    for module, name in ((cli, "plan"), (cli, "run_shape"), (runner, "median_ms")):
        monkeypatch.setattr(module, name, must_not_run)
    path = tmp_path / where
    with pytest.raises(SystemExit) as e:
        cli.main(["gemm", *SMALL, option, str(path)])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert f"tilews-bench gemm: error: {option} {path}: " in err and says in err
    assert out == "" and not (tmp_path / "missing").exists()


def test_a_directory_without_write_permission_is_unwritable(tmp_path, monkeypatch):
    monkeypatch.setattr(cli.os, "access", lambda path, mode: False)   # as root, chmod would not stop us
    assert cli.unwritable(str(tmp_path / "bench.json")) == "cannot write it: permission denied"
    monkeypatch.undo()
    assert cli.unwritable(str(tmp_path / "bench.json")) is None and cli.unwritable(None) is None


# ---- ratios: the median over interleaved rounds ------------------------------------------------------

def test_one_slow_reference_timing_does_not_move_the_ratio(tmp_path, capsys, monkeypatch):
    """The defect: a ratio from one timing of each kernel. One slow cuBLAS timing (583 TFLOP/s
    instead of its usual ~675) made a row say 1.23x. Each round now times every kernel once, in a
    rotating order, and the ratio is the median of the same-round ratios: the slow round shows in
    the min..max only. With a single round, the same timings give the 1.23x back."""
    def candidate(a, b, c):
        c.copy_(a @ b)

    def cublas(a, b, c):
        c.copy_(a @ b)
    times = {candidate: [1.00, 1.01, 0.99, 1.00, 1.00],
             cublas: [1.23, 1.00, 1.01, 1.00, 0.99]}      # slow in round 1 only
    calls = []

    def fake_median_ms(fn, sets, device, quick):   # deterministic: the next time of that kernel
        calls.append(fn)
        return times[fn][calls.count(fn) - 1]
    monkeypatch.setattr(runner, "median_ms", fake_median_ms)
    monkeypatch.setattr(gemm.WORKLOAD, "variants", [planted("candidate", candidate)])
    monkeypatch.setattr(gemm.WORKLOAD, "references",
                        [Reference("cublas", lambda case: cublas, runs_on=lambda m: "fake cuBLAS")])
    path = tmp_path / "bench.json"

    def ratio_row(rounds: int) -> tuple[dict, str]:
        calls.clear()
        code, out, _ = bench(capsys, "gemm", "--targets", "interpret", "--shapes", "64x64x64",
                             "--rounds", str(rounds), "--json", str(path))
        assert code == 0
        data = json.loads(path.read_text())
        assert data["timing"]["rounds"] == rounds
        return next(r for r in data["rows"] if r["impl"] == "candidate"), out

    row, out = ratio_row(5)
    assert calls == [candidate, cublas, cublas, candidate] * 2 + [candidate, cublas]   # interleaved
    assert row["ms_runs"] == times[candidate]
    per_round = [r / c for r, c in zip(times[cublas], times[candidate])]
    assert row["ratio_rounds"]["cublas"] == pytest.approx(per_round)
    assert row["ratios"]["cublas"] == pytest.approx(1.0)
    assert row["ratio_range"]["cublas"] == pytest.approx([0.99, 1.23])
    assert "| 1.00x (0.99..1.23) |" in out and "median over the 5 interleaved rounds" in out

    single, out = ratio_row(1)
    assert single["ratios"]["cublas"] == pytest.approx(1.23)   # what one timing each would report
    assert "| 1.23x (1.23..1.23) |" in out


# ---- a wrong kernel fails the run ----------------------------------------------------------------

@pytest.mark.parametrize("name, body, status, says", [
    ("wrong", lambda a, b, c: c.copy_(a @ b * 1.5), "fail", "exceeds the tolerance 1e-02"),
    ("unwritten", lambda a, b, c: c[: c.shape[0] // 2].copy_((a @ b)[: c.shape[0] // 2]), "fail",
     "NaN element(s): unwritten or poisoned"),
    ("raises", lambda a, b, c: 1 / 0, "error", "ZeroDivisionError"),
])
def test_planted_incorrect_kernel_makes_the_exit_code_nonzero(name, body, status, says, tmp_path,
                                                               capsys, monkeypatch):
    monkeypatch.setattr(gemm.WORKLOAD, "variants", gemm.WORKLOAD.variants + [planted(name, body)])
    path = tmp_path / "bench.json"
    code, out, _ = bench(capsys, "gemm", *SMALL, "--json", str(path))
    assert code == 1
    data = json.loads(path.read_text())
    bad = [r for r in data["rows"] if r["impl"] == name]
    assert len(bad) == 2 and all(r["status"] == status and says in r["message"] for r in bad)
    assert data["failures"] == 2 and data["exit_code"] == 1
    assert all(r["status"] == "ok" for r in data["rows"] if r["impl"] != name)
    lines = out.rstrip().splitlines()
    assert f"{status.upper()} 64x64x64 {name} [interpret]: " in out
    assert lines[-1].endswith("2 row(s) FAILED: exit code 1.")
    marker = "ERROR" if status == "error" else "FAIL "
    assert sum(ln.startswith("| ") and f"| {marker}" in ln for ln in lines) == 2


@pytest.mark.parametrize("where", ["check", "timing"])
def test_ctrl_c_prints_and_writes_the_finished_rows_marked_incomplete(where, tmp_path, capsys,
                                                                      monkeypatch):
    """Ctrl-C (a KeyboardInterrupt from a kernel) on the second shape: the first shape's rows are
    printed and written, the JSON and the CSV say the run is incomplete, and the exit code is 130."""
    second_shape_calls = []

    def body(a, b, c):
        if c.shape[0] == 100:
            second_shape_calls.append(c)   # the first is the check, then the timing runs
            if where == "check" or len(second_shape_calls) > 1:
                raise KeyboardInterrupt
        c.copy_(a @ b)

    monkeypatch.setattr(gemm.WORKLOAD, "variants", gemm.WORKLOAD.variants + [planted("ctrl-c", body)])
    json_path, csv_path = tmp_path / "bench.json", tmp_path / "bench.csv"
    code, out, _ = bench(capsys, "gemm", *SMALL, "--json", str(json_path), "--csv", str(csv_path))
    assert code == 130 and len(second_shape_calls) == {"check": 1, "timing": 2}[where]
    data = json.loads(json_path.read_text())
    assert data["incomplete"] == ("interrupted (Ctrl-C) after 1 of 2 shapes; the rows are those of "
                                  "the shapes that finished") and data["exit_code"] == 130
    assert [(r["shape"], r["impl"], r["status"]) for r in data["rows"]] == [
        ([64, 64, 64], USER_PROGRAM.name, "ok"), ([64, 64, 64], "ctrl-c", "ok"),
        ([64, 64, 64], "torch.matmul", "ok")]
    first, *lines = csv_path.read_text().splitlines()
    assert first == f"# incomplete: {data['incomplete']}"
    assert [r["impl"] for r in csv.DictReader(lines)] == [USER_PROGRAM.name, "ctrl-c", "torch.matmul"]
    assert f"INCOMPLETE: {data['incomplete']}" in out
    assert sum(ln.startswith("| 64x64x64 ") for ln in out.splitlines()) == 3 and "| 100x72x40 " not in out
    assert out.rstrip().endswith("INCOMPLETE (interrupted), all rows correct: exit code 130.")


# ---- attention, the GEMM epilogue and FP8: shapes with a mode -------------------------------------------

ATTENTION = ["attention", "--targets", "interpret", "--rounds", "1", "--quick"]
FP8 = ["fp8", "--targets", "interpret", "--rounds", "1", "--quick"]
EPILOGUE = ["epilogue", "--targets", "interpret", "--rounds", "1", "--quick", "--shapes", "64x64x64"]


def test_attention_shapes_name_their_mode_or_get_both():
    shapes = parse_shapes("4x32x4096x128:causal, 8x16x2048x64,cpu,4X32X4096X128:Causal",
                          attention.PRESETS, "BHSD", attention.MODES)
    assert shapes == [(4, 32, 4096, 128, "causal"), (8, 16, 2048, 64, "causal"),
                      (8, 16, 2048, 64, "noncausal"), (1, 2, 100, 64, "causal"), (1, 2, 100, 64, "noncausal")]
    assert [shape_text(s) for s in shapes[:2]] == ["4x32x4096x128:causal", "8x16x2048x64:causal"]
    assert parse_shapes("64x64x64:gelu", epilogue.PRESETS, "MNK", epilogue.MODES) == [(64, 64, 64, "gelu")]


def test_default_presets_cover_the_gpu_sizes_and_a_tiny_cpu_one():
    bench_ = attention.PRESETS["bench"]
    assert len(bench_) == 8 and {s[4] for s in bench_} == {"causal", "noncausal"}
    assert {s[3] for s in bench_} == {64, 128}
    assert (min(s[0] for s in bench_), max(s[0] for s in bench_)) == (2, 16)
    assert {s[1] for s in bench_} == {16, 32} and {s[2] for s in bench_} == {1024, 2048, 4096, 16384}
    assert attention.PRESETS["cpu"] == ((1, 2, 100, 64, "causal"), (1, 2, 100, 64, "noncausal"))
    assert {s[:3] for s in epilogue.PRESETS["bench"]} == {(4096, 4096, 4096), (8192, 8192, 1024),
                                                          (4096, 14336, 4096)}
    assert len(epilogue.PRESETS["bench"]) == 9   # one row per activation
    cpu = cli.machines.detect()
    if not cpu.gpu:
        assert attention.WORKLOAD.default_preset(cpu, False) == "cpu"
        assert epilogue.WORKLOAD.default_preset(cpu, True) == "cpu"


@pytest.mark.parametrize("command, text, says", [
    ("attention", "4x32x4096", "has 3 dimension(s); this workload's shapes are BxHxSxD[:causal|noncausal]"),
    ("attention", "4x32x4096x128:sideways",
     "has the unknown mode 'sideways'; the modes are causal, noncausal"),
    ("attention", "4x32x4096x128:", "has the unknown mode ''"),
    ("attention", "4x0x4096x128:causal", "has a zero dimension"),
    ("attention", "square", "unknown shape preset 'square'; presets: bench, long, "),
    ("epilogue", "64x64x64:tanh", "the modes are relu, gelu, silu"),
    ("gemm", "64x64x64:relu", "is not MxNxK with positive integers"),
    ("fp8", "4096x4096x4096:blockwise",
     "has the unknown mode 'blockwise'; the modes are tensor, tensor-fast, row, row-fast, block"),
    ("fp8", "4096x4096x4096:block-fast", "has the unknown mode 'block-fast'"),
    ("fp8", "4096x4096:row",
     "has 2 dimension(s); this workload's shapes are MxNxK[:tensor|tensor-fast|row|row-fast|block]"),
])
def test_bad_shapes_with_modes_exit_2(command, text, says, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--shapes", text])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"tilews-bench {command}: error:" in err and says in err


def test_attention_runs_on_the_cpu_with_flash_attention_flops(tmp_path, capsys):
    path, table = tmp_path / "att.json", tmp_path / "att.csv"
    code, out, _ = bench(capsys, *ATTENTION, "--json", str(path), "--csv", str(table))
    assert code == 0
    assert "reference SDPA cuDNN: unavailable (SDPA's CUDNN_ATTENTION backend runs on a CUDA GPU only)" in out
    assert "reference SDPA flash: unavailable (" in out
    rows = [ln.split("|")[1:5] for ln in out.splitlines() if ln.startswith("| 1x2x100x64")]
    explicit = "tilews explicit T.ws (examples/attention.py)"     # the user's T.ws program
    assert [[c.strip() for c in r[:3]] for r in rows] == [
        ["1x2x100x64:causal", "tilews.ops.attention", "interpret"],
        ["1x2x100x64:causal", explicit, "interpret"],
        ["1x2x100x64:noncausal", "tilews.ops.attention", "interpret"],
        ["1x2x100x64:noncausal", explicit, "interpret"]]
    assert all(r[3].strip().startswith("OK ") for r in rows)
    data = json.loads(path.read_text())
    assert [(r["shape"], r["status"]) for r in data["rows"]] == [
        ([1, 2, 100, 64, "causal"], "ok")] * 2 + [([1, 2, 100, 64, "noncausal"], "ok")] * 2
    causal, _, full, _ = data["rows"]
    assert full["flops"] == 4 * 1 * 2 * 100 * 100 * 64 == 2 * causal["flops"]     # halved when causal
    assert causal["tflops"] == pytest.approx(causal["flops"] / causal["ms"] / 1e9)
    assert all(r["rel_err"] < 1e-2 for r in data["rows"])
    assert [r["shape"] for r in csv.DictReader(table.open())] == ["1x2x100x64:causal"] * 2 + ["1x2x100x64:noncausal"] * 2
    assert attention.WORKLOAD.flops((4, 32, 4096, 128, "causal")) == 2 * 4 * 32 * 4096 ** 2 * 128


def test_epilogue_runs_one_row_per_activation(tmp_path, capsys):
    path = tmp_path / "epi.json"
    code, out, _ = bench(capsys, *EPILOGUE, "--json", str(path))
    assert code == 0 and "vs torch.matmul + epilogue" in out
    data = json.loads(path.read_text())
    assert [(r["shape"][3], r["impl"], r["status"]) for r in data["rows"]] == [
        (act, impl, "ok") for act in ("relu", "gelu", "silu")
        for impl in ("tilews.ops.matmul_bias_act", "torch.matmul + epilogue")]
    assert all(r["flops"] == 2 * 64 ** 3 and r["rel_err"] < 1e-2 for r in data["rows"])
    assert out.rstrip().splitlines()[-1].endswith("all rows correct.")


def no_causal_mask(q, k, v, out):
    out.copy_(F.scaled_dot_product_attention(q.float(), k.float(), v.float()))


def no_bias(a, b, bias, out):
    out.copy_(F.silu(a.float() @ b.float() / a.shape[1] ** 0.5))


def first_k_block_scales_only(a, b, scale_a, scale_b, *rest):
    """Right for per-tensor and per-row scales; block scales of the first 128 of K for all of K."""
    rest[-1].copy_(fp8.exact(a, b, scale_a[:, :1], scale_b[:1]))


@pytest.mark.parametrize("argv, workload, body, wrong", [
    (ATTENTION, attention, no_causal_mask, ["1x2x100x64:causal"]),
    (EPILOGUE[:-2] + ["--shapes", "64x64x64:silu"], epilogue, no_bias, ["64x64x64:silu"]),
    (FP8 + ["--shapes", "100x72x200:row,64x136x300:block"], fp8, first_k_block_scales_only,
     ["64x136x300:block"]),
])
def test_a_planted_wrong_variant_fails_the_run(argv, workload, body, wrong, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(workload.WORKLOAD, "variants", workload.WORKLOAD.variants + [planted("wrong", body)])
    path = tmp_path / "bench.json"
    code, out, _ = bench(capsys, *argv, "--json", str(path))
    assert code == 1
    data = json.loads(path.read_text())
    bad = [r for r in data["rows"] if r["status"] == "fail"]
    assert [shape_text(tuple(r["shape"])) for r in bad] == wrong and data["exit_code"] == 1
    assert all(r["impl"] == "wrong" for r in bad)
    assert {r["status"] for r in data["rows"]} <= {"ok", "fail", "unavailable"}   # fp8's blockwise: N/A here
    assert f"FAIL {wrong[0]} wrong [interpret]: rel err" in out
    assert out.rstrip().splitlines()[-1].endswith("1 row(s) FAILED: exit code 1.")


def test_a_reference_that_cannot_run_a_shape_says_so_and_is_no_failure(tmp_path, capsys, monkeypatch):
    """SDPA's flash backend refusing a head dim, say: the row is N/A with the reason, exit code 0."""
    def build(case):
        if case.shape[4] == "causal":
            raise Unavailable("no causal kernel for this shape")
        return lambda q, k, v, out: F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    monkeypatch.setattr(attention.WORKLOAD, "references",
                        [Reference("fussy", build, runs_on=lambda m: "fussy")])
    path = tmp_path / "att.json"
    code, out, _ = bench(capsys, *ATTENTION, "--json", str(path))
    assert code == 0
    data = json.loads(path.read_text())
    fussy = {r["shape"][4]: r for r in data["rows"] if r["impl"] == "fussy"}
    assert fussy["causal"]["status"] == "unavailable"
    assert fussy["causal"]["message"] == "no causal kernel for this shape"
    assert fussy["causal"]["ms_runs"] == [] and fussy["noncausal"]["status"] == "ok"   # returned, not written
    assert "1x2x100x64:causal fussy [fussy]: unavailable (no causal kernel for this shape)" in out
    assert any(ln.startswith("| 1x2x100x64:causal ") and "| N/A " in ln for ln in out.splitlines())
    assert data["failures"] == 0 and out.rstrip().splitlines()[-1].endswith("all rows correct.")


def test_a_reference_scope_is_entered_per_timing_not_per_call(capsys, monkeypatch):
    """SDPA's sdpa_kernel(...) costs ~10 us to enter: it is entered around the build, the check and
    each whole timing, and every call runs inside it."""
    entered, inside = [], [False]

    @contextlib.contextmanager
    def scope():
        entered.append(1)
        inside[0] = True
        yield
        inside[0] = False

    def call(a, b, bias, out):
        assert inside[0], "called outside its scope"
        calls.append(1)
        out.copy_(epilogue._epilogue(case[0], a.double() @ b.double(), bias.double()))
    calls, case = [], []
    monkeypatch.setattr(epilogue.WORKLOAD, "references", [Reference(
        "scoped", lambda c: case.append(c) or call, runs_on=lambda m: "scoped", scope=scope)])
    code, _, _ = bench(capsys, *EPILOGUE[:-2], "--shapes", "64x64x64:relu", "--rounds", "3")
    assert code == 0
    assert len(entered) == 1 + 3 and len(calls) > len(entered)   # check, then 3 timings of many calls


# ---- FP8: the scales' granularity as the mode, references per mode -----------------------------------

def test_fp8_shapes_name_their_granularity_and_accumulation_or_get_every_mode():
    shapes = parse_shapes("4096x4096x4096:row-fast, 128X4096X4096:Block,100x72x200", fp8.PRESETS, "MNK",
                          fp8.MODES)
    assert fp8.MODES == ("tensor", "tensor-fast", "row", "row-fast", "block")
    assert shapes == [(4096, 4096, 4096, "row-fast"), (128, 4096, 4096, "block"),
                      *((100, 72, 200, mode) for mode in fp8.MODES)]
    assert [shape_text(s) for s in shapes[:2]] == ["4096x4096x4096:row-fast", "128x4096x4096:block"]
    chosen = cli.choose_shapes("gpu-quick,64x64x64:tensor-fast", [fp8.WORKLOAD], cli.machines.detect(), False)
    assert chosen["fp8"] == [*fp8.PRESETS["gpu-quick"], (64, 64, 64, "tensor-fast")]


def test_fp8_presets():
    squares = {(4096, 4096, 4096), (8192, 8192, 8192)}
    llm = {(M, N, K) for M in (128, 1024, 8192) for N, K in ((4096, 4096), (14336, 4096), (4096, 14336))}
    bench_ = fp8.PRESETS["bench"]
    assert {s[:3] for s in bench_ if s[3] == "tensor"} == squares
    assert {s[:3] for s in bench_ if s[3] == "row"} == {s[:3] for s in bench_ if s[3] == "block"} == \
        squares | {(8192, 8192, 1024)} | llm
    assert len(bench_) == 2 + 2 * (3 + 9)
    assert sorted(shape_text(s) for s in fp8.PRESETS["gpu-quick"]) == sorted(
        [f"{n}x{n}x{n}:{m}" for n in (4096, 8192) for m in ("row", "row-fast", "tensor", "block")]
        + ["128x4096x4096:row"])
    assert {s[3] for s in fp8.PRESETS["cpu"]} == set(fp8.MODES)
    assert all(s[1] % 128 and s[2] % 128 for s in fp8.PRESETS["cpu"])            # ragged
    cpu = cli.machines.detect()
    if not cpu.gpu:
        assert fp8.WORKLOAD.default_preset(cpu, False) == "cpu"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fp8_runs_on_the_cpu_with_the_references_of_each_mode(dtype, tmp_path, capsys):
    path = tmp_path / "fp8.json"
    code, out, _ = bench(capsys, *FP8, "--shapes", "100x72x200:row-fast,64x136x300:block", "--dtype", dtype,
                         "--json", str(path))
    assert code == 0
    data = json.loads(path.read_text())
    assert [(shape_text(tuple(r["shape"])), r["impl"], r["status"]) for r in data["rows"]] == [
        ("100x72x200:row-fast", "tilews.ops.fp8_scaled_mm", "ok"),
        ("100x72x200:row-fast", "torch._scaled_mm", "ok"),
        ("64x136x300:block", "tilews.ops.fp8_scaled_mm", "ok"),
        ("64x136x300:block", "torch._scaled_mm rowwise", "ok"),
        ("64x136x300:block", "F.scaled_mm blockwise", "unavailable")]
    ok = [r for r in data["rows"] if r["status"] == "ok"]
    assert all(r["flops"] == 2 * r["shape"][0] * r["shape"][1] * r["shape"][2] for r in ok)
    assert all(r["rel_err"] < 1e-2 and r["dtype"] == dtype for r in ok)
    assert [set(r["ratios"]) for r in ok if r["kind"] == "tilews"] == [{"torch._scaled_mm"},
                                                                      {"torch._scaled_mm rowwise"}]
    assert ("64x136x300:block F.scaled_mm blockwise [torch CPU]: unavailable (torch's block-wise scaled_mm "
            "does not take this case here: ") in out
    assert out.rstrip().splitlines()[-1].endswith("all rows correct.")


def test_fp8_block_rows_rowwise_baseline_multiplies_the_same_exact_product():
    """The block scales vary along M, N and K, and the rowwise baseline's operands and scales give
    the same float64 product, so every row of a block shape is checked against one reference."""
    machine = cli.machines.detect()
    case = Case((64, 300, 700, "block"), torch.bfloat16, machine)
    a, b, scale_a, scale_b, *rowwise = fp8.WORKLOAD.make_inputs(
        case, torch.Generator(device=machine.device).manual_seed(0))
    assert torch.equal(fp8.exact(a, b, scale_a, scale_b), fp8.exact(*rowwise))
    assert (scale_a.shape, scale_a.stride()) == ((64, 6), (1, 64))     # cuBLAS's layouts
    assert (scale_b.shape, scale_b.stride()) == ((6, 3), (1, 6))
    assert b.stride() == rowwise[1].stride() == (1, 700)                           # column-major, as w.t()
    assert all(len(set(s.tolist())) > 1 for s in (scale_a[:, 0], scale_a[0], scale_b[:, 0], scale_b[0]))
    assert all(bool((s > 0).all()) for s in (scale_a, scale_b, *rowwise[2:]))


def test_fp8_cublas_128x128_scales_have_their_k_blocks_padded_to_a_multiple_of_4():
    scale_b = fp8.positive_scale((2, 3), torch.Generator().manual_seed(0), torch.device("cpu")).t()
    padded = fp8._cublas_scale_b(scale_b)
    assert (padded.shape, padded.stride()) == ((4, 2), (1, 4))
    assert torch.equal(padded[:3], scale_b) and bool((padded[3] == 1).all())
    four = fp8.positive_scale((2, 4), torch.Generator().manual_seed(0), torch.device("cpu")).t()
    assert fp8._cublas_scale_b(four) is four


def test_fp8_blockwise_reference_needs_a_torch_with_block_scaling(monkeypatch):
    if hasattr(F, "ScalingType"):       # a torch with torch.nn.functional.scaled_mm
        assert fp8.BLOCKWISE.unavailable(cli.machines.detect()) is None
    monkeypatch.setattr(fp8, "F", types.SimpleNamespace())
    why = fp8.BLOCKWISE.unavailable(cli.machines.detect())
    assert "has no block-wise torch.nn.functional.scaled_mm" in why


# ---- all, and a workload without tilews kernels ------------------------------------------------------

def test_a_workload_without_kernels_says_so_and_exits_0(capsys, monkeypatch):
    workloads = {"gemm": gemm.WORKLOAD, "fp4": Pending("fp4", "tilews has no FP4 kernels yet.")}
    monkeypatch.setattr(cli, "registry", lambda: workloads)
    code, out, _ = bench(capsys, "all", *SMALL, "--rounds", "1")
    assert code == 0
    assert "fp4: not yet available. tilews has no FP4 kernels yet." in out
    assert out.rstrip().splitlines()[-1].endswith("all rows correct.")


def test_all_runs_every_workload(tmp_path, capsys):
    path = tmp_path / "all.json"
    code, out, _ = bench(capsys, "all", "--targets", "interpret", "--shapes", "cpu", "--rounds", "1",
                         "--quick", "--json", str(path))
    assert code == 0
    data = json.loads(path.read_text())
    assert data["pending"] == {}
    per_workload = {w: [r for r in data["rows"] if r["workload"] == w]
                    for w in ("gemm", "epilogue", "attention", "fp8")}
    # attention: no reference here, the op and the explicit T.ws program; fp8: per shape, 4 modes
    # with torch._scaled_mm, block with two
    assert [len(rows) for rows in per_workload.values()] == [2 * 2, 6 * 2, 2 * 2, 2 * (4 * 2 + 3)]
    assert {r["impl"] for r in data["rows"] if r["status"] != "ok"} == {"F.scaled_mm blockwise"}
    assert all(r["status"] == "unavailable" for r in data["rows"] if r["status"] != "ok")
    assert out.rstrip().splitlines()[-1].endswith("all rows correct.")


def test_all_gives_each_shape_to_the_workloads_it_fits(tmp_path, capsys):
    path = tmp_path / "all.json"
    code, out, _ = bench(capsys, "all", *SMALL, "--rounds", "1", "--json", str(path))
    assert code == 0
    data = json.loads(path.read_text())
    assert {(r["workload"], shape_text(tuple(r["shape"]))) for r in data["rows"]} == {
        ("gemm", "64x64x64"), ("gemm", "100x72x40"),
        *(("epilogue", f"{s}:{act}") for s in ("64x64x64", "100x72x40") for act in epilogue.MODES),
        *(("fp8", f"{s}:{mode}") for s in ("64x64x64", "100x72x40") for mode in fp8.MODES)}
    assert data["unavailable"]["workload attention"] == ("skipped: no --shapes entry is one of its presets "
                                                         "or a BxHxSxD[:causal|noncausal] shape")
    assert "workload attention: unavailable (skipped:" in out


def test_all_with_a_shape_no_workload_takes_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["all", "--shapes", "cpu,64x64"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "tilews-bench all: error: --shapes entry '64x64' fits no workload (gemm: shape '64x64' has 2" in err
    assert ("attention: shape '64x64' has 2 dimension(s); this workload's shapes are "
            "BxHxSxD[:causal|noncausal]") in err


def python_m_bench(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tilews.bench", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_python_dash_m_bench_gemm_quick(tmp_path):
    """The issue's "done when" command, with its defaults: every target and reference of this
    machine, all correct, the table last."""
    path = tmp_path / "quick.json"
    proc = python_m_bench("gemm", "--quick", "--json", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(path.read_text())
    gpu = data["device"]["type"] == "cuda"
    kernels = {(r["impl"], r["target"]) for r in data["rows"]}
    assert kernels == ({("tilews 128x128x64 s3", "triton"), ("torch.matmul", "cuBLAS"),
                        ("triton tl.dot", "triton")} if gpu else
                       {("tilews 128x128x64 s3", "interpret"), ("tilews 128x128x64 s3", "triton"),
                        ("tilews.ops.matmul (heuristic)", "interpret"),
                        ("tilews.ops.matmul (tuned)", "interpret"),
                        ("torch.matmul", "torch CPU"), ("triton tl.dot", "triton CPU interpreter")})
    assert len(data["rows"]) == 2 * len(kernels)
    # without a GPU the tuned row is N/A (tuning under the interpreter is slow); all others ok
    assert all(r["status"] == ("unavailable" if r["impl"] == "tilews.ops.matmul (tuned)" and not gpu
                               else "ok") for r in data["rows"])
    assert gpu or "INTERPRETER TIMINGS" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].endswith("all rows correct.")


# ---- GEMM presets, the tilews.ops.matmul rows, launch ------------------------------------------------

def test_llm_and_ragged_presets_and_preset_is_another_name_for_shapes():
    llm = parse_shapes("llm", gemm.PRESETS, "MNK")
    assert len(llm) == 21 and set(llm) == {(M, N, K) for M in (1, 16, 32, 128, 512, 2048, 8192)
                                           for N, K in ((4096, 4096), (14336, 4096), (4096, 14336))}
    assert parse_shapes("ragged", gemm.PRESETS, "MNK") == [(1000, 1100, 1234), (513, 257, 129),
                                                            (777, 512, 4096), (4095, 4097, 4099)]
    assert set(gemm.RAGGED) <= set(gemm.PRESETS["bench"])
    for argv in (["gemm", "--preset", "llm"], ["gemm", "--shapes", "llm"]):
        args = cli.build_parser().parse_args(argv)
        assert cli.choose_shapes(args.shapes, [gemm.WORKLOAD], cli.machines.detect(), False) == {"gemm": llm}


def test_decode_presets_are_gemv_class_products():
    """gemm's ``decode``: M 1-16 at N, K in {4096, 14336}; fp8's: M 16-128 at an LLM's projections,
    per-row, per-tensor and block-wise."""
    assert set(parse_shapes("decode", gemm.PRESETS, "MNK")) == {
        (M, N, K) for M in (1, 4, 8, 16) for N in (4096, 14336) for K in (4096, 14336)}
    rows = parse_shapes("decode", fp8.PRESETS, "MNK", fp8.MODES)
    assert {s[0] for s in rows} == {16, 32, 64, 128} and {s[3] for s in rows} == {"row", "tensor", "block"}
    assert {s[1:3] for s in rows} == {(4096, 4096), (14336, 4096), (4096, 14336)} and len(rows) == 36


def test_variants_runs_only_the_named_tilews_variants_and_every_reference(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gemm.WORKLOAD, "variants", [USER_PROGRAM, planted("other", lambda a, b, c: None)])
    path = tmp_path / "only.json"
    code, _, _ = bench(capsys, "gemm", "--targets", "interpret", "--shapes", "100x72x40", "--rounds", "1",
                       "--variants", "128x128x64", "--json", str(path))
    assert code == 0
    assert [(r["impl"], r["status"]) for r in json.loads(path.read_text())["rows"]] == [
        ("tilews 128x128x64 s3", "ok"), ("torch.matmul", "ok")]


def test_explicit_ws_programs_are_hopper_rows_with_right_numbers():
    """The schedules written out with ``T.ws`` (examples/ws_gemm.py) are rows of target hopper only;
    their programs compute the product (checked here on the interpreter, built as the bench builds
    them, into a poisoned C)."""
    machine = cli.machines.detect()
    assert [v.name.split(", ")[1] for v in EXPLICIT] == ["one handshake 128x128x32", "ring 128x256x64 s3",
                                                         "ping-pong 128x128x64 s4"]
    gen = torch.Generator().manual_seed(3)
    a, b = (torch.randn(*s, generator=gen).half() for s in ((128, 192), (192, 256)))
    want = a.double() @ b.double()
    for v in EXPLICIT:
        assert v.unavailable("hopper", machine) is None
        assert v.unavailable("triton", machine) == ("written for Hopper's warp specialization: target "
                                                    "hopper only")
        c = torch.full((128, 256), float("nan"), dtype=torch.float16)
        v.build(Case((128, 256, 192), torch.float16, machine), "interpret")(a, b, c)
        assert ((c.double() - want).abs().max() / want.abs().max()).item() < 2e-3, v.name


def test_ops_rows_are_correct_and_tuned_is_unavailable_on_the_cpu(tmp_path, capsys, monkeypatch):
    """The heuristic's schedule runs through tilews.ops.run on the op's own target and matches the
    exact product; without a GPU the tuned row says why it did not run, and is no failure."""
    if cli.machines.detect().gpu:
        pytest.skip("the CPU's behaviour: on a GPU the tuned row tunes")
    monkeypatch.delenv("TILEWS_TUNE", raising=False)
    assert list(OPS_VARIANTS) == [HEURISTIC, TUNED]
    monkeypatch.setattr(gemm.WORKLOAD, "variants", list(OPS_VARIANTS.values()))
    path = tmp_path / "ops.json"
    code, out, _ = bench(capsys, "gemm", "--targets", "interpret", "--shapes", "cpu", "--rounds", "1",
                         "--quick", "--json", str(path))
    assert code == 0
    rows = json.loads(path.read_text())["rows"]
    assert [(r["shape"], r["impl"], r["target"], r["status"]) for r in rows] == [
        (list(shape), impl, target, status) for shape in gemm.PRESETS["cpu"]
        for impl, target, status in ((HEURISTIC, "interpret", "ok"), (TUNED, "interpret", "unavailable"),
                                     ("torch.matmul", "torch CPU", "ok"))]
    assert all(r["rel_err"] < 1e-2 and r["ms"] > 0 for r in rows if r["status"] == "ok")
    assert all(r["message"] == "tuning runs on a GPU only: under the CPU interpreter it is slow "
                               "(TILEWS_TUNE=1 tunes here anyway)" for r in rows if r["impl"] == TUNED)
    assert "200x136x100 tilews.ops.matmul (tuned) [interpret]: unavailable (tuning runs on a GPU only" in out


def test_tuned_row_tunes_on_the_cpu_when_asked(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TILEWS_TUNE", "1")
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gemm.WORKLOAD, "variants", [OPS_VARIANTS[TUNED]])
    path = tmp_path / "tuned.json"
    code, _, _ = bench(capsys, "gemm", "--targets", "interpret", "--shapes", "100x72x40", "--rounds", "1",
                       "--quick", "--json", str(path))
    assert code == 0
    tuned, _ = json.loads(path.read_text())["rows"]
    assert (tuned["impl"], tuned["status"]) == (TUNED, "ok") and tuned["rel_err"] < 1e-2
    assert list((tmp_path / "cache" / "ops" / "matmul").glob("*.json"))   # the winner, kept for the bucket


def test_ops_rows_run_only_on_the_target_the_op_picks():
    machine = cli.machines.detect()
    here = gemm.ops_target(machine)
    assert machine.gpu or here == "interpret"
    other = "interpret" if here != "interpret" else "triton"
    for variant in OPS_VARIANTS.values():
        assert variant.unavailable(here, machine) is None
        assert variant.unavailable(other, machine) == (f"tilews.ops.matmul compiles for the target it "
                                                       f"picks: '{here}' here")
    assert USER_PROGRAM.unavailable(other, machine) is None


LAUNCH_ROWS = ["tilews kernel", "raw triton launch", "torch.matmul", "tilews.ops.matmul",
               "tilews.ops.fp8_scaled_mm", "torch._scaled_mm"]


def test_launch_times_every_kernel_and_writes_its_json(tmp_path):
    path = tmp_path / "launch.json"
    proc = python_m_bench("launch", "--calls", "2", "--rounds", "2", "--json", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(path.read_text())
    assert set(data) >= {"schema", "command", "created", "device", "versions", "dtype", "shape", "timing",
                         "rows", "failures", "exit_code"}
    assert (data["command"], data["dtype"], data["shape"]) == ("launch", "bf16", [64, 64, 64])
    assert (data["failures"], data["exit_code"]) == (0, 0)
    assert (data["timing"]["calls"], data["timing"]["rounds"]) == (2, 2)
    gpu = data["device"]["type"] == "cuda"
    assert data["timing"]["interpreter_timings"] is not gpu
    rows = {r["impl"]: r for r in data["rows"]}
    assert list(rows) == LAUNCH_ROWS
    raw = rows["raw triton launch"]
    for name, r in rows.items():
        assert r["status"] == "ok" and r["rel_err"] < 1e-2, r
        assert len(r["us_runs"]) == 2 and r["us"] == pytest.approx(sum(r["us_runs"]) / 2) and r["us"] > 0
        expected = None if name == "raw triton launch" else r["us"] - raw["us"]
        assert r["minus_raw_triton_us"] == pytest.approx(expected)
    assert gpu or [rows[n]["runs_on"] for n in LAUNCH_ROWS] == [
        "tilews interpret", "triton CPU interpreter", "torch CPU", "tilews interpret",
        "tilews interpret", "torch CPU"]
    lines = proc.stdout.rstrip().splitlines()
    assert gpu or "INTERPRETER TIMINGS" in proc.stdout
    assert any(ln.startswith("| kernel ") and "| minus raw triton (us) |" in ln for ln in lines)
    assert lines[-1].endswith("all rows correct.")


def test_launch_a_wrong_kernel_fails_and_one_that_cannot_run_does_not(tmp_path, capsys, monkeypatch):
    """In-process, with stand-ins: the raw launch is torch.matmul itself, one kernel is wrong, one
    cannot run here."""
    def unavailable(machine, a):
        raise launch.Unavailable("not on this machine")
    monkeypatch.setattr(launch, "CONTENDERS", [
        launch.Contender(launch.RAW, lambda machine, a: (torch.matmul, "stand-in")),
        launch.Contender("doubled", lambda machine, a: (lambda a, b: 2 * (a @ b), "stand-in")),
        launch.Contender("absent", unavailable)])
    path = tmp_path / "launch.json"
    code, out, _ = bench(capsys, "launch", "--calls", "3", "--rounds", "2", "--json", str(path))
    assert code == 1
    data = json.loads(path.read_text())
    assert [(r["impl"], r["status"]) for r in data["rows"]] == [
        (launch.RAW, "ok"), ("doubled", "fail"), ("absent", "unavailable")]
    assert data["rows"][1]["message"].endswith("exceeds the tolerance 1e-02")
    assert data["rows"][1]["rel_err"] == pytest.approx(1.0, abs=1e-2)   # 2x the product
    assert data["rows"][1]["us_runs"] == [] and data["rows"][2]["message"] == "not on this machine"
    assert (data["failures"], data["exit_code"]) == (1, 1)
    assert "FAIL doubled: rel err" in out and "UNAVAILABLE absent: not on this machine" in out
    assert out.rstrip().splitlines()[-1].endswith("1 row(s) FAILED: exit code 1.")


def test_decode_runs_gqa_and_mla_on_the_cpu(tmp_path, capsys):
    from tilews.bench import decode
    path = tmp_path / "decode.json"
    code, out, _ = bench(capsys, "decode", "--targets", "interpret", "--rounds", "1", "--quick",
                         "--json", str(path))
    assert code == 0
    assert "reference SDPA flash: unavailable (" in out and "reference torch MLA (einsum): unavailable (" in out
    data = json.loads(path.read_text())
    assert [(r["shape"], r["impl"], r["status"]) for r in data["rows"]] == [
        ([2, 8, 2, 100, 64, "gqa"], "tilews.ops decode", "ok"),
        ([1, 64, 1, 70, 64, "mla"], "tilews.ops decode", "ok")]
    assert all(r["rel_err"] < 1e-2 for r in data["rows"])
    assert decode.WORKLOAD.flops((2, 8, 2, 100, 64, "gqa")) == 4 * 2 * 8 * 100 * 64
    assert decode.WORKLOAD.flops((1, 64, 1, 70, 64, "mla")) == 2 * 64 * 70 * (64 + 64) + 2 * 64 * 70 * 64


def test_attention_backward_and_varlen_run_on_the_cpu(tmp_path, capsys):
    from tilews.bench import attention_backward, attention_varlen
    path = tmp_path / "bwd.json"
    code, out, _ = bench(capsys, "attention", "--backward", "--targets", "interpret", "--rounds", "1",
                         "--shapes", "1x2x100x64:causal", "--json", str(path))
    assert code == 0 and "reference SDPA cuDNN backward: unavailable (" in out
    rows = json.loads(path.read_text())["rows"]
    assert [(r["impl"], r["status"]) for r in rows] == [("tilews.ops.attention backward", "ok")]
    assert rows[0]["rel_err"] < 1e-2
    assert attention_backward.WORKLOAD.flops((1, 2, 100, 64, "causal")) == 10 * 2 * 100 * 100 * 64 / 2
    path = tmp_path / "varlen.json"
    code, out, _ = bench(capsys, "attention", "--varlen", "--targets", "interpret,triton", "--rounds", "1",
                         "--shapes", "1x2x100x64:noncausal", "--json", str(path))
    assert code == 0 and "the op compiles for this machine's target, 'interpret'" in out
    rows = json.loads(path.read_text())["rows"]
    assert [(r["impl"], r["status"]) for r in rows] == [("tilews.ops.attention_varlen", "ok"),
                                                         ("tilews.ops.attention (dense)", "ok")]
    assert all(r["rel_err"] < 1e-2 for r in rows)
    assert attention_varlen.WORKLOAD.flops((1, 2, 100, 64, "noncausal")) == 4 * 2 * 100 * 100 * 64


def test_attention_takes_backward_or_varlen_not_both(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["attention", "--backward", "--varlen"])
    assert e.value.code == 2 and "not allowed with argument --backward" in capsys.readouterr().err
