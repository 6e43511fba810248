"""The layering of docs/design.md §1, checked on the import statements of every module.

* ``lowering`` (the IR, frontend, passes, interpreter) imports no backend, no user-facing ``tilews``
  module, and neither Triton nor mlx;
* a Triton backend (``triton_ext/tl``, ``triton_ext/gluon``) imports ``tilews.lowering``, the
  shared modules of ``triton_ext`` (``pysource``, ``modules``, ``toolchain``, ``passes``) and its
  own package — never the other backend, never the ``tilews`` user surface;
* no module outside ``tilews/`` reads a ``TILEWS_*`` environment variable except
  ``lowering/settings.py``.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"lowering": "tilews.lowering", "triton_ext": "tilews.triton_ext", "metal": "tilews.metal",
            "tilews": "tilews", "bench": "tilews.bench"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    parts[0] = PACKAGES[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of everything ``path`` imports (relative imports resolved)."""
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}
    return found


def _modules(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", _modules("lowering"), ids=lambda p: str(p.relative_to(ROOT)))
def test_lowering_imports_no_backend(path):
    bad = {m for m in _imports(path)
           if m.split(".")[0] in ("triton", "mlx")
           or m.startswith(("tilews.triton_ext", "tilews.metal", "tilews.bench"))
           or (m.startswith("tilews.") and not m.startswith("tilews.lowering")) or m == "tilews"}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


SHARED = ("tilews.triton_ext.pysource", "tilews.triton_ext.modules", "tilews.triton_ext.toolchain",
          "tilews.triton_ext.launcher",
          "tilews.triton_ext.passes")


@pytest.mark.parametrize("backend", ["tl", "gluon"])
def test_a_backend_imports_lowering_and_its_own_package_only(backend):
    own = f"tilews.triton_ext.{backend}"
    for path in _modules(f"triton_ext/{backend}"):
        bad = {m for m in _imports(path) if m.startswith("tilews") and not
               (m.startswith(("tilews.lowering", own)) or m.startswith(SHARED) or m == "tilews.triton_ext")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_shared_triton_modules_import_no_backend():
    for path in (ROOT / "triton_ext").glob("*.py"):
        bad = {m for m in _imports(path) if m.startswith("tilews") and not
               (m.startswith("tilews.lowering") or m.startswith(SHARED))}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_only_the_settings_module_reads_tilews_switches():
    readers = []
    for folder in ("lowering", "triton_ext", "metal", "tilews", "bench"):
        for path in _modules(folder):
            if re.search(r"""(environ(\.get)?\s*[\[(]|getenv\()\s*["']TILEWS_""", path.read_text()):
                readers.append(str(path.relative_to(ROOT)))
    assert readers == [], readers
    from tilews.lowering.settings import SWITCHES, Settings, flag
    env = {"TILEWS_CACHE_DIR": "/c", "TILEWS_DISABLE_CACHE": "yes", "TILEWS_PRINT_SOURCE": "On",
           "TILEWS_DUMP_IR": "/d", "TILEWS_POISON_OUTPUTS": " 1 ", "TILEWS_DEBUG_FRONTEND": "true",
           "TILEWS_OVERLAP_SOFTMAX": "on", "TILEWS_TUNE": "yes", "TILELANG_DISABLE_CACHE": "no",
           "TILEWS_CXX": " clang++ "}
    assert sorted(env) == sorted(name for name, _ in SWITCHES)
    assert Settings.from_env({"TILELANG_DISABLE_CACHE": "1"}).disable_cache
    s = Settings.from_env(env)
    assert (str(s.cache_dir), s.disable_cache, s.print_source, str(s.dump_ir), s.poison_outputs,
            s.debug_frontend, s.overlap_softmax, s.tune, s.cxx) == ("/c", True, True, "/d", True, True, True,
                                                                    True, "clang++")
    assert Settings.from_env({}) == Settings()
    for off in ("", "0", "false", "No", "off"):
        assert flag("TILEWS_PRINT_SOURCE", {"TILEWS_PRINT_SOURCE": off}) is False
    with pytest.raises(ValueError, match="TILEWS_DISABLE_CACHE='2'"):
        flag("TILEWS_DISABLE_CACHE", {"TILEWS_DISABLE_CACHE": "2"})


def test_the_readme_documents_every_switch():
    from tilews.lowering.settings import SWITCHES
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Environment switches"):]
    table = table[:table.index("\n## ", 1)] if "\n## " in table[1:] else table
    documented = set(re.findall(r"^\| `((?:TILEWS|TILELANG)_[A-Z_]+)", table, re.M))
    assert documented == {name for name, _ in SWITCHES}


def test_the_checker_sees_relative_imports():
    """The checker itself: a relative import of a backend from lowering would be caught."""
    probe = ROOT / "lowering" / "passes" / "legalize.py"
    assert "tilews.lowering.ir" in _imports(probe) and "tilews.lowering.errors.CompileError" in _imports(probe)


def test_the_metal_emitter_imports_no_pass():
    """The Metal backend spells the plans lowering made (``lowering/plans.py``): no module of it
    imports a pass (``tilews.lowering.passes``) to recompute a decision or a check."""
    modules = _modules("metal")
    assert {p.name for p in modules} >= {"emit.py", "exprs.py", "context.py"}
    for path in modules:
        bad = {m for m in _imports(path) if m.startswith("tilews.lowering.passes")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
