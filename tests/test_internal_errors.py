"""A bug in tilews reaches the user as ``tilews.InternalError`` (docs/design.md §7, "Errors").

Bugs are planted by monkeypatching: an emitter rule that writes an invalid expression (Triton
fails on the generated code at the first launch, under its CPU interpreter here), a pass helper
that raises a plain ``KeyError``, a backend's lowering that raises an ``InternalError``. Each
test checks the class the user catches (not a ``CompileError``, not Triton's), the user's line
and the words "bug in tilews" in the message, and the reproducer folder it names.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

import tilews
import tilews.language as T
from tilews import compiler
from tilews.lowering import ir
from tilews.lowering.errors import InternalError, ResourceLimitError

from .helpers import marked_line

tl_emit = importlib.import_module("tilews.triton_ext.tl.emit")   # the package exports emit()


def doubler(N, block=32):
    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), Y: T.Tensor((N,), T.float32)):
        with T.Kernel(T.ceildiv(N, block), threads=32) as bx:
            for i in T.Parallel(block):   # <- the loop
                Y[bx * block + i] = X[bx * block + i] * 2.0   # <- the statement
    return main


LINE = marked_line(doubler, "# <- the statement")
LOOP = marked_line(doubler, "# <- the loop")


@pytest.fixture(autouse=True)
def fresh_cache_keys(monkeypatch, request):
    """A planted bug is not part of the disk-cache key: give each test its own keys."""
    monkeypatch.setattr(compiler, "sources_digest", lambda: f"planted-{request.node.name}")


def reproducer(e: InternalError) -> Path:
    m = re.search(r"reproducer written to (\S+)", str(e))
    assert m, str(e)
    folder = Path(m.group(1))
    assert folder.is_dir() and str(folder) == e.reproducer
    return folder


def assert_reports_a_bug(e: pytest.ExceptionInfo, line: int = LINE) -> str:
    """The checks every planted bug shares; the message."""
    assert type(e.value) is tilews.InternalError
    assert not isinstance(e.value, tilews.CompileError)
    # nothing of Triton's (or the original Python error) is what the user sees or catches
    assert not any(c.__module__.startswith("triton") for c in type(e.value).__mro__)
    assert e.value.__cause__ is None and e.value.__suppress_context__
    text = str(e.value)
    assert text.startswith(f"{__file__}:{line}:"), text
    assert "this is a bug in tilews, not in your program; please report it" in text
    assert "Traceback" not in text
    return text


def test_internal_error_is_not_a_compile_error():
    assert tilews.InternalError is InternalError
    assert not issubclass(InternalError, tilews.CompileError)
    e = InternalError("no rule for X", ir.Loc(__file__, LINE, 4), ["a note"])
    assert str(e).splitlines()[0] == f"{__file__}:{LINE}:4: internal error: no rule for X"
    assert "note: a note" in str(e) and "bug in tilews" in str(e)


def test_triton_failing_on_generated_code_is_an_internal_error(monkeypatch):
    """The tl emitter writes an expression Triton has no such function for: Triton (its CPU
    interpreter here; its JIT compiler on a GPU) fails at the first launch."""
    rule = tl_emit._STMTS[ir.Parallel]

    def planted(ctx, s):
        rule(ctx, s)
        ctx.line("tl.tilews_planted_bug(0)")
    monkeypatch.setitem(tl_emit._STMTS, ir.Parallel, planted)
    kernel = tilews.jit(out_idx=[-1], target="triton")(doubler)(64)
    for _ in range(2):   # every launch, not only the first, reports it so
        with pytest.raises(tilews.InternalError) as e:
            kernel(torch.randn(64))
        text = assert_reports_a_bug(e)
        assert "launching" in text and "(backend tl)" in text and "tilews_planted_bug" in text
    folder = reproducer(e.value)
    assert folder.parent.parent == tilews.cache.default_cache_dir()   # under the cache dir
    assert sorted(p.name for p in folder.iterdir()) == ["error.txt", "frontend.tir", "generated.py",
                                                        "lowered.tir"]
    assert (folder / "frontend.tir").read_text() == kernel.ir_text("before")
    assert (folder / "lowered.tir").read_text() == kernel.ir_text("after")
    assert (folder / "generated.py").read_text() == kernel.get_kernel_source()
    assert "tl.tilews_planted_bug(0)" in kernel.get_kernel_source()
    error = (folder / "error.txt").read_text()
    assert error.startswith(str(e.value)) and "AttributeError" in error and "Traceback" in error


@pytest.fixture
def key_error_in_legalize(monkeypatch):
    """A plain ``KeyError`` planted inside a pass (legalize's decision for one statement)."""
    from tilews.lowering.passes import legalize

    def planted(s, env):
        raise KeyError("planted")
    monkeypatch.setattr(legalize, "_mask_low", planted)


def test_a_pass_raising_a_python_error_is_an_internal_error(key_error_in_legalize):
    with pytest.raises(tilews.InternalError) as e:
        tilews.jit(out_idx=[-1], target="interpret")(doubler)(64)
    text = assert_reports_a_bug(e, LOOP)   # the statement legalize was deciding
    assert "lowering kernel 'main' for target 'interpret' (backend interpret) failed: KeyError: " \
           "'planted'" in text
    folder = reproducer(e.value)
    # lowering did not finish: the frontend IR is all there is
    assert sorted(p.name for p in folder.iterdir()) == ["error.txt", "frontend.tir"]
    assert "parallel i < 32" in (folder / "frontend.tir").read_text()
    assert "KeyError: 'planted'" in (folder / "error.txt").read_text()


def test_without_the_disk_cache_the_reproducer_goes_to_a_temporary_folder(key_error_in_legalize,
                                                                         monkeypatch):
    import tempfile
    monkeypatch.setenv("TILEWS_DISABLE_CACHE", "1")
    with pytest.raises(tilews.InternalError) as e:
        tilews.jit(out_idx=[-1], target="interpret")(doubler)(64)
    folder = reproducer(e.value)
    assert folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith("tilews-internal-error-main-")
    assert (folder / "frontend.tir").is_file()


def test_the_hopper_chain_reports_an_internal_error_of_gluon_as_one(monkeypatch):
    """An InternalError in gluon's lowering is not a refusal: tl is not tried, and the message
    does not say gluon refused the program."""
    from tilews.triton_ext.gluon.backend import GluonBackend

    def planted(self, kernel, observe=None):
        stmt = next(s for s in ir_walk(kernel) if isinstance(s, ir.Parallel))
        raise InternalError("gluon backend: planted, no rule for Parallel", stmt.loc)
    monkeypatch.setattr(GluonBackend, "lower", planted)
    with pytest.raises(tilews.InternalError) as e:
        tilews.jit(out_idx=[-1], target="hopper")(doubler)(64)
    text = assert_reports_a_bug(e, LOOP)   # where the planted error says
    assert "lowering kernel 'main' for target 'hopper' (backend gluon) failed: gluon backend: " \
           "planted, no rule for Parallel" in text
    assert "refuse" not in text and "tl backend" not in text
    assert sorted(p.name for p in reproducer(e.value).iterdir()) == ["error.txt", "frontend.tir"]


def test_the_hopper_chain_does_not_relabel_a_fallback_bug_as_a_refusal(monkeypatch):
    """gluon refuses an element-wise program (no matrix product) and tl takes it; a bug in tl's
    emitter then is an InternalError, not "gluon refused ...; and tl cannot compile it either"."""
    def planted(ctx, s):
        raise KeyError("planted")
    monkeypatch.setitem(tl_emit._STMTS, ir.Parallel, planted)
    with pytest.raises(tilews.InternalError) as e:
        tilews.jit(out_idx=[-1], target="hopper")(doubler)(64)
    text = assert_reports_a_bug(e, LOOP)   # the statement the emitter was spelling
    assert "emitting kernel 'main' for target 'hopper' (backend tl) failed: KeyError: 'planted'" in text
    assert "refused" not in text and "cannot compile it either" not in text
    folder = reproducer(e.value)
    assert sorted(p.name for p in folder.iterdir()) == ["error.txt", "frontend.tir", "lowered.tir"]


def test_a_user_error_stays_a_compile_error():
    """The guard passes a CompileError (the user's program) through unchanged."""
    def bad(N):
        @T.prim_func
        def main(X: T.Tensor((N,), T.float32)):
            with T.Kernel(1, threads=32):
                T.copy(X, X, barrier=3)
        return main
    with pytest.raises(tilews.CompileError) as e:
        tilews.jit(target="interpret")(bad)(64)
    assert not isinstance(e.value, tilews.InternalError) and "bug in tilews" not in str(e.value)


def ir_walk(kernel: ir.Kernel):
    from tilews.lowering.traverse import walk
    return walk(kernel.body)


# ----------------------------------------------------------------------------------------------
# on a GPU, Triton's JIT compiles the tl program at its first launch: a CompilationError there is
# located through the generated line. Triton compiles for sm_90 without a GPU, but only outside
# its CPU interpreter, so this runs in its own process: python -m tests.test_internal_errors


def test_a_triton_compilation_error_names_the_users_line():
    import os
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-m", "tests.test_internal_errors"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.splitlines()[-1] == f"located at line {LINE}"


def _compile_planted_for_gpu() -> None:
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tilews.lowering.frontend import build_kernel
    from tilews.lowering.pipeline import lower
    from tilews.lowering.settings import Settings
    from tilews.triton_ext.tl.backend import TRITON_GPU
    from tilews.reproducer import Attempt

    from .helpers import services
    before = build_kernel(doubler(64))
    lowered = lower(before, TRITON_GPU)
    rule = tl_emit._STMTS[ir.Parallel]

    def planted(ctx, s):
        rule(ctx, s)
        ctx.line("tl.tilews_planted_bug(0)")
    tl_emit._STMTS[ir.Parallel] = planted
    source = tl_emit.emit(lowered)
    loader = importlib.util.spec_from_file_location("planted", services().store.source_file(source))
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    signature = {"X": "*fp32", "X_stride0": "i32", "Y": "*fp32", "Y_stride0": "i32"}
    try:
        triton.compile(ASTSource(triton.jit(module.main), signature, {}), target=GPUTarget("cuda", 90, 32))
    except Exception as e:
        assert type(e).__name__ == "CompilationError", repr(e)
        attempt = Attempt(before, "tl", "triton", Settings.from_env())
        attempt.lowered, attempt.source = lowered, source
        error = attempt.internal(e)
        assert Path(error.reproducer, "generated.py").read_text() == source
        print(error)
        print(f"located at line {error.loc.line}")
        return
    raise AssertionError("Triton compiled the planted source")


if __name__ == "__main__":
    _compile_planted_for_gpu()


def test_a_program_the_gpu_cannot_hold_is_a_resource_limit_at_the_kernels_line(monkeypatch):
    """Triton refusing to launch the tl program for want of shared memory (the program's tiles
    times its stages; Triton's ``OutOfResources``) is the program's demand: a ResourceLimitError
    at the kernel's line saying what it needs and what the GPU has, not a bug in tilews."""
    from triton.runtime.errors import OutOfResources

    from tilews.triton_ext.tl.launch import TlProgram

    def too_big(self, values):
        raise OutOfResources(245760, 232448, "shared memory")
    monkeypatch.setattr(TlProgram, "launch", too_big)
    kernel = tilews.jit(out_idx=[-1], target="triton")(doubler)(64)
    with pytest.raises(tilews.CompileError) as e:
        kernel(torch.randn(64))
    assert isinstance(e.value, ResourceLimitError) and not isinstance(e.value, tilews.InternalError)
    assert e.value.loc.line == marked_line(doubler, "with T.Kernel")
    assert "the tl backend's program needs 245760 bytes of shared memory; the GPU has 232448" \
           in str(e.value) and "bug in tilews" not in str(e.value)
