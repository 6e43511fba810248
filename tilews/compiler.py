"""Kernel source -> compiled ``Kernel``: frontend, then the target's chain of backends.

The frontend makes an ``ir.Function``: one ``ir.Kernel`` per ``T.Kernel`` block. Each kernel takes
the chain on its own: for each backend of the chain (``tilews.backends``) the kernel is lowered by
the backend's pass pipeline and emitted; the first backend that does not refuse the lowered kernel
loads it (so one kernel of a function may run on the preferred backend and the next on a
fallback). A refusal's reason, and the notes of the refused lowering, go to that kernel's compile
report. A loaded program whose toolchain adds scratch (Triton's layout conversions) that takes it
past the machine's shared memory is lowered again for the machine's bytes less that scratch
(``_take``), with a note saying so; one that still does not fit is the backend's
``ResourceLimitError``, and so, like a lowering that outgrew the machine, the next backend's turn.

The on-disk cache holds, per backend, the lowered IR and the emitted source (or the refusal),
under a key of what fully determines them: the printed frontend IR (plus every statement's source
line, which the emitted code cites), the backend's fingerprint (its name, target and tool versions)
and a digest of tilews's own installed sources, so a change to any pass or emitter is a miss.
"""
from __future__ import annotations

import functools
import hashlib
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from tilews import backends, cache, pass_config, targets
from tilews.lowering import ir, printer
from tilews.lowering.backend import Backend, Program, Services
from tilews.lowering.errors import CompileError, InternalError, ResourceLimitError
from tilews.lowering.frontend import KernelSource, build_function
from tilews.lowering.plans import SharedMemoryPlan
from tilews.lowering.settings import Settings
from tilews.lowering.traverse import walk

from .kernel import CompiledKernel, CompileReport, Kernel
from .reproducer import Attempt


@dataclass
class Lowered:
    """What the disk cache stores for one backend."""
    ir_after: ir.Kernel
    source: Optional[str]              # None: the backend refused (``refusal`` says why)
    refusal: Optional[str] = None
    pass_ms: tuple[tuple[str, float], ...] = field(default=())


def _lower(backend: Backend, kernel: ir.Kernel, attempt: Attempt) -> Lowered:
    times: list[tuple[str, float]] = []
    last = [time.perf_counter()]

    def observe(name: str, _k: ir.Kernel) -> None:
        now = time.perf_counter()
        times.append((name, (now - last[0]) * 1e3))
        last[0] = now

    with attempt.guard("lowering"):
        after = attempt.lowered = backend.lower(kernel, observe)
    with attempt.guard("emitting"):
        reason = backend.refuses(after)
        source = attempt.source = None if reason else backend.emit(after)
    return Lowered(after, source, reason, tuple(times[1:]))


def source_files() -> list[Path]:
    """Every Python source of the installed tilews: the modules of ``tilews`` and
    ``tilews.language``, and every module under ``tilews.lowering``, ``tilews.triton_ext`` and
    ``tilews.metal`` (the benchmark is not part of code generation)."""
    import tilews.language
    import tilews.lowering
    import tilews.metal
    import tilews.triton_ext
    found = sorted(Path(__file__).parent.glob("*.py"))     # tilews itself (this module's package)
    for package, pattern in ((tilews.language, "*.py"), (tilews.lowering, "**/*.py"),
                             (tilews.triton_ext, "**/*.py"), (tilews.metal, "**/*.py")):
        found += sorted(Path(package.__file__).parent.glob(pattern))
    return found


@functools.lru_cache(maxsize=None)
def sources_digest() -> str:
    """A digest of ``source_files()`` (names and contents): part of every disk-cache key, so a
    change to any pass or emitter is a miss."""
    h = hashlib.sha256()
    for path in source_files():
        h.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _key_parts(kernel: ir.Kernel, backend: Backend) -> tuple:
    lines = tuple((s.loc.file, s.loc.line) for s in walk(kernel.body))
    return ("tilews-kernel", sources_digest(), backend.fingerprint(), printer.to_text(kernel),
            kernel.loc.file, lines)


