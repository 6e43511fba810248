"""Run an emitted Metal kernel on the CPU: its ``full_source()`` compiled as C++17 (no Metal needed).

Contract (docs: metal-contract.md, "The CPU harness"):
* ``build(kernel, sanitizer=None)`` checks the kernel against Metal's limits (at most 1024 threads
  per threadgroup; at most 32768 bytes of ``threadgroup T name[N];`` declarations, counted here from
  the text before anything is compiled), compiles ``kernel.full_source()`` with ``msl_cpu.h`` and a
  generated driver (``translation_unit``), and returns a ``HarnessKernel``. The header comment of
  ``msl_cpu.h`` gives the semantics (e.g. a simdgroup_load origin ``ulong2(col, row)`` is in memory
  coordinates, transposed or not); ``threadgroup T*`` (a pointer into threadgroup memory, in a
  cast or a parameter) loses its qualifier in the compiled text. Compiled files are cached under
  ``Settings.cache_root()/metal-harness/<sha256 of text, header, compiler and flags>``; with
  ``TILEWS_DISABLE_CACHE`` on, nothing is written there (a private temporary folder instead).
  Beside each compiled file, ``<file>.sha256`` records its size and sha256 (written before the file
  is moved into place); a cached file that does not match its record (emptied, corrupted, or with
  no record) is compiled again. Every compile first removes ``*.tmp`` files of that folder older
  than ``STALE_TMP_S`` (left by a compile that was killed).
* ``build(..., checked=True)`` (the default) compiles every index of an on-chip array (each
  ``threadgroup T name[N];`` and thread ``T name[N];`` of the kernel text) through a check
  (``msl_cpu_index``): an index outside the array fails the launch with ``HarnessOutOfBounds``
  (a ``HarnessError`` and the interpreter's ``OutOfBoundsError``) naming the array, the index, the
  lane, the kernel line and, where the emitter marked it (``// tilews: file.py:LINE``), the
  user's line. The arrays are flat, so an index past one dim of a multi-dim buffer but inside the
  array is not seen. Cost: one compare and a branch never taken per on-chip access; an RMS norm
  (256 x 512 floats, three on-chip arrays) ran within this 2-core machine's noise either way (best
  of 30 runs: 23-43 ms checked, 35-47 ms unchecked). ``checked=False`` compiles the kernel text as
  it is.
* ``HarnessKernel.run(args, grid)``: ``args`` follow ``kernel.params``: C-contiguous numpy arrays or
  contiguous torch CPU tensors of the param's element type (half and bfloat may also come as 2-byte
  integer storage, uchar and char as fp8 tensors; signed and unsigned integers of one size are
  interchangeable), modified in place
  for written params; scalar params take a Python number (or a 1-element buffer). ``grid`` counts
  threadgroups; they run one after another, on a worker thread while the calling thread waits, so
  Ctrl-C reaches Python: the harness then asks the lanes to stop (they check at each threadgroup and
  each iteration of any loop of the kernel: see ``msl_cpu.h``, "Interrupts"), waits for them and
  raises ``KeyboardInterrupt``; the written buffers then hold a partial result.
* Failures are ``HarnessError``: the compiler's errors (located in ``<kernel>.metal``, the lines of
  ``full_source()``), the harness's own diagnostics (a threadgroup barrier not reached by all live
  lanes, a simdgroup operation not reached by all 32 lanes of its simdgroup or with non-uniform
  arguments, the limits above) naming lanes and source lines, and sanitizer reports.
* ``build(..., sanitizer="thread" | "address")`` builds a standalone executable with
  ``-fsanitize=...``; each ``run`` copies the arguments into exactly-sized heap buffers in a
  subprocess (so an out-of-bounds access of a device buffer is past a heap block, and a sanitizer
  abort does not kill the caller) and raises ``HarnessError`` carrying the first 40 lines of the
  report. A missing compiler or sanitizer runtime is ``HarnessUnavailable``.

Lanes are fibers (``ucontext``) by default and OS threads in the sanitizer builds. Fibers: a 128-lane
threadgroup meets a barrier or a simdgroup rendezvous dozens of times per tile, and with OS threads
every rendezvous is a round of futex wake-ups and context switches on the machine's few shared
cores; switching fibers costs well under a microsecond, needs no locks, and the schedule (one
simdgroup as far as it can go, then the next) is deterministic, so diagnostics and results do not
depend on timing, and a missing barrier reads unwritten threadgroup memory (NaN) every time.
ThreadSanitizer only sees races between real threads, and AddressSanitizer does not follow
``swapcontext`` stacks reliably, so both sanitizer builds give every lane its own thread.
"""
from __future__ import annotations

