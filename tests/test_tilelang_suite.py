"""scripts/tilelang_imports.py (the import rewrite TileLang programs run on tilews with) and
scripts/tilelang_suite.py (TileLang's example tests under pytest): the rewrite as text and as
executed imports, the junit XML reading, the commands and environments a run uses, and one real
pytest run of a small test file through the CPU plugin, a failure, a skip and a timeout."""
from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import tilelang_imports  # noqa: E402
import tilelang_suite  # noqa: E402
from tilelang_imports import rewrite, rewrite_line  # noqa: E402


@pytest.mark.parametrize("line, expected", [
    ("import tilelang", "import tilews as tilelang"),
    ("import tilelang as tl", "import tilews as tl"),
    ("import tilelang.language as T", "import tilews.language as T"),
    ("import tilelang.testing", "import tilews.testing, tilews as tilelang"),
    ("import tilelang  # noqa: F401", "import tilews as tilelang  # noqa: F401"),
    ("import torch, tilelang", "import torch, tilews as tilelang"),
    ("from tilelang.profiler import do_bench", "from tilews.profiler import do_bench"),
    ("from tilelang import tvm as tvm", "from tilews import tvm as tvm"),
    ("from tilelang.autotuner import *", "from tilews.autotuner import *"),
    ("from tvm import DataType", "from tilews.tvm import DataType"),
    ("from tvm.tirx import IntImm", "from tilews.tvm.tirx import IntImm"),
    ("import tvm", "import tilews.tvm as tvm"),
    ("import tvm.tirx", "import tilews.tvm.tirx, tilews.tvm as tvm"),
    ("    import tilelang.language as T", "    import tilews.language as T"),
])
def test_rewrite_line_changes_imports_of_tilelang_and_tvm(line, expected):
    assert rewrite_line(line) == expected


@pytest.mark.parametrize("line", [
    "import torch", "import tvm_ffi", "import tilelang_extras", "from tilelang_extras import x",
    "from . import tilelang", "x = tilelang.language.float16", "# import tilelang.testing",
    "print('import tilelang')",
])
def test_rewrite_line_leaves_other_lines_alone(line):
    assert rewrite_line(line) == line


def test_rewrite_line_refuses_an_import_it_cannot_rewrite_whole():
    with pytest.raises(ValueError, match="cannot rewrite 'import tilelang; import torch'"):
        rewrite_line("import tilelang; import torch")


SOURCE = textwrap.dedent("""\
    import tilelang.testing
    import tilelang.language as T
    from tilelang.testing import (
        rel_err,
        poison_,
    )


    def inner():
        import tilelang
        from tilelang import language
        return tilelang, language
    """)


def test_rewrite_runs_as_tilews_imports_with_the_names_tilelang_programs_use():
    """Executed: ``tilelang.testing`` is ``tilews.testing``, the parenthesized import and the
    imports inside a function work, and only the import lines changed."""
    import tilews
    import tilews.language
    import tilews.testing
    text, changed = rewrite(SOURCE)
    assert changed == [
        ("import tilelang.testing", "import tilews.testing, tilews as tilelang"),
        ("import tilelang.language as T", "import tilews.language as T"),
        ("from tilelang.testing import (", "from tilews.testing import ("),
        ("import tilelang", "import tilews as tilelang"),
        ("from tilelang import language", "from tilews import language"),
    ]
    assert len(text.splitlines()) == len(SOURCE.splitlines())
    names = {}
    exec(compile(text, "example.py", "exec"), names)
    assert names["tilelang"] is tilews and names["tilelang"].testing is tilews.testing
    assert names["T"] is tilews.language
    assert names["rel_err"] is tilews.testing.rel_err and names["poison_"] is tilews.testing.poison_
    assert names["inner"]() == (tilews, tilews.language)


def test_rewrite_keeps_line_endings():
    assert rewrite("import tilelang\r\nx = 1\r\n")[0] == "import tilews as tilelang\r\nx = 1\r\n"


# ---- junit XML ---------------------------------------------------------------------------------

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
errors="1" failures="3" skipped="1" tests="6">
<testcase classname="test_a" name="test_pass" time="0.000" />
<testcase classname="test_a" name="test_close" time="0.001"><failure message="AssertionError: Tensor-likes
are not close!&#10;&#10;Mismatched elements: 3 / 16">def test_close():
&gt;       torch.testing.assert_close(c, ref)
E       AssertionError: Tensor-likes are not close!
E
E       Mismatched elements: 3 / 16 (18.8%)

test_a.py:5: AssertionError</failure></testcase>
<testcase classname="test_a" name="test_chained" time="0.000"><failure message="RuntimeError: wrapped">
    def inner():
&gt;       raise AttributeError("module 'tilews.language' has no attribute 'foo'\\nsecond line")
E       AttributeError: module 'tilews.language' has no attribute 'foo'
E       second line

