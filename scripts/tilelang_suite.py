"""Run TileLang's own example tests (``examples/<dir>/test_*.py``) on tilews with only their import
lines changed, and beside them, on request, the same files under the real TileLang.

    python scripts/tilelang_suite.py fetch [--repo PATH_OR_URL] [--rev REV]
    python scripts/tilelang_suite.py run [--only DIR_OR_SUBSTRING ...] [--jobs N]
                                         [--timeout SECONDS] [--peer] [--cpu]

``fetch`` copies each directory of ``DIRS`` whole from TileLang's ``examples/`` (and the examples'
pytest setup, ``conftest.py`` and ``pytest.ini``: seeds, and a rootdir that keeps this repo's
pytest options out) into ``.tilelang_suite/original/`` (ignored by git: TileLang's files are never
committed here), and writes ``.tilelang_suite/REVISION``. The default repo is the local mirror if
there is one, else GitHub.

On the GPU machine (the device tool carries ``.tilelang_suite`` and, for ``--peer``, ``.peers``),
from the repository root, with tilews importing from this checkout as ``scripts/device_run.sh``
arranges it:

    TILEWS_DEVICE_CMD='python scripts/tilelang_suite.py run --peer' bash scripts/device_run.sh

(a device command has 10 minutes: pick ``--only``, ``--jobs`` and ``--timeout`` to fit). ``run``
writes a copy with every ``.py`` file's imports rewritten (``tilelang_imports.py``) to
``.tilelang_suite/tilews/``, then runs each ``test_*.py`` under pytest from its own directory (the
examples beside it import), with this checkout's tilews first on ``PYTHONPATH``, ``--jobs`` files
at once, each within ``--timeout`` seconds (default 600). A file past its time is interrupted (its
finished tests are kept); every test it did not report is ``timeout``. ``--only`` keeps the
directories named, or the files whose ``dir/test_file.py`` contains one of the strings.

Where a test process cannot import a reference module the examples check against
(``STAND_INS``: ``flash_attn``, which the GPU machine cannot install), ``suite_stubs/`` goes last on
its ``PYTHONPATH``: a float32 torch stand-in, not the real package; the summary and the JSON
(``stand_ins``, ``stand_in_note``) say so.

``--peer`` also runs the original files under TileLang 0.1.15, interleaved with the tilews ones
in the same pool, with ``PYTHONPATH=/tmp/site`` (and the stand-ins where used; extracted from
``.peers/tilelang.tar.xz`` when missing: /work/shared/docs/peers-on-gpu.md).

``--cpu`` is a dry run for development on a machine without a GPU, not a measurement:
``suite_cpu_plugin.py`` turns CUDA tensors into CPU tensors and ``target="auto"`` into
``"interpret"`` (default timeout 120 s). It finds the tests that stop at a missing name or a
refused declaration; numerically heavy ones time out.

Each test is ``pass``, ``fail``, ``skip`` (with its reason), ``error`` or ``timeout``, with its first
error in one line (exception type and the first line of its message). Progress lines come first,
then a markdown table and the totals. ``$OUT/tilelang_suite.json`` (``OUT`` defaults to /tmp/out)
holds everything and is rewritten after each file, so a cut-off run keeps what it had; each file's
pytest output (last 200 lines) is in ``$OUT/tilelang_suite/<dir>/<file>.<tilews|tilelang>.log``.
The exit status is 0 when the suite ran (the table is the result), non-zero when it could not.
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from tilelang_imports import rewrite, tilews_pythonpath

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / ".tilelang_suite"
MIRROR = Path("/work/.mirror/tile-ai+tilelang/repo")
GITHUB = "https://github.com/tile-ai/tilelang"
REVISION = "a35008a"                     # the TileLang revision the suite was set up against
PEER_ARCHIVE, PEER_SITE = Path(".peers/tilelang.tar.xz"), Path("/tmp/site")
STUBS = Path(__file__).resolve().parent / "suite_stubs"
STAND_INS = ("flash_attn",)              # references the examples import that STUBS stands in for
DIRS = ("flash_attention", "flash_decoding", "deepseek_mla", "deepseek_deepgemm", "gemv",
        "grouped_gemm", "dequantize_gemm", "cast", "blocksparse_gemm", "gemm", "gemm_fp8",
        "gemm_splitk", "gemm_sp", "warp_specialize", "elementwise", "norm", "topk", "convolution",
        "gemm_streamk")
SETUP = ("conftest.py", "pytest.ini")    # examples/ files every test runs under
RUNTIMES = ("tilews", "tilelang")
LABELS = {"tilews": "tilews", "tilelang": "TileLang"}
INTERRUPT_GRACE_S = 20                   # after SIGINT, time to write the junit XML
LOG_LINES = 200


# ---- fetch -------------------------------------------------------------------------------------

def fetch(repo: str, rev: str) -> None:
    """Copy ``DIRS`` and ``SETUP`` of TileLang's ``examples/`` at ``rev`` from ``repo`` (a local git
    directory or a URL) into ``STORE/original``."""
    with tempfile.TemporaryDirectory() as tmp:
        git_dir = repo
        if not Path(repo).exists():
            subprocess.run(["git", "clone", "-q", "--bare", repo, f"{tmp}/git"], check=True)
            git_dir = f"{tmp}/git"
        git = ["git", "--git-dir", git_dir]
        commit = subprocess.run([*git, "rev-parse", rev], check=True, capture_output=True,
                                text=True).stdout.strip()
        paths = [f"examples/{p}" for p in (*DIRS, *SETUP)]
        archive = subprocess.run([*git, "archive", "--format=tar", commit, *paths], check=True,
                                 capture_output=True).stdout
        Path(f"{tmp}/examples.tar").write_bytes(archive)
        with tarfile.open(f"{tmp}/examples.tar") as tar:
            tar.extractall(f"{tmp}/tree", filter="data")
        shutil.rmtree(STORE / "original", ignore_errors=True)
        shutil.copytree(f"{tmp}/tree/examples", STORE / "original")
    (STORE / "REVISION").write_text(f"{repo} {commit}\n")
    print(f"{len(DIRS)} example directories of {repo} at {commit} -> {STORE / 'original'}")


# ---- run: what to run, and how -----------------------------------------------------------------

def write_tilews_copy(dirs: list[str]) -> dict[str, list[tuple[str, str]]]:
    """``STORE/tilews/<dir>`` for each of ``dirs`` (and ``SETUP``): the originals with every
    ``.py`` file's imports rewritten; returns the rewritten lines by file."""
    changed = {}
    (STORE / "tilews").mkdir(parents=True, exist_ok=True)
    for name in SETUP:
        shutil.copy(STORE / "original" / name, STORE / "tilews" / name)
    for d in dirs:
        src, dst = STORE / "original" / d, STORE / "tilews" / d
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        for path in dst.rglob("*.py"):
            text, changed[str(path.relative_to(dst.parent))] = rewrite(path.read_text())
            path.write_text(text)
    return changed