import ast
import atexit
import ctypes
import functools
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from tilews.lowering.digest import cache_key
from tilews.lowering.errors import OutOfBoundsError
from tilews.lowering.settings import Settings

from .source import ATTRIBUTES, MslKernel

__all__ = ["HarnessError", "HarnessKernel", "HarnessOutOfBounds", "HarnessUnavailable", "build", "compiler", "threadgroup_arrays",
           "translation_unit"]

HEADER = pathlib.Path(__file__).with_name("msl_cpu.h")
MAX_THREADS = 1024
MAX_THREADGROUP_BYTES = 32768
SANITIZERS = ("thread", "address")
REPORT_LINES = 40
STALE_TMP_S = 600    # a compile's temporary file untouched this long was left by a killed one

# MSL element type -> (bytes, numpy/torch dtype name)
ELEMENT_TYPES = {"float": (4, "float32"), "half": (2, "float16"), "bfloat": (2, "bfloat16"),
                 "char": (1, "int8"), "uchar": (1, "uint8"), "short": (2, "int16"),
                 "ushort": (2, "uint16"), "int": (4, "int32"), "uint": (4, "uint32"),
                 "long": (8, "int64"), "ulong": (8, "uint64"), "bool": (1, "bool")}
_INTEGERS = {"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"}

# -fwrapv: signed integer arithmetic wraps (two's complement), as on the GPU and every target
_COMMON_FLAGS = ("-std=c++17", "-w", "-fno-strict-aliasing", "-fwrapv")
_FLAGS = {None: ("-O1", "-fPIC", "-shared"),
          "thread": ("-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=thread", "-pthread",
                     "-DMSL_CPU_THREADS", "-DMSL_CPU_MAIN"),
          "address": ("-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address", "-pthread",
                      "-DMSL_CPU_THREADS", "-DMSL_CPU_MAIN")}
_SANITIZER_ENV = {"thread": ("TSAN_OPTIONS", "halt_on_error=1:report_thread_leaks=0"),
                  "address": ("ASAN_OPTIONS", "detect_leaks=0:halt_on_error=1")}
_ATTRIBUTE_VALUES = {"threadgroup_position_in_grid": "group", "thread_index_in_threadgroup": "tid",
                     "simdgroup_index_in_threadgroup": "tid / 32u",
                     "thread_index_in_simdgroup": "tid % 32u"}


class HarnessUnavailable(RuntimeError):
    """No C++17 compiler (or no sanitizer runtime) to run Metal kernels on the CPU."""


class HarnessError(RuntimeError):
    """A kernel failed to compile or to run under the harness; the message says where and why."""


class HarnessOutOfBounds(HarnessError, OutOfBoundsError):
    """A kernel indexed an on-chip array outside it (the checked build)."""


def compiler() -> Optional[str]:
    """The C++ compiler the harness uses: ``TILEWS_CXX`` if set (None if it is not found), else
    ``g++`` or ``clang++`` from PATH, else None."""
    configured = Settings.from_env().cxx
    if configured:
        return shutil.which(configured)
    return shutil.which("g++") or shutil.which("clang++")


def build(kernel: MslKernel, sanitizer: Optional[str] = None, checked: bool = True) -> "HarnessKernel":
    """Check ``kernel`` against Metal's limits, compile it (or find it cached), and load it."""
    if sanitizer not in (None, *SANITIZERS):
        raise ValueError(f"sanitizer={sanitizer!r}: use None, 'thread' or 'address'")
    cxx = compiler()
    if cxx is None:
        configured = Settings.from_env().cxx
        where = (f"TILEWS_CXX={configured!r} is not an executable on PATH" if configured else
                 "none found on PATH; set TILEWS_CXX to one")
        raise HarnessUnavailable(f"tilews.metal.harness needs a C++17 compiler (g++ or clang++); {where}")
    _check_signature(kernel)
    _check_threadgroup_memory(kernel)
    if sanitizer is not None:
        _check_sanitizer(cxx, sanitizer)
    text = translation_unit(kernel, checked)
    flags = _COMMON_FLAGS + _FLAGS[sanitizer]
    key = cache_key("tilews.metal.harness", 1, text, HEADER.read_text(), cxx, _version(cxx), flags)
    path, seconds = _compiled(kernel.name, text, cxx, flags, key, ".so" if sanitizer is None else ".exe")
    return HarnessKernel(kernel, sanitizer, path, seconds)


