"""Kernel source -> compiled ``Kernel``: frontend, pass pipeline, emission, caches.

The on-disk cache is keyed by what fully determines the result: the printed IR the frontend
built (plus every statement's source line, which the emitted code cites), the target and the
tilews version. A hit skips the passes and the emitter.
"""
from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from tilews import cache, targets
from tilews.lowering import ir, printer
from tilews.lowering.frontend import KernelSource, build_kernel
from tilews.lowering.passes import lower
from tilews.lowering.target import Target
from tilews.lowering.traverse import walk

from . import __version__
from .backends import emit_source, make_executor
from .kernel import CompileReport, Kernel


@dataclass
class Lowered:
    """What the disk cache stores."""
    target: Target
    ir_after: ir.Kernel
    source: str
    pass_ms: tuple[tuple[str, float], ...] = field(default=())


def _passes(kernel: ir.Kernel, target: Target) -> tuple[ir.Kernel, tuple[tuple[str, float], ...]]:
    times: list[tuple[str, float]] = []
    last = [time.perf_counter()]

    def observe(name: str, _k: ir.Kernel) -> None:
        now = time.perf_counter()
        times.append((name, (now - last[0]) * 1e3))
        last[0] = now

    return lower(kernel, target, observe), tuple(times[1:])


def _lower_with_fallback(kernel: ir.Kernel, target: Target) -> Lowered:
    """Lower for ``target`` and emit. A Hopper program the Gluon path refuses (attr ``backend`` =
    "tl", with the reason in its notes) is compiled from the frontend IR with plain
    ``triton.language``, keeping those notes."""
    after, times = _passes(kernel, target)
    if after.attr("backend") == "tl":
        refused = after
        target = targets.plain_triton()
        after, more = _passes(kernel, target)
        times += more
        for note in refused.notes:
            after = after.with_note(note)
    return Lowered(target, after, emit_source(target, after), times)


def _key(kernel: ir.Kernel, target: Target) -> str:
    lines = tuple((s.loc.file, s.loc.line) for s in walk(kernel.body))
    return cache.cache_key("tilews-kernel", __version__, repr(target), printer.to_text(kernel),
                           kernel.loc.file, lines)


def compile_kernel(src: KernelSource, *, target_name: str, out_idx: Sequence[int] = (),
                   param_specs: Optional[dict[str, Any]] = None,
                   extra_names: Optional[dict[str, Any]] = None,
                   options: Optional[dict[str, Any]] = None,
                   user_params: Optional[Sequence[str]] = None) -> Kernel:
    """``user_params``: the parameters the caller passes or receives, in order (default: all of
    the function's; ``out_idx`` indexes them)."""
    t0 = time.perf_counter()
    sel = targets.select(target_name)
    before = build_kernel(src, param_specs, extra_names)
    frontend_ms = (time.perf_counter() - t0) * 1e3
    target = sel.target
    payload, hit = cache.DiskCache().get_or_build(
        _key(before, target), lambda: pickle.dumps(_lower_with_fallback(before, target)))
    try:
        lowered: Lowered = pickle.loads(payload)
    except Exception:  # a verified entry from an incompatible build: rebuild it
        lowered = _lower_with_fallback(before, target)
        hit = False
    executor = make_executor(lowered.target, lowered.ir_after, lowered.source, options or {})
    report = CompileReport(
        target=lowered.target.name if lowered.target == target else
        f"{target.name} -> {lowered.target.name}", notes=sel.notes + lowered.ir_after.notes,
        passes=(("frontend", frontend_ms),) + lowered.pass_ms, cache_hit=hit,
        shared_bytes=sum(s.buffer.nbytes for s in walk(lowered.ir_after.body)
                         if isinstance(s, ir.Alloc) and s.buffer.scope is ir.Scope.SHARED),
        compile_ms=(time.perf_counter() - t0) * 1e3)
    if os.environ.get("TILEWS_PRINT_SOURCE") == "1":
        print(lowered.source)
    return Kernel(before, lowered.ir_after, user_params or src.param_names, out_idx, executor, report)