test_a.py:8: AttributeError

The above exception was the direct cause of the following exception:

&gt;           raise RuntimeError("wrapped") from e
E           RuntimeError: wrapped

test_a.py:12: RuntimeError</failure></testcase>
<testcase classname="test_a" name="test_assert" time="0.000"><failure message="assert 1 == 2">
&gt;       assert x == 2
E       assert 1 == 2

test_a.py:5: AssertionError</failure></testcase>
<testcase classname="test_a" name="test_skip" time="0.000"><skipped type="pytest.skip"
message="needs sm90">/x/test_a.py:13: needs sm90</skipped></testcase>
<testcase time="0.000" />
<testcase classname="" name="test_b" time="0.000"><error message="collection failure">ImportError while
importing test module '/x/test_b.py'.
Traceback:
test_b.py:1: in &lt;module&gt;
    import example_b
E   ModuleNotFoundError: No module named 'tilews.utils'</error></testcase>
</testsuite></testsuites>"""


def test_parse_junit_gives_each_test_its_status_and_first_error():
    tests = {t["name"]: (t["status"], t["error"], t["collection"])
             for t in tilelang_suite.parse_junit(JUNIT)}
    assert tests == {
        "test_pass": ("pass", "", False),
        "test_close": ("fail", "AssertionError: Tensor-likes are not close!", False),
        "test_chained": ("fail", "RuntimeError: wrapped", False),
        "test_assert": ("fail", "AssertionError: assert 1 == 2", False),
        "test_skip": ("skip", "needs sm90", False),
        "test_b": ("error", "ModuleNotFoundError: No module named 'tilews.utils'", True),
    }


def test_first_error_without_pytest_e_lines():
    text = ('Traceback (most recent call last):\n  File "x.py", line 1\n'
            'tilews.errors.CompileError: x.py:3: T.foo is not supported\n')
    assert tilelang_suite.first_error(text) == "tilews.errors.CompileError: x.py:3: T.foo is not supported"
    assert tilelang_suite.first_error("", "Segfault\nmore") == "Segfault"


def test_complete_marks_unreported_tests_by_how_the_file_ended():
    collection = tilelang_suite.parse_junit(JUNIT)[-1:]
    tests = tilelang_suite.complete(collection, ["test_1", "test_2"], False, 60, "pytest exit 1")
    assert [(t["name"], t["status"], t["error"]) for t in tests] == [
        ("test_1", "error", "ModuleNotFoundError: No module named 'tilews.utils'"),
        ("test_2", "error", "ModuleNotFoundError: No module named 'tilews.utils'")]
    passed = [{"name": "test_1", "status": "pass", "error": "", "collection": False}]
    tests = tilelang_suite.complete(passed, ["test_1", "test_2"], True, 60, "pytest exit 2")
    assert [(t["name"], t["status"], t["error"]) for t in tests] == [
        ("test_1", "pass", ""), ("test_2", "timeout", "timed out after 60 s")]


# ---- what a run runs ---------------------------------------------------------------------------

def test_commands_and_environments(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    junit = tmp_path / "j.xml"
    assert tilelang_suite.pytest_command(junit, cpu=False) == [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    assert tilelang_suite.pytest_command(junit, cpu=True)[6:8] == ["-p", "suite_cpu_plugin"]
    # the peer: TileLang from /tmp/site, nothing of this checkout
    assert tilelang_suite.environment("tilelang", cpu=False)["PYTHONPATH"] == "/tmp/site"
    assert tilelang_suite.environment("tilews", cpu=False)["PYTHONPATH"] == f"{tmp_path}:/elsewhere"
    cpu = tilelang_suite.environment("tilews", cpu=True)
    assert cpu["PYTHONPATH"] == f"{tmp_path}:{SCRIPTS}:/elsewhere"
    assert tilelang_suite.environment("tilews", cpu=False)["PYTHONPATH"] == \
        tilelang_imports.tilews_pythonpath()


def test_stand_ins_go_last_on_the_path_only_where_the_reference_is_missing(monkeypatch):
    """A process that cannot import ``flash_attn`` gets ``suite_stubs/`` last on its path, whose
    ``flash_attn`` then imports (and says it is the stand-in); the summary's note names it."""
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("the real flash_attn is installed here")
    env = tilelang_suite.environment("tilelang", cpu=False)          # /tmp/site: no flash_attn
    missing = tilelang_suite.missing_references(env)
    assert missing == ["flash_attn"]
    stubbed = tilelang_suite.with_stand_ins(env, missing)
    assert stubbed["PYTHONPATH"] == f"/tmp/site:{tilelang_suite.STUBS}"
    assert tilelang_suite.missing_references(stubbed) == []
    assert tilelang_suite.with_stand_ins(env, []) is env
    note = tilelang_suite.stand_in_note({"tilews": ["flash_attn"], "tilelang": ["flash_attn"]})
    assert note.startswith("note: flash_attn is this repo's float32 torch stand-in (") and \
        "not the real package, for tilews and TileLang" in note
    assert tilelang_suite.stand_in_note({"tilews": []}) == ""


