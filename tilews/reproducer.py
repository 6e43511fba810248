"""Compiler bugs reach the user as an ``InternalError`` with a reproducer (docs/design.md §7).

``tilews.compiler`` runs each backend's ``lower``/``refuses``/``emit`` and its ``load`` inside
``Attempt.guard``, and every launch of the loaded program through ``Attempt.guard_launch``:

* a ``CompileError`` (the user's program cannot be compiled) passes through unchanged, and so
  does a ``CacheLockTimeout`` (another process holds the disk cache: not a bug);
* an ``InternalError`` raised by a pass or emitter, and any foreign exception (a ``KeyError`` in a
  pass, a numpy error, Triton's ``CompilationError``, ptxas) becomes an ``InternalError`` that says
  it is a bug in tilews, names the user's line where it can be found and the folder of a
  reproducer, raised ``from None`` (the original's traceback is in the reproducer);
* at launch, only failures of Triton's toolchain are wrapped (Triton compiles the ``tl`` program
  at its first launch per specialization; its CPU interpreter runs it at every launch): a
  ``triton.errors.TritonError``, or an exception raised from inside ``triton.compiler``. Anything
  else a launch raises (a missing GPU, the interpreter's ``RaceError``) passes through. Triton's
  ``OutOfResources`` (the program needs more shared memory or registers than the GPU has: the
  program's tiles and stages, not a bug) is a ``ResourceLimitError`` at the kernel's line, after
  the reasons the earlier backends of the chain gave.

The user's line: the line of the generated source Triton failed at (from a ``CompilationError``
or a traceback frame in the generated file), mapped back through the ``# tilews: file.py:LINE``
comment above it; else the ``InternalError``'s own location; else that of the innermost IR node
(anything with a ``loc``) a frame of a pass or emitter held; else the kernel's.

A reproducer is a folder ``<cache dir>/internal-errors/<kernel>-<time>-<pid>-<n>/`` (a temporary
folder when the cache is disabled or not writable) holding ``error.txt`` (the message, the
original traceback, versions), ``frontend.tir`` (the printed frontend IR), ``lowered.tir`` (after
the backend's passes, when they finished) and ``generated<suffix>`` (the generated source, when
emitted).
"""
from __future__ import annotations

import itertools
import os
import platform
import re
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from tilews.lowering import ir, printer
from tilews.lowering.errors import CompileError, CompileValueError, InternalError, ResourceLimitError
from tilews.lowering.loc import Loc
from tilews.lowering.settings import Settings
from tilews.lowering.traverse import walk

from .cache import CacheLockTimeout

_SUFFIX = {"metal": ".metal", "interpret": ".tir"}     # of the generated source; else Python
_ORIGIN = re.compile(r"#\s*tilews:\s*(\S+):(\d+)")
_OUT_OF_RANGE = re.compile(r"Scalar (-?\d+) is out of range for type (u?int\d+)")
_serial = itertools.count()