@dataclass
class HarnessKernel:
    kernel: MslKernel
    sanitizer: Optional[str]
    path: pathlib.Path           # the shared library (or, with a sanitizer, the executable)
    compile_seconds: float       # 0.0 when it came from the cache
    _lock: threading.Lock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._lock = _library_lock(self.path)

    def run(self, args: Sequence[object], grid: Sequence[int]) -> None:
        """Run the grid of threadgroups on ``args`` (aligned with ``kernel.params``); written
        buffers are updated in place."""
        grid = _grid(grid)
        if len(args) != len(self.kernel.params):
            raise TypeError(f"kernel {self.kernel.name} takes {len(self.kernel.params)} arguments "
                            f"({', '.join(p.name for p in self.kernel.params)}), got {len(args)}")
        buffers = [_buffer(p, a, self.kernel.name) for p, a in zip(self.kernel.params, args)]
        with self._lock:
            if self.sanitizer is None:
                self._run_here(buffers, grid)
            else:
                self._run_sanitized(buffers, grid)

    def _run_here(self, buffers: list["_Buffer"], grid: tuple[int, int, int]) -> None:
        library = _library(self.path)
        pointers = (ctypes.c_void_p * max(1, len(buffers)))(*[b.pointer or None for b in buffers])
        error = ctypes.create_string_buffer(4096)
        if _launch_interruptibly(library, pointers, grid, error) != 0:
            raise self._failure(error.value.decode(errors="replace"))

    def _run_sanitized(self, buffers: list["_Buffer"], grid: tuple[int, int, int]) -> None:
        variable, options = _SANITIZER_ENV[self.sanitizer]
        env = {**os.environ, variable: ":".join(filter(None, [options, os.environ.get(variable)]))}
        with tempfile.TemporaryDirectory(prefix="tilews-msl-run-") as folder:
            for i, b in enumerate(buffers):
                pathlib.Path(folder, f"arg{i}.bin").write_bytes(ctypes.string_at(b.pointer, b.nbytes)
                                                                if b.nbytes else b"")
            try:
                proc = subprocess.run([str(self.path), folder, *map(str, grid)], env=env,
                                      capture_output=True, text=True, errors="replace", timeout=600)
            except subprocess.TimeoutExpired as error:
                raise HarnessError(f"kernel {self.kernel.name} ran for more than {error.timeout} s "
                                   f"under the {self.sanitizer} sanitizer") from None
            report = _sanitizer_report(proc.stderr)
            if report is not None:
                raise HarnessError(f"kernel {self.kernel.name}: the {self.sanitizer} sanitizer "
                                   f"reports:\n{report}")
            if proc.returncode == 3 and "msl_cpu error: " in proc.stderr:
                message = proc.stderr.split("msl_cpu error: ", 1)[1].strip()
                raise self._failure(message)
            if proc.returncode != 0:
                tail = "\n".join(proc.stderr.splitlines()[-REPORT_LINES:])
                raise HarnessError(f"kernel {self.kernel.name} exited with status {proc.returncode} "
                                   f"under the {self.sanitizer} sanitizer:\n{tail}")
            for i, b in enumerate(buffers):
                if b.written and b.nbytes:
                    data = pathlib.Path(folder, f"arg{i}.bin").read_bytes()
                    ctypes.memmove(b.pointer, data, b.nbytes)

    def _failure(self, message: str) -> HarnessError:
        """The launch's diagnostic as an error, followed by the kernel source lines it names (and
        the user's line each comes from, where the emitter marked it)."""
        lines = self.kernel.full_source().splitlines()
        numbers = sorted({int(n) for n in re.findall(r"\bline (\d+)", message)})
        quoted = [f"  {self.kernel.name}.metal:{n}: {lines[n - 1].strip()}{_origin(lines, n)}"
                  for n in numbers if 0 < n <= len(lines)]
        kind = HarnessOutOfBounds if _OUT_OF_BOUNDS.search(message) else HarnessError
        return kind("\n".join([f"kernel {self.kernel.name}: {message}", *quoted]))


_OUT_OF_BOUNDS = re.compile(r"lane \d+: index -?\d+ is outside on-chip array ")
_ORIGIN = re.compile(r"^\s*// tilews: (\S+)")