def select_files(only: list[str]) -> list[tuple[str, str]]:
    """(dir, test file) pairs: every ``test_*.py`` of ``DIRS``, or those ``only`` keeps: a
    directory it names, a file whose ``dir/test_file.py`` contains one of its other strings."""
    files = [(d, p.name) for d in DIRS for p in sorted((STORE / "original" / d).glob("test_*.py"))]
    if not only:
        return files
    substrings = [o for o in only if o not in DIRS]
    return [(d, f) for d, f in files if d in only or any(o in f"{d}/{f}" for o in substrings)]


def pytest_command(junit: Path, cpu: bool) -> list[str]:
    plugin = ["-p", "suite_cpu_plugin"] if cpu else []
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin,
            f"--junitxml={junit}"]


def environment(runtime: str, cpu: bool) -> dict[str, str]:
    """The test process's environment: this checkout's tilews first (and ``scripts/`` for the CPU
    plugin), or for TileLang ``/tmp/site`` alone."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if runtime == "tilelang":
        return {**env, "PYTHONPATH": str(PEER_SITE)}
    if cpu:
        extra = (str(Path(__file__).resolve().parent),)
        return {**env, "PYTHONPATH": tilews_pythonpath(extra), "TRITON_INTERPRET": "1"}
    return {**env, "PYTHONPATH": tilews_pythonpath()}


def missing_references(env: dict[str, str]) -> list[str]:
    """The modules of ``STAND_INS`` that a test process with ``env`` cannot import."""
    probe = ("import importlib, sys\n"
             "for name in sys.argv[1:]:\n"
             "    try:\n"
             "        importlib.import_module(name)\n"
             "    except Exception:\n"
             "        print(name)\n")
    result = subprocess.run([sys.executable, "-c", probe, *STAND_INS], env=env,
                            capture_output=True, text=True, check=True)
    return result.stdout.split()


def with_stand_ins(env: dict[str, str], names: list[str]) -> dict[str, str]:
    """``env`` with ``STUBS`` last on ``PYTHONPATH`` when any of ``names`` is missing."""
    if not names:
        return env
    path = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": f"{path}{os.pathsep}{STUBS}" if path else str(STUBS)}


def stand_in_note(stand_ins: dict[str, list[str]]) -> str:
    """What the summary says of the stand-ins a run used ('' for none)."""
    used = sorted({n for names in stand_ins.values() for n in names})
    if not used:
        return ""
    who = " and ".join(LABELS[r] for r, names in stand_ins.items() if names)
    return (f"note: {', '.join(used)} is this repo's float32 torch stand-in ({STUBS}), not the "
            f"real package, for {who}: the tests that check against it compare with plain torch "
            f"attention, and the times they print for it are the stand-in's")


def ensure_peer() -> bool:
    """TileLang under ``/tmp/site``, extracted from ``.peers/tilelang.tar.xz`` if needed."""
    if not (PEER_SITE / "tilelang").exists() and PEER_ARCHIVE.exists():
        print(f"extracting {PEER_ARCHIVE} -> {PEER_SITE}", flush=True)
        PEER_SITE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-xJf", str(PEER_ARCHIVE), "-C", str(PEER_SITE)], check=True)
    return (PEER_SITE / "tilelang").exists()


# ---- run: one test file ------------------------------------------------------------------------

def run_file(d: str, f: str, runtime: str, env: dict[str, str], timeout: float, cpu: bool,
             logs: Path) -> dict:
    """Run one test file under pytest with ``env``; its tests' results."""
    folder = STORE / ("tilews" if runtime == "tilews" else "original") / d
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        t0 = time.perf_counter()
        output, returncode, timed_out = run_bounded(
            [*pytest_command(junit, cpu), f], folder, env, timeout)
        wall = time.perf_counter() - t0
        reported = parse_junit(junit.read_text()) if junit.exists() else []
    log = logs / d / f"{f}.{runtime}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n".join(output.splitlines()[-LOG_LINES:]) + "\n")
    tests = complete(reported, defined_tests(folder / f), timed_out, timeout,
                     f"pytest exit {returncode}: {last_line(output)}")
    return {"dir": d, "file": f, "runtime": runtime, "wall_s": round(wall, 1),
            "timed_out": timed_out, "returncode": returncode, "tests": tests}


