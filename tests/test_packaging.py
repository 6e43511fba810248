"""A plain (non-editable) wheel installs lowering/, triton_ext/, metal/ and bench/ under the tilews
namespace, and nothing else top-level."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# source folder -> installed package prefix (pyproject.toml [tool.setuptools.package-dir])
PACKAGE_DIRS = {"tilews": "tilews", "lowering": "tilews/lowering", "triton_ext": "tilews/triton_ext",
                "metal": "tilews/metal", "bench": "tilews/bench"}
REQUIRED = ["tilews/__init__.py", "tilews/language/__init__.py", "tilews/cache.py",
            "tilews/lowering/__init__.py", "tilews/lowering/frontend/__init__.py",
            "tilews/lowering/passes/__init__.py", "tilews/lowering/interpreter/__init__.py",
            "tilews/triton_ext/__init__.py", "tilews/triton_ext/tl/__init__.py",
            "tilews/metal/__init__.py", "tilews/bench/__init__.py", "tilews/bench/__main__.py",
            "tilews/bench/cli.py"]
BUILD_JUNK = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".hypothesis", ".venv", "venv")


def _run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _expected_wheel_files() -> set[str]:
    """Every source package in the repo (a folder with __init__.py) must be in the wheel."""
    expected = set(REQUIRED)
    for src, dest in PACKAGE_DIRS.items():
        for init in (REPO / src).rglob("__init__.py"):
            expected.add(f"{dest}/{init.relative_to(REPO / src).as_posix()}")
    return expected


@pytest.mark.slow
def test_wheel_installs_under_tilews_namespace(tmp_path):
    # Build from a copy so the build/ and egg-info folders never land in (or race in) the work tree.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=BUILD_JUNK)
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src))
    (wheel,) = wheels.glob("tilews-0.1.0-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = zf.read(metadata).decode()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = zf.read(entry_points).decode()
    missing = sorted(_expected_wheel_files() - names)
    assert not missing, f"missing from the wheel (add them to pyproject.toml packages): {missing}"
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    # bench/ once installed as a top-level ``bench``: a name any environment may already have.
    assert top_level == {"tilews"}, f"only tilews may install top-level: {top_level}"
    assert re.search(r"^Requires-Dist: triton==3\.6\.0 *; *sys_platform == ['\"]linux['\"]$", meta, re.M), meta
    assert re.search(r"^tilews-bench *= *tilews\.bench\.cli:main$", scripts, re.M), scripts

    site = tmp_path / "site"
    _run(sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel))
    moved = ("lowering", "triton_ext", "metal", "bench")
    code = "import importlib\n" + "".join(
        f"print(importlib.import_module('tilews.{name}').__file__)\n" for name in moved)
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = _run(sys.executable, "-c", code, cwd=tmp_path, env=env).stdout.split()
    assert [pathlib.Path(f).resolve() for f in out] == [
        (site / "tilews" / name / "__init__.py").resolve() for name in moved]
    # python -m tilews.bench runs from the installed wheel (bench/ imports itself relatively)
    out = _run(sys.executable, "-m", "tilews.bench", "--help", cwd=tmp_path, env=env).stdout
    assert "tilews-bench" in out, out