def _origin(lines: list[str], n: int) -> str:
    """`` (from file.py:LINE)``: the user's line of the statement kernel line ``n`` belongs to, the
    emitter's last ``// tilews:`` mark above it; "" where there is none."""
    for line in reversed(lines[:n - 1]):
        match = _ORIGIN.match(line)
        if match:
            return f" (from {match.group(1)})"
    return ""


# ---- the translation unit ------------------------------------------------------------------------

def translation_unit(kernel: MslKernel, checked: bool = True) -> str:
    """The C++ file the harness compiles: the kernel text (lines numbered as in ``full_source()``,
    file name ``<kernel>.metal``; with ``checked``, its on-chip indices bounds-checked) and the
    driver that calls it once per lane."""
    text = _LOOP.sub("msl_cpu_for(", _POINTER.sub("", kernel.full_source()))
    if checked:
        text = _bounds_checked(text, on_chip_arrays(kernel))
    args = [f"({p.dtype}*)b[{i}]" for i, p in enumerate(kernel.params)]
    args += [_ATTRIBUTE_VALUES[a] for a in kernel.attributes]
    written = ", ".join(["true" if p.written else "false" for p in kernel.params] + ["false"])
    return f"""// generated by tilews.metal.harness for kernel {kernel.name}
#line 1 "{kernel.name}.metal"
{text}
#line 1 "{kernel.name}.harness.cpp"
static void msl_cpu_lane(void* ctx, uint3 group, uint tid) {{
  void** b = static_cast<void**>(ctx);
  (void)b;
  {kernel.name}({", ".join(args)});
}}

extern "C" int msl_cpu_launch(void** buffers, uint gx, uint gy, uint gz, char* error, size_t cap) {{
  return msl_cpu::launch(msl_cpu_lane, buffers, {kernel.threads}u, uint3{{gx, gy, gz}}, error, cap);
}}

extern "C" void msl_cpu_stop(int stop) {{ msl_cpu::g_stop.store(stop != 0); }}

#ifdef MSL_CPU_MAIN
int main(int argc, char** argv) {{
  static const bool written[] = {{{written}}};
  return msl_cpu::file_main(argc, argv, {len(kernel.params)}, written, msl_cpu_launch);
}}
#endif
"""


def _check_signature(kernel: MslKernel) -> None:
    if not 1 <= kernel.threads <= MAX_THREADS:
        raise HarnessError(f"kernel {kernel.name} has {kernel.threads} threads per threadgroup; Metal "
                           f"allows 1 to {MAX_THREADS}")
    for p in kernel.params:
        if p.dtype not in ELEMENT_TYPES:
            raise HarnessError(f"kernel {kernel.name}: parameter {p.name} has element type {p.dtype!r}, "
                               f"not one of {', '.join(ELEMENT_TYPES)}")
    unknown = [a for a in kernel.attributes if a not in ATTRIBUTES]
    if unknown:
        raise HarnessError(f"kernel {kernel.name} reads unknown thread attributes {unknown}")
    if len(kernel.params) > 64:
        raise HarnessError(f"kernel {kernel.name} has {len(kernel.params)} parameters; the harness "
                           "takes at most 64")


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_THREADGROUP = re.compile(r"\bthreadgroup\b")
_POINTER = re.compile(r"\bthreadgroup(?=\s+\w+\s*\*)")    # `threadgroup T*`: a plain pointer here
_LOOP = re.compile(r"\bfor\s*\(")                             # a loop that polls for a stop request
_DECLARATION = re.compile(r"\bthreadgroup\s+(\w+)\s+(\w+)\s*((?:\[[^\[\]]*\]\s*)*);")


def threadgroup_arrays(kernel: MslKernel) -> list[tuple[str, str, int]]:
    """``(name, declaration, bytes)`` of every ``threadgroup`` declaration in the kernel text."""
    text = _POINTER.sub("", _COMMENT.sub(" ", f"{kernel.header}\n{kernel.body}"))
    found = []
    for match in _DECLARATION.finditer(text):
        element, name, dims = match.groups()
        if element not in ELEMENT_TYPES:
            raise HarnessError(f"kernel {kernel.name}: threadgroup array {name} has element type "
                               f"{element!r}, not one of {', '.join(ELEMENT_TYPES)}")
        count = 1
        for extent in re.findall(r"\[([^\[\]]*)\]", dims):
            count *= _extent(extent, name, kernel.name)
        found.append((name, f"{element} {name}{dims.strip()}", count * ELEMENT_TYPES[element][0]))
    if len(found) != len(_THREADGROUP.findall(text)):
        uses = [text[m.start():m.start() + 60].split(";")[0] for m in _THREADGROUP.finditer(text)
                if not _DECLARATION.match(text, m.start())]
        raise HarnessError(f"kernel {kernel.name}: `threadgroup` may only declare arrays at the top of "
                           f"the kernel body (`threadgroup float A_s[256];`) or qualify a pointer "
                           f"(`threadgroup atomic_uint*`), not in {uses[0]!r}")
    return found