def run_bounded(cmd: list[str], cwd: Path, env: dict, timeout: float) -> tuple[str, int, bool]:
    """(output, exit status, whether it ran past ``timeout``). Past it, the process group gets
    SIGINT (pytest then writes its junit XML of the tests done), then SIGKILL."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        return proc.communicate(timeout=timeout)[0], proc.returncode, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        output = proc.communicate(timeout=INTERRUPT_GRACE_S)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
    return output, proc.returncode, True


def defined_tests(path: Path) -> list[str]:
    """The test functions a file defines (TileLang's example tests are plain functions)."""
    tree = ast.parse(path.read_text())
    return [n.name for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")]


def complete(reported: list[dict], names: list[str], timed_out: bool, timeout: float,
             ended: str) -> list[dict]:
    """The reported tests, then each of ``names`` not reported: ``timeout``, or ``error`` with the
    file's collection error (or how pytest ended)."""
    collection = [t for t in reported if t["collection"]]
    tests = [t for t in reported if not t["collection"]]
    seen = {t["name"] for t in tests}
    why = collection[0]["error"] if collection else ended
    for name in names:
        if name not in seen:
            status = "timeout" if timed_out else "error"
            tests.append({"name": name, "status": status, "collection": False,
                          "error": f"timed out after {timeout:.0f} s" if timed_out else why})
    return tests


# ---- junit XML and first errors ----------------------------------------------------------------

def parse_junit(xml: str) -> list[dict]:
    """Each ``testcase`` of a pytest junit XML: name, status, first error (or skip reason), and
    whether it is a collection error (the module failed to import) rather than a test."""
    tests = []
    for case in ET.fromstring(xml).iter("testcase"):
        if not case.get("name"):            # the test an interrupt stopped: no report
            continue
        status, error = "pass", ""
        for tag, name in (("failure", "fail"), ("error", "error"), ("skipped", "skip")):
            node = case.find(tag)
            if node is not None:
                status = name
                message, text = node.get("message", ""), node.text or ""
                error = message if tag == "skipped" else first_error(text, message)
                break
        tests.append({"name": case.get("name", ""), "status": status, "error": error,
                      "collection": status == "error" and not case.get("classname")})
    return tests


_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failed|Warning)\b:?")


def first_error(text: str, message: str = "") -> str:
    """One line for a failure: the exception type and the first line of its message, from the
    last block of pytest's ``E   `` lines, else the last ``Type: message`` line, else the
    junit ``message``."""
    lines = text.splitlines()
    blocks, block = [], []
    for line in lines:
        if line.startswith("E ") or line == "E":
            block.append(line[1:].strip())
        elif block:
            blocks.append(block)
            block = []
    blocks += [block] if block else []
    candidates = [b[0] for b in blocks if b and b[0]]
    if candidates:
        line = candidates[-1]
        return f"AssertionError: {line}" if line.startswith("assert ") else _short(line)
    typed = [ln.strip() for ln in lines if _EXCEPTION.match(ln.strip())]
    if typed:
        return _short(typed[-1])
    return _short((message.strip().splitlines() or [last_line(text)])[0])


def _short(line: str, width: int = 300) -> str:
    return line if len(line) <= width else line[:width - 3] + "..."


def last_line(output: str) -> str:
    return next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "")