@dataclass(frozen=True)
class BuildRequest:
    """What one specialization of a kernel compiles: what varies with the ``@tilews.jit`` style.
    ``build(debug, target)`` makes the frontend IR, an ``ir.Function`` (``debug``: ``Settings.debug_frontend``;
    ``target``: the resolved target's name); ``user_params``: the parameters the caller passes
    or receives, in order (``out_idx`` indexes them)."""
    build: Callable[[bool, str], ir.Function]
    user_params: tuple[str, ...]
    out_idx: tuple[int, ...] = ()

    @classmethod
    def of(cls, src: KernelSource, out_idx: Sequence[int] = (),
           param_specs: Optional[dict[str, Any]] = None, extra_names: Optional[dict[str, Any]] = None,
           user_params: Optional[Sequence[str]] = None) -> "BuildRequest":
        """``build_function`` of ``src`` (``param_specs``, ``extra_names``: the direct style's)."""
        def build(debug: bool, target: str) -> ir.Function:
            return build_function(src, param_specs, extra_names, debug=debug, target=target)
        params = src.param_names if user_params is None else user_params
        return cls(build, tuple(params), tuple(out_idx))


@dataclass(frozen=True)
class CompileConfig:
    """How every specialization of a kernel is compiled: the target's name (``"auto"`` too),
    the backend's options, TileLang's pass configs (``tilews.pass_config``: what they change is
    in the backends' fingerprints, so in the cache key, and in the report's notes) and the
    settings (default: ``Settings.from_env()`` at each compile)."""
    target: str = "auto"
    options: Mapping[str, Any] = field(default_factory=dict)
    pass_configs: Mapping = field(default_factory=dict)
    settings: Optional[Settings] = None


def compile_kernel(request: BuildRequest, config: CompileConfig = CompileConfig()) -> Kernel:
    """The compiled ``Kernel`` of ``request`` under ``config`` (the module docstring): every
    kernel of the function, in launch order."""
    t0 = time.perf_counter()
    settings = config.settings or Settings.from_env()
    settings.ready_dump_folder()
    passes = pass_config.resolve(dict(config.pass_configs))
    target, notes = targets.resolve(config.target)
    notes += passes.notes(target, backends.skipped(target, passes))
    function = request.build(settings.debug_frontend, target)
    frontend_ms = (time.perf_counter() - t0) * 1e3
    store = cache.DiskCache.from_settings(settings)
    chain = backends.chain(target, Services(store, settings, targets.machine()), passes)
    compiled = tuple(_compile_one(kernel, chain, target, notes, store, settings, config)
                     for kernel in function.kernels)
    report = CompileReport.of_function(tuple(c.report for c in compiled), frontend_ms,
                                       (time.perf_counter() - t0) * 1e3)
    return Kernel(function.name, compiled, request.user_params, request.out_idx, report, settings)


def _after_refusals(e: CompileError, refusals: list[str], target: str,
                    backend: Backend) -> CompileError:
    """``e`` as the error of the whole chain: the earlier backends' reasons first, then this
    backend's complaint (``e`` itself when no backend refused before)."""
    if not refusals:
        return e
    return CompileError(f"target '{target}': {'; '.join(refusals)}; and the {backend.name} "
                        f"backend cannot compile it either: {e.message}", e.loc, e.notes)


def _compile_one(before: ir.Kernel, chain: Sequence[Backend], target: str, notes: tuple,
                 store: cache.DiskCache, settings: Settings, config: CompileConfig) -> CompiledKernel:
    """One kernel of a function through the chain: the first backend that takes it loads it.
    Its report's ``passes`` leave the frontend out (it is the function's) and its ``compile_ms``
    counts this kernel's lowering, emitting and loading."""
    t0 = time.perf_counter()
    refusals: list[str] = []
    for n, backend in enumerate(chain):
        # a bug in lowering or emitting is an InternalError with a reproducer (tilews.reproducer);
        # it is not a CompileError, so the fallback below never takes it for a refusal
        try:
            taken = _take(before, backend, target, store, settings, config)
        except ResourceLimitError as e:
            if n + 1 == len(chain):
                raise _after_refusals(e, refusals, target, backend) from None
            # this backend's own schedule outgrew the machine; the next one plans differently
            refusals.append(f"the {backend.name} backend cannot fit the program ({e.message})")
            notes += (f"{target}: {refusals[-1]}; using {chain[n + 1].name}",)
            continue
        except CompileError as e:
            raise _after_refusals(e, refusals, target, backend) from None
        lowered = taken.lowered
        if lowered.refusal is None:
            break
        refusals.append(f"the {backend.name} backend refused the program ({lowered.refusal})")
        nxt = chain[n + 1].name if n + 1 < len(chain) else None
        notes += taken.notes + lowered.ir_after.notes + (f"{target}: {refusals[-1]}; using {nxt}",)
    else:
        taken.attempt.lowered = lowered.ir_after
        raise taken.attempt.internal(InternalError(f"target '{target}': every backend refused the "
                                                   f"program ({lowered.refusal})", before.loc))
    # Triton compiles a tl program at its first launch (or interprets it at each)
    program = taken.attempt.guard_launch(taken.program, tuple(refusals))
    shared = lowered.ir_after.find_plan(SharedMemoryPlan)
    report = CompileReport(
        target=target if backend.config.name == target else f"{target} -> {backend.config.name}",
        backend=backend.name, notes=notes + taken.notes + lowered.ir_after.notes,
        passes=lowered.pass_ms, cache_hit=taken.hit,
        shared_bytes=shared.total_bytes if shared is not None else 0,
        compile_ms=(time.perf_counter() - t0) * 1e3, kernel=before.name)
    if settings.print_source:
        print(lowered.source)
    return CompiledKernel(before, lowered.ir_after, program, report)