def _extent(expression: str, name: str, kernel: str) -> int:
    """An array extent: an integer expression of literals (C suffixes u/l allowed)."""
    cleaned = re.sub(r"\b(\d+)[uUlL]*\b", r"\1", expression).replace("/", "//")
    try:
        tree = ast.parse(cleaned, mode="eval")
    except SyntaxError:
        tree = None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult,
               ast.FloorDiv, ast.USub)
    if tree is None or not all(isinstance(n, allowed) for n in ast.walk(tree)) or not all(
            isinstance(n.value, int) for n in ast.walk(tree) if isinstance(n, ast.Constant)):
        raise HarnessError(f"kernel {kernel}: cannot size threadgroup array {name}[{expression}]: "
                           "extents must be integer literals or arithmetic on them")
    return eval(compile(tree, "<extent>", "eval"), {"__builtins__": {}})


_ARRAY = re.compile(r"^[ \t]*(?:threadgroup\s+)?(\w+)\s+(\w+)\s*\[([^\[\]]+)\]\s*;", re.M)


def on_chip_arrays(kernel: MslKernel) -> dict[str, int]:
    """Name -> elements of every one-dim array of scalars the kernel body declares, in threadgroup
    memory or the thread's own."""
    text = _COMMENT.sub(" ", kernel.body)
    return {name: _extent(extent, name, kernel.name) for element, name, extent in _ARRAY.findall(text)
            if element in ELEMENT_TYPES}


def _bounds_checked(text: str, arrays: dict[str, int]) -> str:
    """``text`` with every ``name[index]`` of an array of ``arrays`` (but its declaration) spelled
    ``name[msl_cpu_index(index, elements, "name", __LINE__)]`` (lines unchanged)."""
    if not arrays:
        return text
    use = re.compile(r"\b(" + "|".join(map(re.escape, arrays)) + r")\s*\[")
    declared = [m.span() for m in _ARRAY.finditer(text) if m.group(2) in arrays]
    out, pos = [], 0
    while (m := use.search(text, pos)) is not None:
        end = _closing_bracket(text, m.end())
        if any(lo <= m.start() < hi for lo, hi in declared):
            out.append(text[pos:end + 1])
        else:
            name = m.group(1)
            index = _bounds_checked(text[m.end():end], arrays)
            out.append(f'{text[pos:m.end()]}msl_cpu_index({index}, {arrays[name]}, "{name}", '
                       f'__LINE__)]')
        pos = end + 1
    return "".join(out) + text[pos:]


