#!/usr/bin/env bash
# One command for the device tool (a GPU machine with torch and triton, nothing installable):
#     bash scripts/device_run.sh [more GEMM bench options, e.g. --shapes square (it runs --quick)]
# Runs tests/gpu (the FP8 ones included), then the GEMM bench, then the FP8 bench (--shapes
# gpu-quick --targets hopper); the benches' tables are printed last, FP8's at the end. Files go to
# $OUT (the device tool sets it; /tmp/out otherwise). Time limits (420 s tests, 160 s GEMM bench,
# then the FP8 bench with what is left of 580 s, at most 150 s) keep the whole run under the
# 10-minute limit.
#
# Imports. tilews is not installed there, and PYTHONPATH=$PWD is not enough: pyproject.toml installs
# lowering/, triton_ext/, metal/ and bench/ as tilews.lowering, ..., tilews.bench
# ([tool.setuptools.package-dir]), and nothing on sys.path maps a folder to a subpackage of another
# folder's package (short of extending tilews.__path__ in tilews/__init__.py, which we don't). So:
# 1. tilews, tilews.lowering and tilews.bench already import from this checkout (pip install -e .
#    was run here): run in place.
# 2. No tilews installed at all: try `pip install --no-deps --no-build-isolation --no-index -e .`
#    (offline; CI installs the same way, .ci/run). That needs setuptools>=64 (>=70.1, or wheel
#    beside it) in this python: the device image lists setuptools and wheel, but nobody has read
#    their versions there. The imports are checked again afterwards; then run in place.
# 3. Otherwise (pip failed, another tilews is installed, which we leave alone, or
#    TILEWS_IMPORTS_VIEW=1): run in a scratch view of this checkout, made of symlinks, with the
#    installed layout.
# The view stays: without it this script would depend on a setuptools version and a writable
# site-packages that nobody has checked on the device, and it keeps working where they are missing.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"

imports_here() {    # exit status 0: they import from this checkout; 3: no tilews at all; else 1
    local root="$PWD"
    (cd / && python - "$root" <<'PY'
import importlib, importlib.util, pathlib, sys
if importlib.util.find_spec("tilews") is None:
    sys.exit(3)
root = pathlib.Path(sys.argv[1]).resolve()
for name, folder in (("tilews", "tilews"), ("tilews.lowering", "lowering"), ("tilews.bench", "bench")):
    if pathlib.Path(importlib.import_module(name).__file__).resolve() != root / folder / "__init__.py":
        sys.exit(1)
PY
    ) >/dev/null 2>&1
}
imports_here; found=$?
how="tilews was already installed from this checkout"
if [ "$found" -eq 3 ]; then
    python -m pip install -q --no-deps --no-build-isolation --no-index --disable-pip-version-check \
        -e . >/dev/null 2>&1
    imports_here; found=$?
    how="pip install -e . (editable, offline) just now"
fi
if [ "$found" -eq 0 ] && [ -z "${TILEWS_IMPORTS_VIEW:-}" ]; then
    echo "imports: in place; $how"
else
    echo "imports: a symlink view of the checkout"
    view="$(mktemp -d)"
    trap 'rm -rf "$view"' EXIT                        # symlinks only: rm does not follow them
    python - "$view" <<'PY'
import pathlib, sys, tomllib
view, root = pathlib.Path(sys.argv[1]), pathlib.Path.cwd()
dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
moved = {p: f for p, f in dirs.items() if "." in p and f != p.replace(".", "/")}
parents = {p.rsplit(".", 1)[0] for p in moved}         # packages whose folder gains subpackages
for child in root.iterdir():
    if child.name not in parents and child.name != ".git":
        (view / child.name).symlink_to(child)
for parent in parents:
    (view / parent).mkdir()
    for child in (root / dirs.get(parent, parent)).iterdir():
        (view / parent / child.name).symlink_to(child)
for package, folder in moved.items():
    view.joinpath(*package.split(".")).symlink_to(root / folder)
PY
    cd "$view"
    # `python scripts/x.py` puts scripts/, not the working directory, first on sys.path: without
    # this an installed tilews (another checkout's) would be imported instead of the view's
    export PYTHONPATH="$view${PYTHONPATH:+:$PYTHONPATH}"
fi

python -c "import torch, triton; print(f'torch {torch.__version__}, triton {triton.__version__}, cuda available: {torch.cuda.is_available()}')"

if [ -n "${TILEWS_DEVICE_CMD:-}" ]; then     # run something else with the same imports
    eval "$TILEWS_DEVICE_CMD"
    exit $?
fi

if python -c "import pytest" 2>/dev/null; then
    timeout 420 python -m pytest -q -s -p no:cacheprovider tests/gpu tests/test_gluon_compile.py::test_numerics_on_gpu
    tests=$?
    echo "tests/gpu: exit code $tests"
else
    tests=0
    echo "tests/gpu: skipped, pytest is not installed here"
fi

timeout 160 python -m tilews.bench gemm --quick --json "$OUT/bench.json" --csv "$OUT/bench.csv" --plot "$OUT/bench.png" "$@"
bench=$?
[ "$bench" -eq 124 ] && echo "bench: timed out after 160 s"

fp8_limit=$(( 580 - SECONDS ))             # SECONDS: since this script started
[ "$fp8_limit" -gt 150 ] && fp8_limit=150
if [ "$fp8_limit" -ge 30 ]; then
    timeout "$fp8_limit" python -m tilews.bench fp8 --shapes gpu-quick --targets hopper \
        --json "$OUT/fp8.json" --csv "$OUT/fp8.csv" --plot "$OUT/fp8.png"
    fp8=$?
    [ "$fp8" -eq 124 ] && echo "fp8 bench: timed out after $fp8_limit s"
else
    fp8=0
    echo "fp8 bench: skipped, ${fp8_limit} s left of the 10-minute limit (run it alone with" \
         "TILEWS_DEVICE_CMD='python -m tilews.bench fp8 --shapes gpu-quick --targets hopper')"
fi
exit $(( tests != 0 ? tests : bench != 0 ? bench : fp8 ))
