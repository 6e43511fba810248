"""Run TileLang's own example files on tilews with only their import lines changed.

    python scripts/tilelang_examples.py fetch [--repo PATH_OR_URL] [--rev REV]
    python scripts/tilelang_examples.py run [--only SUBSTRING ...] [--timeout SECONDS]

``fetch`` (on a machine with the network, or with a local clone/mirror of TileLang) copies the
named example files into ``.tilelang_examples/`` (ignored by git: TileLang's files are never
committed here). ``run`` (on the GPU machine; the device tool carries ``.tilelang_examples``)
rewrites each file's import lines (``tilelang_imports.py``: ``import tilelang`` -> ``import tilews
as tilelang``, ``from tilelang.X import Y`` -> ``from tilews.X import Y``, ...) and nothing else,
runs it as a script with a time limit, and prints a table (file, pass/fail, wall time, the latency
lines the example prints); the same rows go to ``$OUT/tilelang_examples.json``. An example passes
when it exits with status 0: its own checks (``assert_close``, ``assert_allclose``, asserts) ran
and held.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tilelang_imports import rewrite, tilews_pythonpath

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / ".tilelang_examples"
DEFAULT_REPO = "https://github.com/tile-ai/tilelang"

# The 18 examples issue 12 names (paths under TileLang's examples/).
EXAMPLES = (
    "quickstart.py",
    "gemm/example_gemm.py",
    "gemm/example_gemm_persistent.py",
    "gemm/example_gemm_autotune_early_stop.py",
    "gemm/example_gemm_autotune_pass_configs.py",
    "warp_specialize/example_warp_specialize_gemm_barrierpipe_stage2.py",
    "warp_specialize/example_warp_specialize_gemm_copy_0_gemm_1.py",
    "warp_specialize/example_warp_specialize_gemm_copy_1_gemm_0.py",
    "warp_specialize/example_warp_specialize_gemm_copy_gemm_0_1.py",
    "warp_specialize/example_warp_specialize_gemm_softpipe_stage2.py",
    "elementwise/example_elementwise_add.py",
    "norm/rms_norm.py",
    "norm/layernorm.py",
    "online_softmax/online_softmax.py",
    "flash_attention/example_mha_fwd_bshd.py",
    "flash_attention/example_mha_fwd_bhsd.py",
    "gemm_fp8/example_tilelang_gemm_fp8.py",
    "gemm_fp8/example_tilelang_gemm_fp8_2xAcc.py",
)

def fetch(repo: str, rev: str) -> None:
    """Copy the examples of TileLang at ``rev`` from ``repo`` (a local git directory or a URL)."""
    with tempfile.TemporaryDirectory() as tmp:
        git_dir = repo
        if not Path(repo).exists():
            subprocess.run(["git", "clone", "-q", "--depth", "1", "--bare", repo, tmp], check=True)
            git_dir = tmp
        commit = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", rev], check=True,
                                capture_output=True, text=True).stdout.strip()
        for path in EXAMPLES:
            text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{rev}:examples/{path}"],
                                  check=True, capture_output=True, text=True).stdout
            dest = STORE / "original" / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
    (STORE / "REVISION").write_text(f"{repo} {commit}\n")
    print(f"{len(EXAMPLES)} examples of {repo} at {commit} -> {STORE / 'original'}")


def run_one(path: str, timeout: float) -> dict:
    original = STORE / "original" / path
    if not original.exists():
        return {"file": path, "status": "missing", "wall_s": 0.0, "latency": [], "changed": [],
                "tail": "run `fetch` first"}
    source, changed = rewrite(original.read_text())
    script = STORE / "tilews" / path
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(source)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": tilews_pythonpath()}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, script.name], cwd=script.parent, env=env,
                              capture_output=True, text=True, timeout=timeout)
        status = "pass" if proc.returncode == 0 else f"fail (exit {proc.returncode})"
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        status = f"timeout ({timeout:.0f} s)"
        output = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    wall = time.perf_counter() - t0
    latency = [ln.strip() for ln in output.splitlines() if re.search(r"(?i)latency|\bms\b|tflops", ln)
               and len(ln) < 200]
    return {"file": path, "status": status, "wall_s": round(wall, 1), "latency": latency[:6],
            "changed": changed, "tail": "\n".join(output.splitlines()[-25:])}


def run(only: list[str], timeout: float) -> list[dict]:
    rows = []
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    for path in EXAMPLES:
        if only and not any(o in path for o in only):
            continue
        row = run_one(path, timeout)
        rows.append(row)
        print(f"--- {path}: {row['status']} in {row['wall_s']} s; imports changed: "
              f"{len(row['changed'])}", flush=True)
        if row["status"] != "pass":
            print(row["tail"], flush=True)
        (out / "tilelang_examples.json").write_text(json.dumps(rows, indent=1))  # kept if cut off
    print("\n| file | result | wall s | latency printed |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['file']} | {r['status']} | {r['wall_s']} | {'; '.join(r['latency'])} |")
    print(f"\n{sum(r['status'] == 'pass' for r in rows)}/{len(rows)} passed")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--repo", default=DEFAULT_REPO, help="a TileLang git directory or URL")
    f.add_argument("--rev", default="HEAD")
    r = sub.add_parser("run")
    r.add_argument("--only", nargs="*", default=[], help="run the examples whose path contains one")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds per example")
    args = ap.parse_args(argv)
    if args.cmd == "fetch":
        fetch(args.repo, args.rev)
        return 0
    rows = run(args.only, args.timeout)
    return 0 if rows and all(r["status"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