class Attempt:
    """One backend's compile of one kernel, as far as it got: what a reproducer holds."""

    def __init__(self, before: ir.Kernel, backend: str, target: str, settings: Settings):
        self.before, self.backend, self.target, self.settings = before, backend, target, settings
        self.lowered: Optional[ir.Kernel] = None
        self.source: Optional[str] = None
        self.stage = "lowering"

    @contextmanager
    def guard(self, stage: str) -> Iterator["Attempt"]:
        """Run a step of the compile (``stage``: "lowering", "loading", ...); a bug in it is
        raised as an ``InternalError`` with a reproducer."""
        self.stage = stage
        try:
            yield self
        except (CompileError, CacheLockTimeout):   # the user's program; this machine's cache
            raise
        except InternalError as e:
            if e.reproducer is not None:
                raise
            raise self.internal(e) from None
        except Exception as e:
            raise self.internal(e) from None

    def guard_launch(self, program, refusals: tuple[str, ...] = ()):
        """``program`` with its ``launch`` reporting a failure of Triton's toolchain (on the code
        tilews generated) as an ``InternalError``, but a program needing more of a resource than
        the GPU has as a ``ResourceLimitError`` at the kernel's line (``refusals``: why the
        backends before this one did not take the kernel, said first)."""
        launch = program.launch

        def guarded(values: list) -> None:
            try:
                launch(values)
            except Exception as e:
                if not _from_toolchain(e):
                    raise
                overflow = _integer_overflow(e)
                if overflow is not None:
                    raise CompileValueError(overflow, self._generated_line(e)) from None
                limit = _out_of_resources(e)
                if limit is not None:
                    raise ResourceLimitError("; ".join((*refusals, f"the {self.backend} backend's "
                                                        f"program {limit}")), self.before.loc) from None
                self.stage = "launching (Triton compiling the generated code)"
                raise self.internal(e) from None
        program.launch = guarded
        return program

    def internal(self, e: Exception) -> InternalError:
        """The ``InternalError`` reporting ``e``, its reproducer written."""
        if isinstance(e, InternalError):
            message, loc, notes = e.message, e.loc, e.notes
        else:
            text = getattr(e, "error_message", None) if _is_triton_compilation(e) else None
            lines = str(text or e).strip().splitlines()
            name = f"{type(e).__module__}.{type(e).__qualname__}".removeprefix("builtins.")
            message = f"{name}: {lines[0]}" if lines else name
            loc, notes = None, ()
        own = loc if loc is not None and loc.line > 0 else None
        where = self._generated_line(e) or own or _node_loc(e) or self.before.loc
        head = (f"{self.stage} kernel '{self.before.name}' for target '{self.target}' (backend "
                f"{self.backend}) failed: {message}")
        folder = _folder(self.settings, self.before.name)
        error = InternalError(head, where, notes, reproducer=str(folder))
        self._write(folder, error, e)
        return error

    # -- the user's line ---------------------------------------------------------------------------
    def _generated_line(self, e: BaseException) -> Optional[Loc]:
        """The user's line above the generated-source line Triton failed at."""
        if self.source is None:
            return None
        lines = self.source.splitlines()
        at = None
        for err in _chain(e):
            if _is_triton_compilation(err) and getattr(err, "src", None) and hasattr(err.node, "lineno"):
                first = err.src.splitlines()[0]
                if first in lines:
                    at = lines.index(first) + err.node.lineno   # 1-based line of the module
                    break
            for frame, lineno in traceback.walk_tb(err.__traceback__):
                if _holds(frame.f_code.co_filename, self.source):
                    at = lineno
            if at is not None:
                break
        if at is None:
            return None
        return self._origin(lines, at)

    def _origin(self, lines: list[str], at: int) -> Optional[Loc]:
        """The location the ``# tilews: file.py:LINE`` comment nearest above line ``at`` names."""
        for text in reversed(lines[:at]):
            m = _ORIGIN.search(text)
            if m:
                base, line = m.group(1), int(m.group(2))
                for s in walk(self.before.body):
                    if s.loc.line == line and os.path.basename(s.loc.file) == base:
                        return s.loc
                same = os.path.basename(self.before.loc.file) == base
                return Loc(self.before.loc.file if same else base, line, 0)
        return None

    # -- the reproducer ----------------------------------------------------------------------------
    def _write(self, folder: Path, error: InternalError, original: BaseException) -> None:
        versions = [f"tilews {_version('tilews')}", f"python {platform.python_version()}",
                    *(f"{m} {_version(m)}" for m in ("triton", "torch", "numpy") if m in sys.modules)]
        trace = "".join(traceback.format_exception(original))
        files = {"error.txt": f"{error}\n\nversions: {', '.join(versions)}\n\n"
                              f"the original error:\n{trace}",
                 "frontend.tir": lambda: printer.to_text(self.before)}
        if self.lowered is not None:
            files["lowered.tir"] = lambda: printer.to_text(self.lowered)
        if self.source is not None:
            files["generated" + _SUFFIX.get(self.backend, ".py")] = self.source
        for name, text in files.items():
            try:
                body = text() if callable(text) else text
            except Exception as e:   # the printer may trip on the same bug: say so, keep the rest
                body = f"(printing failed: {type(e).__name__}: {e})\n"
            (folder / name).write_text(body)