def _closing_bracket(text: str, start: int) -> int:
    """The position of the ``]`` closing the ``[`` just before ``start``."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"[": 1, "]": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise HarnessError(f"unbalanced brackets after {text[max(0, start - 40):start]!r}")


def _check_threadgroup_memory(kernel: MslKernel) -> None:
    arrays = threadgroup_arrays(kernel)
    total = sum(size for _, _, size in arrays)
    if total > MAX_THREADGROUP_BYTES:
        largest = sorted(arrays, key=lambda a: -a[2])[:3]
        listing = ", ".join(f"{decl} ({size} bytes)" for _, decl, size in largest)
        raise HarnessError(f"kernel {kernel.name} declares {total} bytes of threadgroup memory, more "
                           f"than Metal's {MAX_THREADGROUP_BYTES} (32 KB); largest: {listing}")


# ---- compiling and caching -----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _version(cxx: str) -> str:
    proc = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0] if proc.stdout else ""


@functools.lru_cache(maxsize=None)
def _private_dir() -> pathlib.Path:
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tilews-metal-harness-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _output_dir() -> pathlib.Path:
    if Settings.from_env().disable_cache:
        return _private_dir()
    folder = Settings.from_env().cache_root() / "metal-harness"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return _private_dir()
    return folder if os.access(folder, os.W_OK) else _private_dir()


def _compiled(name: str, text: str, cxx: str, flags: tuple[str, ...], key: str,
              suffix: str) -> tuple[pathlib.Path, float]:
    folder = _output_dir()
    path = folder / f"{key}{suffix}"
    if _intact(path):
        return path, 0.0
    _remove_stale_partials(folder)
    partial, record = _partial(path), _partial(_record(path))
    try:
        with tempfile.TemporaryDirectory(prefix="tilews-msl-build-") as build_dir:
            source = pathlib.Path(build_dir, f"{name}.cpp")
            source.write_text(text)
            pathlib.Path(build_dir, "metal_stdlib").write_text(f'#include "{HEADER}"\n')
            start = time.perf_counter()
            proc = subprocess.run([cxx, *flags, "-I", build_dir, str(source), "-o", str(partial)],
                                  capture_output=True, text=True, errors="replace",
                                  env={**os.environ, "LC_ALL": "C"})   # plain quotes in diagnostics
            seconds = time.perf_counter() - start
        if proc.returncode != 0:
            diagnostics = "\n".join((proc.stderr or proc.stdout).splitlines()[:REPORT_LINES])
            raise HarnessError(f"{cxx} could not compile kernel {name} (lines of {name}.metal are "
                               f"those of full_source()):\n{diagnostics}")
        record.write_text(_fingerprint(partial.read_bytes()))
        os.replace(record, _record(path))
        os.replace(partial, path)
    finally:   # a failed or interrupted compile leaves no temporary file
        partial.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
    return path, seconds


def _partial(path: pathlib.Path) -> pathlib.Path:
    """This thread's temporary file for ``path``, moved into place when complete."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def _record(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(f"{path.name}.sha256")


def _fingerprint(data: bytes) -> str:
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"


def _intact(path: pathlib.Path) -> bool:
    """Whether ``path`` is a compiled file whose size and digest match the record beside it."""
    try:
        return _record(path).read_text() == _fingerprint(path.read_bytes())
    except (OSError, UnicodeDecodeError):   # missing, a folder, unreadable
        return False


def _remove_stale_partials(folder: pathlib.Path) -> None:
    """Remove the temporary files of compiles that were killed (untouched for ``STALE_TMP_S``)."""
    cutoff = time.time() - STALE_TMP_S
    for partial in folder.glob("*.tmp"):
        try:
            if partial.stat().st_mtime < cutoff:
                partial.unlink()
        except OSError:   # gone already, or not ours to remove
            pass


@functools.lru_cache(maxsize=None)
def _check_sanitizer(cxx: str, sanitizer: str) -> None:
    """Compile and run an empty program with the sanitizer: its runtime library must exist."""
    with tempfile.TemporaryDirectory(prefix="tilews-msl-probe-") as folder:
        source = pathlib.Path(folder, "probe.cpp")
        source.write_text("int main() { return 0; }\n")
        exe = pathlib.Path(folder, "probe")
        proc = subprocess.run([cxx, f"-fsanitize={sanitizer}", str(source), "-o", str(exe)],
                              capture_output=True, text=True, errors="replace")
        if proc.returncode == 0:
            proc = subprocess.run([str(exe)], capture_output=True, text=True, errors="replace")
        if proc.returncode != 0:
            detail = "\n".join(proc.stderr.splitlines()[:5])
            raise HarnessUnavailable(f"the {sanitizer} sanitizer does not work with {cxx} here "
                                     f"(is its runtime library installed?):\n{detail}")


_libraries: dict[pathlib.Path, ctypes.CDLL] = {}
_locks: dict[pathlib.Path, threading.Lock] = {}
_registry_lock = threading.Lock()


def _library(path: pathlib.Path) -> ctypes.CDLL:
    with _registry_lock:
        if path not in _libraries:
            lib = ctypes.CDLL(str(path))
            lib.msl_cpu_launch.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_uint,
                                           ctypes.c_uint, ctypes.c_char_p, ctypes.c_size_t]
            lib.msl_cpu_launch.restype = ctypes.c_int
            lib.msl_cpu_stop.argtypes = [ctypes.c_int]
            lib.msl_cpu_stop.restype = None
            _libraries[path] = lib
        return _libraries[path]


