#!/usr/bin/env bash
# One command for the device tool (a GPU machine with torch and triton, nothing installable):
#     bash scripts/device_run.sh [more bench options, e.g. --quick or --shapes square]
# Runs tests/gpu, then the GEMM bench; the bench's table is printed last. Files go to $OUT (the
# device tool sets it; /tmp/out otherwise). Time limits keep the whole run well under 8 minutes.
#
# tilews is not installed there, and PYTHONPATH=$PWD is not enough: pyproject.toml installs
# lowering/, triton_ext/ and metal/ as tilews.lowering, ... ([tool.setuptools.package-dir]). So the
# run happens in a scratch view of this checkout, made of symlinks, with that layout.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
view="$(mktemp -d)"
trap 'rm -rf "$view"' EXIT                            # symlinks only: rm does not follow them
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

python -c "import torch, triton; print(f'torch {torch.__version__}, triton {triton.__version__}, cuda available: {torch.cuda.is_available()}')"

if [ -n "${TILEWS_DEVICE_CMD:-}" ]; then     # run something else in the same importable view
    eval "$TILEWS_DEVICE_CMD"
    exit $?
fi

if python -c "import pytest" 2>/dev/null; then
    timeout 330 python -m pytest -q -s -p no:cacheprovider tests/gpu tests/test_gluon_compile.py::test_numerics_on_gpu
    tests=$?
    echo "tests/gpu: exit code $tests"
else
    tests=0
    echo "tests/gpu: skipped, pytest is not installed here"
fi

timeout 270 python -m bench gemm --json "$OUT/bench.json" --csv "$OUT/bench.csv" --plot "$OUT/bench.png" "$@"
bench=$?
[ "$bench" -eq 124 ] && echo "bench: timed out after 270 s"
exit $(( tests != 0 ? tests : bench ))