def _folder(settings: Settings, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    leaf = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{stamp}-{os.getpid()}-{next(_serial)}"
    if not settings.disable_cache:
        try:
            folder = settings.cache_root() / "internal-errors" / leaf
            folder.mkdir(parents=True)
            return folder
        except OSError:
            pass
    return Path(tempfile.mkdtemp(prefix=f"tilews-internal-error-{leaf}-"))


def _version(module: str) -> str:
    return str(getattr(sys.modules.get(module), "__version__", "?"))


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or during, outermost first."""
    out: list[BaseException] = []
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _is_triton_compilation(e: BaseException) -> bool:
    errors = sys.modules.get("triton.compiler.errors")
    return errors is not None and isinstance(e, errors.CompilationError)


def _from_toolchain(e: BaseException) -> bool:
    """Whether ``e`` is Triton failing on generated code: a ``TritonError``, or raised from
    inside Triton's compiler."""
    base = sys.modules.get("triton.errors")
    if base is not None and isinstance(e, base.TritonError):
        return True
    return any(f"{os.sep}triton{os.sep}compiler{os.sep}" in frame.f_code.co_filename
               for frame, _ in traceback.walk_tb(e.__traceback__))


def _out_of_resources(e: BaseException) -> Optional[str]:
    """Where ``e`` is Triton refusing to launch a compiled program that needs more of a resource
    (shared memory, registers) than the GPU has, what the user reads; else None. The ``tl``
    backend's shared memory is the tiles the program allocates times its loops' ``num_stages``
    (Triton's pipelining), so it is the program's demand, not a fault of the code generated."""
    errors = sys.modules.get("triton.runtime.errors")
    for err in _chain(e):
        if errors is not None and isinstance(err, errors.OutOfResources):
            return (f"needs {err.required} {'bytes of ' if err.name == 'shared memory' else ''}"
                    f"{err.name}; the GPU has {err.limit}: use smaller tiles or fewer "
                    f"num_stages")
    return None


def _integer_overflow(e: BaseException) -> Optional[str]:
    """Where ``e`` is Triton's interpreter refusing an integer result outside its type (the
    ``triton`` target on a CPU computes scalar parameters as exact Python ints, so an int32 product
    that wraps elsewhere arrives there out of range), what the user reads; else None."""
    for err in _chain(e):
        m = _OUT_OF_RANGE.search(str(err))
        if m:
            return (f"integer overflow: {m.group(1)} is outside the range of {m.group(2)}; the "
                    f"triton target on a CPU computes scalar parameters exactly and refuses such "
                    f"a result where the other targets wrap around; compute it in int64 "
                    f"(T.cast(x, \"int64\")) or keep it in range")
    return None


def _holds(filename: str, source: str) -> bool:
    """Whether the file ``filename`` is the generated source (Triton imports it from a file)."""
    try:
        return os.path.isfile(filename) and os.path.getsize(filename) == len(source.encode()) \
            and Path(filename).read_text() == source
    except OSError:
        return False


def _node_loc(e: BaseException) -> Optional[Loc]:
    """The location of the innermost IR node (a value with a user ``loc``) that a frame of tilews
    (a pass, an emitter) held when ``e`` was raised."""
    for err in _chain(e):
        frames = [frame for frame, _ in traceback.walk_tb(err.__traceback__)
                  if _is_ours(frame.f_code.co_filename)]
        for frame in reversed(frames):
            for value in frame.f_locals.values():
                loc = getattr(value, "loc", None)
                if isinstance(loc, Loc) and loc.line > 0 and not isinstance(value, ir.Kernel):
                    return loc
    return None


def _is_ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_our_dirs())


def _our_dirs() -> tuple[str, ...]:
    import tilews.lowering
    import tilews.metal
    import tilews.triton_ext
    return tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                 for m in (tilews.lowering, tilews.triton_ext, tilews.metal))