def _launch_interruptibly(library: ctypes.CDLL, pointers, grid: tuple[int, int, int], error) -> int:
    """``msl_cpu_launch`` on a worker thread; on ``KeyboardInterrupt`` while waiting for it, ask
    its lanes to stop, wait until they have, and raise it again."""
    status = []
    library.msl_cpu_stop(0)
    worker = threading.Thread(target=lambda: status.append(library.msl_cpu_launch(pointers, *grid, error,
                                                                                   len(error))),
                              name="tilews-metal-harness-launch", daemon=True)
    worker.start()
    try:
        worker.join()
    except KeyboardInterrupt:
        library.msl_cpu_stop(1)
        while worker.is_alive():   # a second Ctrl-C must not leave the lanes running unlocked
            try:
                worker.join()
            except KeyboardInterrupt:
                pass
        raise
    return status[0]


def _library_lock(path: pathlib.Path) -> threading.Lock:
    """One launch at a time per compiled file: its lanes live in the library's globals."""
    with _registry_lock:
        return _locks.setdefault(path, threading.Lock())


def _sanitizer_report(stderr: str) -> Optional[str]:
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if re.search(r"(ERROR|WARNING): (Address|Thread)Sanitizer", line):
            start = i - 1 if i > 0 and lines[i - 1].startswith("====") else i
            return "\n".join(lines[start:start + REPORT_LINES])
    return None


# ---- arguments -----------------------------------------------------------------------------------

@dataclass
class _Buffer:
    pointer: int
    nbytes: int
    written: bool
    owner: object   # keeps a converted scalar alive for the launch


def _grid(grid: Sequence[int]) -> tuple[int, int, int]:
    values = tuple(grid)
    if not 1 <= len(values) <= 3 or not all(isinstance(v, (int, np.integer)) and 0 <= v < 2**32
                                            for v in values):
        raise ValueError(f"grid={grid!r}: give 1 to 3 non-negative threadgroup counts")
    return tuple(int(v) for v in values) + (1,) * (3 - len(values))


def _buffer(param, value: object, kernel: str) -> _Buffer:
    where = f"kernel {kernel}, parameter {param.name} ({param.dtype}{'' if param.scalar else '*'})"
    if param.scalar and isinstance(value, (bool, int, float, np.generic)):
        value = _scalar_array(param, value, where)
    if isinstance(value, np.ndarray):
        name, pointer, nbytes = value.dtype.name, value.ctypes.data, value.nbytes
        if not value.flags.c_contiguous:
            raise TypeError(f"{where}: the array must be C-contiguous")
        if param.written and not value.flags.writeable:
            raise TypeError(f"{where}: the kernel writes it but the array is read-only")
        count = value.size
    elif type(value).__module__.startswith("torch") and hasattr(value, "data_ptr"):
        name = str(value.dtype).removeprefix("torch.")
        if value.device.type != "cpu" or not value.is_contiguous():
            raise TypeError(f"{where}: the tensor must be a contiguous CPU tensor")
        count = value.numel()
        pointer, nbytes = value.data_ptr(), count * value.element_size()
    else:
        raise TypeError(f"{where}: expected a numpy array or torch CPU tensor"
                        f"{' or a number' if param.scalar else ''}, got {type(value).__name__}")
    size, expected = ELEMENT_TYPES[param.dtype]
    raw_16 = param.dtype in ("half", "bfloat") and name in ("int16", "uint16")
    raw_8 = param.dtype in ("uchar", "char") and name.startswith("float8")   # fp8 bytes
    same_integer = expected in _INTEGERS and name in _INTEGERS and nbytes == count * size
    if name != expected and not (raw_16 or raw_8 or same_integer):
        raise TypeError(f"{where}: got elements of type {name}, expected {expected}")
    if param.scalar and count != 1:
        raise TypeError(f"{where}: a scalar takes one element, got {count}")
    return _Buffer(pointer, nbytes, param.written, value)


def _scalar_array(param, value: object, where: str) -> np.ndarray:
    if isinstance(value, np.generic):
        value = value.item()
    _, name = ELEMENT_TYPES[param.dtype]
    if name in _INTEGERS and not isinstance(value, int):
        raise TypeError(f"{where}: expected an integer, got {value!r}")
    if name == "bfloat16":
        import ml_dtypes
        return np.array([value], dtype=ml_dtypes.bfloat16)
    try:
        return np.array([value], dtype=name)
    except OverflowError:
        raise TypeError(f"{where}: {value!r} does not fit in {param.dtype}") from None
