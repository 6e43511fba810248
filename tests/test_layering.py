"""The layering of docs/design.md §1, checked on the import statements of every module.

* ``lowering`` (the IR, frontend, passes, interpreter) imports no backend, no user-facing ``tilews``
  module, and neither Triton nor mlx;
* a Triton backend (``triton_ext/tl``, ``triton_ext/gluon``) imports ``tilews.lowering``, the
  shared modules of ``triton_ext`` (``pysource``, ``modules``, ``toolchain``, ``passes``) and its
  own package — never the other backend, never the ``tilews`` user surface;
* no module outside ``tilews/`` reads a ``TILEWS_*`` environment variable except
  ``lowering/settings.py``;
* on the graph of imports between our modules (function-level imports included: they are how
  cycles hide), the core IR modules reach no frontend and no pass, the emitters reach no pass,
  ``metal``/``triton_ext``/``lowering`` import nothing of the user surface, and no two modules
  import each other, directly or around a longer cycle.
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
           "TILEWS_OVERLAP_SOFTMAX": "on", "TILEWS_OVERLAP_GEMMS": "off",
           "TILEWS_MERGE_RELEASES": "off", "TILEWS_SPLIT_PARTIALS": "off",
           "TILEWS_SUM_PARTIALS": "1", "TILEWS_TAKE_TURNS": "yes", "TILEWS_REDUCE_ROLE": "off",
           "TILEWS_OVERLAP_PROMOTION": "no", "TILEWS_TUNE": "yes",
           "TILELANG_DISABLE_CACHE": "no", "TILEWS_CXX": " clang++ ", "TILEWS_COMPILE_WORKERS": " 3 ",
           "TILEWS_COMPILE_PROCESSES": "on"}
    assert sorted(env) == sorted(name for name, _ in SWITCHES)
    assert Settings.from_env({"TILELANG_DISABLE_CACHE": "1"}).disable_cache
    s = Settings.from_env(env)
    assert (str(s.cache_dir), s.disable_cache, s.print_source, str(s.dump_ir), s.poison_outputs,
            s.debug_frontend, s.overlap_softmax, s.overlap_gemms, s.merge_releases,
            s.split_partials, s.sum_partials, s.take_turns, s.overlap_promotion, s.tune, s.cxx,
            s.compile_workers, s.compile_processes, s.reduce_role) == (
        "/c", True, True, "/d", True, True, True, False, False, False, True, True, False, True,
        "clang++", 3, True, False)
    assert Settings.from_env({}) == Settings()
    for off in ("", "0", "false", "No", "off"):
        assert flag("TILEWS_PRINT_SOURCE", {"TILEWS_PRINT_SOURCE": off}) is False
    with pytest.raises(ValueError, match="TILEWS_DISABLE_CACHE='2'"):
        flag("TILEWS_DISABLE_CACHE", {"TILEWS_DISABLE_CACHE": "2"})
    for bad in ("0", "two", "-1", "1.5"):
        with pytest.raises(ValueError, match=f"TILEWS_COMPILE_WORKERS='{bad}'.*at least 1"):
            Settings.from_env({"TILEWS_COMPILE_WORKERS": bad})


def test_the_readme_documents_every_switch():
    from tilews.lowering.settings import SWITCHES
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Environment switches"):]
    table = table[:table.index("\n## ", 1)] if "\n## " in table[1:] else table
    documented = set(re.findall(r"^\| `((?:TILEWS|TILELANG)_[A-Z_]+)", table, re.M))
    assert documented == {name for name, _ in SWITCHES}


def test_the_checker_sees_relative_imports():
    """The checker itself: a relative import of a backend from lowering would be caught."""
    probe = ROOT / "lowering" / "passes" / "despecialize.py"
    assert "tilews.lowering.ir" in _imports(probe) and "tilews.lowering.errors.CompileError" in _imports(probe)


# ----------------------------------------------------------------------------------------------
# the import graph of every module of lowering, triton_ext, metal, tilews and bench


def _all_modules() -> dict[str, Path]:
    return {_module_name(p): p for folder in PACKAGES for p in _modules(folder)}


MODULES = _all_modules()


def _resolve(name: str) -> str:
    """The module ``name`` lives in (``tilews.lowering.ir.Loc`` -> ``tilews.lowering.ir``);
    "" for a name outside our packages."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of import nodes under ``if TYPE_CHECKING:`` (never executed: no edge)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _edges(path: Path) -> set[str]:
    """The modules of ours that ``path`` imports anywhere (top level or in a function). ``from
    pkg import sub`` is an edge to ``pkg.sub`` when that is a module (not to ``pkg``: a parent
    package's ``__init__`` runs for any submodule, and counting it would tie every module to
    ``tilews/__init__.py``); ``from mod import name`` is an edge to ``mod``."""
    me = _module_name(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {_resolve(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            found |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else _resolve(mod)
                      for a in node.names}
    return found - {"", me}


GRAPH = {m: _edges(p) for m, p in MODULES.items()}


def _reach(start: str) -> dict[str, str]:
    """Every module ``start`` imports, directly or not: module -> the module importing it on one
    path from ``start``."""
    seen, todo = {start: ""}, [start]
    while todo:
        m = todo.pop()
        for n in sorted(GRAPH[m]):
            if n not in seen:
                seen[n] = m
                todo.append(n)
    del seen[start]
    return seen


def _path(reached: dict[str, str], target: str) -> str:
    chain = [target]
    while reached.get(chain[-1]):
        chain.append(reached[chain[-1]])
    return " -> ".join(reversed(chain))


def _cycles() -> list[list[str]]:
    """The strongly connected components of GRAPH with more than one module (Tarjan's
    algorithm, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(GRAPH):
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(GRAPH[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_cycles():
    """No two modules import each other, directly or around a longer cycle."""
    found = [" <-> ".join(c) + "\n    " + "\n    ".join(f"{m} imports {sorted(GRAPH[m] & set(c))}"
                                                      for m in c) for c in _cycles()]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_cycle_check_finds_cycles(monkeypatch):
    """The checker itself: a planted pair, and a planted three-module loop, are found."""
    monkeypatch.setitem(GRAPH, "tilews.lowering.ir", GRAPH["tilews.lowering.ir"] | {"tilews.lowering.printer"})
    assert ["tilews.lowering.ir", "tilews.lowering.printer"] in _cycles()
    monkeypatch.setitem(GRAPH, "tilews.lowering.ir", GRAPH["tilews.lowering.ir"] | {"tilews.lowering.verify"})
    assert any({"tilews.lowering.ir", "tilews.lowering.verify"} <= set(c) for c in _cycles())


def test_the_graph_counts_function_level_imports():
    assert "tilews.lowering.pipeline" in _edges(ROOT / "lowering" / "backend.py")
    # a function-level import: tilews.compiler imports the language package inside a function
    assert "tilews.language" in GRAPH["tilews.compiler"]
    # an import under TYPE_CHECKING runs never: no edge
    assert "tilews.kernel" not in GRAPH["tilews.profiler.profiler"]


# the IR and what every stage shares: no frontend, no pass, reached in any number of steps
CORE = ("ir", "dtypes", "loc", "errors", "printer", "verify", "plans", "traverse", "simplify",
        "layouts", "capabilities", "config", "pipeline", "digest", "settings", "arguments")


@pytest.mark.parametrize("name", CORE)
def test_the_core_ir_reaches_no_frontend_and_no_pass(name):
    reached = _reach(f"tilews.lowering.{name}")
    bad = [_path(reached, m) for m in reached
           if m.startswith(("tilews.lowering.frontend", "tilews.lowering.passes"))]
    assert not bad, "\n".join(bad)


EMITTERS = ("tilews.triton_ext.tl.emit", "tilews.triton_ext.gluon.emit", "tilews.metal.emit")


@pytest.mark.parametrize("emitter", EMITTERS)
def test_an_emitter_reaches_no_pass(emitter):
    """An emitter (and the helper modules it imports) spells what passes decided: it runs none."""
    reached = _reach(emitter)
    bad = [_path(reached, m) for m in reached if m.startswith("tilews.lowering.passes")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folder", ["lowering", "triton_ext", "metal"])
def test_the_compiler_imports_nothing_of_the_user_surface(folder):
    """lowering, triton_ext and metal import only each other (never tilews.cache, tilews.jit,
    ...): what they need from outside comes in Services."""
    ours = ("tilews.lowering", "tilews.triton_ext", "tilews.metal")
    for path in _modules(folder):
        bad = {m for m in _edges(path) if not m.startswith(ours)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
