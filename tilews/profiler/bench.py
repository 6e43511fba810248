"""``do_bench``: how long one call of a function takes, in milliseconds (TileLang's
``tilelang.profiler.do_bench``).

1. ``fn()`` once, then a synchronize.
2. An estimate of one call from 5 calls, each after an L2 flush (zeroing a ``cache_size`` MB
   buffer).
3. ``n_warmup = max(1, warmup / estimate)`` and ``n_repeat = max(1, rep / estimate)``: ``warmup``
   and ``rep`` are millisecond budgets, unless ``_n_warmup`` / ``_n_repeat`` (> 0) give the counts.
   With ``early_stop_baseline``, an estimate above it is returned at once (the autotuner's early
   stop).
4. ``n_warmup`` calls, then ``n_repeat`` timed ones, aggregated by ``return_mode`` or ``quantiles``.

Clocks: on a CUDA device, ``backend="event"`` times each call with CUDA events after a flush;
``"cupti"`` reads the kernels' device time from ``torch.profiler`` (minus the flushes, profiled
alone; events where the profiler records no device activity); ``"cudagraph"`` replays a graph of
``n_repeat`` calls 10 times. Without CUDA, or with ``device="cpu"``, every backend is the wall
clock (``time.perf_counter``) with the same counts, and no flush.
"""
from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from typing import Callable, Optional, Sequence, Union

import torch

BACKENDS = ("event", "cupti", "cudagraph")
RETURN_MODES = ("min", "max", "mean", "median")
_ESTIMATE_CALLS = 5
_GRAPH_REPLAYS = 10
_AGGREGATE = {"min": min, "max": max, "mean": statistics.fmean, "median": statistics.median}


def do_bench(fn: Callable[[], object], warmup: float = 25, rep: float = 100, _n_warmup: int = 0,
             _n_repeat: int = 0, quantiles: Optional[Sequence[float]] = None,
             fast_flush: bool = True, backend: str = "event", return_mode: str = "mean",
             device: Union[int, str, torch.device, None] = None, cache_size: int = 256,
             early_stop_baseline: Optional[float] = None) -> Union[float, list[float]]:
    """Milliseconds per call of ``fn`` (module docstring); a list of floats for two or more
    ``quantiles`` (one quantile: a float, as TileLang). ``device``: a CUDA device (index, name or
    ``torch.device``) or ``"cpu"``; default the current CUDA device, else the CPU."""
    _check_choice("backend", backend, BACKENDS)
    _check_choice("return_mode", return_mode, RETURN_MODES)
    if quantiles is not None and not all(0 <= q <= 1 for q in quantiles):
        raise ValueError(f"do_bench(quantiles=...): each quantile must lie in [0, 1], got {list(quantiles)}")
    cuda = _cuda_device(device)
    with torch.cuda.device(cuda) if cuda is not None else contextlib.nullcontext():
        clock = _WallClock() if cuda is None else _EventClock(cache_size, fast_flush)
        fn()
        clock.sync()
        estimate = max(clock.total(fn, _ESTIMATE_CALLS) / _ESTIMATE_CALLS, 1e-6)
        if early_stop_baseline is not None and estimate > early_stop_baseline:
            return _aggregate([estimate], quantiles, return_mode)
        n_warmup = _n_warmup if _n_warmup > 0 else max(1, int(warmup / estimate))
        n_repeat = _n_repeat if _n_repeat > 0 else max(1, int(rep / estimate))
        for _ in range(n_warmup):
            fn()
        if cuda is None or backend == "event":
            samples = clock.each(fn, n_repeat)
        elif backend == "cupti":
            samples = _cupti(fn, clock, n_repeat)
        else:
            samples = _cudagraph(fn, clock, n_repeat)
    return _aggregate(samples, quantiles, return_mode)


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"do_bench({name}=...) must be one of {', '.join(map(repr, choices))}; "
                         f"got {value!r}")


def _cuda_device(device) -> Optional[int]:
    """The CUDA device index to time on; None: the CPU (wall clock)."""
    if device is None:
        return torch.cuda.current_device() if torch.cuda.is_available() else None
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if d.type == "cpu":
        return None
    if d.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"do_bench(device=...): {device!r} is not a usable CUDA device or 'cpu'"
                         f"{'' if torch.cuda.is_available() else ' (no CUDA here)'}")
    return d.index if d.index is not None else torch.cuda.current_device()


def _aggregate(samples: list[float], quantiles, return_mode: str) -> Union[float, list[float]]:
    if quantiles is None:
        return float(_AGGREGATE[return_mode](samples))
    values = torch.quantile(torch.tensor(samples, dtype=torch.float64),
                            torch.tensor(list(quantiles), dtype=torch.float64)).tolist()
    return values[0] if len(values) == 1 else values


class _WallClock:
    """Host wall-clock time (the CPU paths: tilews's interpreter, Triton's CPU interpreter)."""

    def sync(self) -> None:
        pass

    def total(self, fn, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) * 1e3

    def each(self, fn, n: int) -> list[float]:
        return [self.total(fn, 1) for _ in range(n)]


class _EventClock:
    """CUDA events on the current stream, each timed call preceded by an L2 flush."""

    def __init__(self, cache_size_mb: int, fast_flush: bool):
        dtype = torch.int32 if fast_flush else torch.int8
        self.cache = torch.empty(cache_size_mb * (1 << 20) // dtype.itemsize, dtype=dtype, device="cuda")

    def sync(self) -> None:
        torch.cuda.synchronize()

    def flush(self) -> None:
        self.cache.zero_()

    def total(self, fn, n: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            self.flush()
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def each(self, fn, n: int) -> list[float]:
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(n)]
        for start, end in pairs:
            self.flush()
            start.record()
            fn()
            end.record()
        self.sync()
        return [start.elapsed_time(end) for start, end in pairs]


def _device_ms(fn, n: int) -> float:
    """The device (kernel) time of ``n`` calls of ``fn`` by ``torch.profiler``, in ms; 0 where
    the profiler recorded no device activity."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3


def _cupti(fn, clock: _EventClock, n: int) -> list[float]:
    def flushed():
        clock.flush()
        fn()
    try:
        with_flush, flush_only = _device_ms(flushed, n), _device_ms(clock.flush, n)
    except RuntimeError as e:   # no CUPTI in this build or environment
        with_flush, flush_only, why = 0.0, 0.0, str(e)
    else:
        why = "it recorded no device activity"
    if with_flush <= flush_only:
        warnings.warn(f"do_bench(backend='cupti'): torch.profiler gave no kernel times ({why}); "
                      f"timing with CUDA events instead", RuntimeWarning, stacklevel=3)
        return clock.each(fn, n)
    return [(with_flush - flush_only) / n]


def _cudagraph(fn, clock: _EventClock, n: int) -> list[float]:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    clock.sync()
    return [ms / n for ms in clock.each(graph.replay, _GRAPH_REPLAYS)]