def _store(tmp_path, monkeypatch, files: dict[str, str]) -> Path:
    store = tmp_path / "store"
    for path, text in files.items():
        (store / "original" / path).parent.mkdir(parents=True, exist_ok=True)
        (store / "original" / path).write_text(text)
    monkeypatch.setattr(tilelang_suite, "STORE", store)
    return store


def test_select_files_by_directory_or_substring(tmp_path, monkeypatch):
    _store(tmp_path, monkeypatch, {f"{d}/test_{d}.py": "" for d in ("gemm", "gemm_fp8", "cast")})
    assert tilelang_suite.select_files(["gemm"]) == [("gemm", "test_gemm.py")]
    assert tilelang_suite.select_files(["fp8", "cast"]) == [("cast", "test_cast.py"),
                                                             ("gemm_fp8", "test_gemm_fp8.py")]
    assert len(tilelang_suite.select_files([])) == 3


def test_table_and_totals_with_the_peer():
    files = [{"dir": "cast", "file": "t.py", "runtime": "tilews",
              "tests": [{"name": "test_a", "status": "fail", "error": "KeyError: 'a|b'"}]},
             {"dir": "cast", "file": "t.py", "runtime": "tilelang",
              "tests": [{"name": "test_a", "status": "pass", "error": ""}]}]
    assert tilelang_suite.table(files, ("tilews", "tilelang")).splitlines() == [
        "| dir | test | tilews | first error (tilews) | TileLang | first error (TileLang) |",
        "|---|---|---|---|---|---|",
        "| cast | test_a | fail | KeyError: 'a\\|b' | pass |  |"]
    assert tilelang_suite.totals(files, "tilelang") == "TileLang: 1 passed, 0 failed, 0 skipped of 1"
    files[0]["tests"] += [{"name": "test_b", "status": "error", "error": "ImportError: x"},
                          {"name": "test_c", "status": "timeout", "error": "timed out after 9 s"}]
    assert tilelang_suite.totals(files, "tilews") == \
        "tilews: 0 passed, 1 failed, 0 skipped of 3 (1 error, 1 timeout)"


TEST_FILE = '''\
import time
import pytest
import torch
import tilelang.testing
import tilelang.language as T
import tilews.targets


def test_cuda_becomes_cpu():
    x = torch.randn(4, 4, device="cuda").cuda().to("cuda:0")
    y = torch.zeros(4, device=torch.device("cuda")).to(torch.device("cuda"), torch.float64)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); end.record(); torch.cuda.synchronize()
    assert x.device.type == y.device.type == "cpu" and start.elapsed_time(end) >= 0
    assert torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    assert tilews.targets.resolve("auto")[0] == "interpret"
    assert tilelang.testing.rel_err(x, x) == 0


def test_missing_name():
    T.no_such_name


@pytest.mark.skip(reason="needs sm100")
def test_skipped():
    pass


def test_slow():
    time.sleep(60)


def test_after_slow():
    pass
'''


@pytest.mark.slow
def test_run_file_through_the_cpu_plugin_with_a_timeout(tmp_path, monkeypatch):
    """One real pytest process on a rewritten file: CUDA tensors on the CPU, a missing name, a
    skip, and a file cut off at its timeout (the tests done before it are kept)."""
    monkeypatch.chdir(SCRIPTS.parent)
    monkeypatch.setattr(tilelang_suite, "INTERRUPT_GRACE_S", 10)
    _store(tmp_path, monkeypatch, {"d/test_x.py": TEST_FILE, "conftest.py": "",
                                           "pytest.ini": "[pytest]\n"})
    monkeypatch.setattr(tilelang_suite, "SETUP", ("conftest.py", "pytest.ini"))
    changed = tilelang_suite.write_tilews_copy(["d"])
    assert changed["d/test_x.py"][0] == ("import tilelang.testing",
                                         "import tilews.testing, tilews as tilelang")
    env = tilelang_suite.environment("tilews", cpu=True)
    result = tilelang_suite.run_file("d", "test_x.py", "tilews", env, 12, True, tmp_path / "logs")
    assert result["timed_out"]
    assert [(t["name"], t["status"], t["error"]) for t in result["tests"]] == [
        ("test_cuda_becomes_cpu", "pass", ""),
        ("test_missing_name", "fail",
         "AttributeError: module 'tilews.language' has no attribute 'no_such_name'"),
        ("test_skipped", "skip", "needs sm100"),
        ("test_slow", "timeout", "timed out after 12 s"),
        ("test_after_slow", "timeout", "timed out after 12 s")]
    assert "1 failed, 1 passed, 1 skipped" in (tmp_path / "logs/d/test_x.py.tilews.log").read_text()