MAX_RELOWERINGS = 2
"""How often a backend lowers a kernel again for less shared memory when its toolchain's scratch
did not fit beside the plan (``_take``)."""


@dataclass
class _Taken:
    """One backend's result for one kernel: its lowering (cached), and the loaded program unless
    the backend refused it; ``notes``: why it was lowered again, if it was."""
    attempt: Attempt
    lowered: Lowered
    program: Optional[Program]
    hit: bool                          # every lowering came from the disk cache
    notes: tuple[str, ...] = ()


def _take(before: ir.Kernel, backend: Backend, target: str, store: cache.DiskCache,
          settings: Settings, config: CompileConfig) -> _Taken:
    """``before`` lowered (through the disk cache), emitted and loaded by ``backend``, or its
    refusal. A loaded program that needs more shared memory than ``backend.config.caps.smem_bytes``
    (``Backend.shared_bytes``: the plan plus the toolchain's own scratch, which the passes do not
    see) is lowered again by the backend with ``smem_bytes`` less that scratch, so each pass that
    weighs shared memory (slots, rings, staging) chooses what fits beside it; the reduced config is
    part of the fingerprint, so of the cache key, and a later compile that finds the first
    lowering cached ends in the same second one. At most ``MAX_RELOWERINGS`` times, and only
    while the excess shrinks; then a ``ResourceLimitError`` at the kernel's line (the chain's next
    backend is tried, as for a lowering that outgrew the machine)."""
    limit = backend.config.caps.smem_bytes
    notes: tuple[str, ...] = ()
    hits, excess, why = True, None, ""
    while True:
        attempt = Attempt(before, backend.name, target, settings)
        try:
            payload, hit = store.fetch(_key_parts(before, backend),
                                       lambda: pickle.dumps(_lower(backend, before, attempt)))
        except ResourceLimitError as e:
            if not notes:
                raise
            raise ResourceLimitError(f"{e.message}, lowered again because {why}", e.loc,
                                     e.notes) from None
        lowered: Lowered = pickle.loads(payload)
        hits = hits and hit
        if lowered.refusal is not None:
            return _Taken(attempt, lowered, None, hits, notes)
        attempt.lowered, attempt.source = lowered.ir_after, lowered.source
        with attempt.guard("loading"):
            program = backend.load(lowered.ir_after, lowered.source, dict(config.options))
        needed = backend.shared_bytes(program)
        if needed is None or needed <= limit:
            return _Taken(attempt, lowered, program, hits, notes)
        plan = lowered.ir_after.find_plan(SharedMemoryPlan)
        planned = plan.total_bytes if plan is not None else 0
        why = (f"the {backend.name} backend's compiled program needs {needed} bytes of shared "
               f"memory, {needed - planned} of them its toolchain's scratch beside the plan's "
               f"{planned}, more than the {limit} of target '{target}'")
        if len(notes) == MAX_RELOWERINGS or (excess is not None and needed - limit >= excess):
            tried = f" (lowered for {backend.config.caps.smem_bytes} bytes)" if notes else ""
            raise ResourceLimitError(why + tried, before.loc)
        excess = needed - limit
        budget = min(backend.config.caps.smem_bytes - 1, limit - (needed - planned))
        notes += (f"{target}: {why}; lowered again for {budget} bytes",)
        backend = backend.with_config(backend.config.replace(smem_bytes=budget))