# ---- run: the pool and the report --------------------------------------------------------------

def run(only: list[str], jobs: int, timeout: float, peer: bool, cpu: bool) -> int:
    if not (STORE / "REVISION").exists():
        print(f"no {STORE / 'original'}: run `fetch` first", file=sys.stderr)
        return 2
    if peer and not ensure_peer():
        print(f"no TileLang: neither {PEER_SITE / 'tilelang'} nor {PEER_ARCHIVE}", file=sys.stderr)
        return 2
    files = select_files(only)
    if not files:
        print(f"no test file matches {only}", file=sys.stderr)
        return 2
    rewrites = write_tilews_copy(sorted({d for d, _ in files}))
    runtimes = RUNTIMES if peer else RUNTIMES[:1]
    stand_ins = {r: missing_references(environment(r, cpu)) for r in runtimes}
    envs = {r: with_stand_ins(environment(r, cpu), stand_ins[r]) for r in runtimes}
    work = [(d, f, r) for d, f in files for r in runtimes]      # interleaved
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    report = {"revision": (STORE / "REVISION").read_text().strip(), "cpu": cpu, "timeout_s": timeout,
              "stand_ins": stand_ins,
              "stand_in_note": stand_in_note(stand_ins), "files": [], "rewrites": rewrites}
    print(f"{len(work)} test file runs, {jobs} at once, {timeout:.0f} s each"
          f"{' (CPU dry run)' if cpu else ''}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:    # each job is a pytest process
        running = [pool.submit(run_file, d, f, r, envs[r], timeout, cpu, out / "tilelang_suite")
                   for d, f, r in work]
        for done in concurrent.futures.as_completed(running):
            result = done.result()
            report["files"].append(result)
            print(progress_line(result), flush=True)
            (out / "tilelang_suite.json").write_text(json.dumps(report, indent=1))
    print()
    print(table(report["files"], runtimes))
    print()
    for runtime in runtimes:
        print(totals(report["files"], runtime))
    if report["stand_in_note"]:
        print(report["stand_in_note"])
    return 0


def progress_line(result: dict) -> str:
    counts = {}
    for t in result["tests"]:
        counts[t["status"]] = counts.get(t["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no tests"
    return f"--- {result['dir']}/{result['file']} [{result['runtime']}]: {summary} in {result['wall_s']} s"


def table(files: list[dict], runtimes: tuple[str, ...]) -> str:
    """The markdown table: a row per (dir, test), a status and first-error column per runtime."""
    by_test = {}
    for result in files:
        for t in result["tests"]:
            by_test.setdefault((result["dir"], result["file"], t["name"]), {})[result["runtime"]] = t
    head = ["dir", "test"] + [c for r in runtimes for c in (LABELS[r], f"first error ({LABELS[r]})")]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (d, f, name), results in sorted(by_test.items()):
        cells = [d, name]
        for r in runtimes:
            t = results.get(r, {"status": "", "error": ""})
            cells += [t["status"], t["error"].replace("|", "\\|")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def totals(files: list[dict], runtime: str) -> str:
    """``tilews: P passed, F failed, S skipped of N``, then the errors and timeouts if any."""
    tests = [t for r in files if r["runtime"] == runtime for t in r["tests"]]
    n = {s: sum(t["status"] == s for t in tests) for s in ("pass", "fail", "skip", "error", "timeout")}
    others = ", ".join(f"{n[s]} {s}" for s in ("error", "timeout") if n[s])
    return (f"{LABELS[runtime]}: {n['pass']} passed, {n['fail']} failed, {n['skip']} skipped of "
            f"{len(tests)}" + (f" ({others})" if others else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--repo", default=str(MIRROR) if MIRROR.exists() else GITHUB,
                   help="a TileLang git directory or URL")
    f.add_argument("--rev", default=REVISION)
    r = sub.add_parser("run")
    r.add_argument("--only", nargs="*", default=[], help="directories, or substrings of dir/test_file.py")
    r.add_argument("--jobs", type=int, default=4, help="test files at once")
    r.add_argument("--timeout", type=float, help="seconds per test file (600; 120 with --cpu)")
    r.add_argument("--peer", action="store_true", help="also run the original files under TileLang")
    r.add_argument("--cpu", action="store_true", help="a dry run without a GPU (development only)")
    args = ap.parse_args(argv)
    if args.cmd == "fetch":
        fetch(args.repo, args.rev)
        return 0
    if args.peer and args.cpu:
        ap.error("--peer needs the GPU machine: TileLang does not run with --cpu")
    timeout = args.timeout or (120.0 if args.cpu else 600.0)
    return run(args.only, args.jobs, timeout, args.peer, args.cpu)


if __name__ == "__main__":
    sys.exit(main())
