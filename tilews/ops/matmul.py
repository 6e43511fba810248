"""``tilews.ops.matmul(a, b, out_dtype=None)``: C = A @ B for fp16/bf16 A [M, K] and B [K, N],
with the GEMM program and knobs (``Schedule``) picked per shape.

Choosing (once per M bucket, N, K, dtypes and device; ``schedule.bucket``): the tuned winner
kept for that bucket (in memory, else on disk under ``<tilews cache dir>/ops/matmul/``, keyed by
the device name, tilews's source digest, dtypes, N, K and the bucket), else, with
``TILEWS_TUNE=1``, ``tune`` on this call's inputs, else ``schedule.heuristic``. The program is
compiled with a runtime M (``T.dynamic("M")``), so every M of a bucket, and of any bucket that
picks the same schedule, runs the same compiled kernel; split_k launches ``split_k`` then
``split_k_reduce``. CPU tensors run on tilews's interpreter.

Calling: the first call of a (bucket, N, K, dtypes, devices) key checks the arguments (errors name
the argument: ``TypeError`` for a dtype or a non-tensor, ``ValueError`` for shapes and devices)
and stores the runner; later calls do one dict lookup and the kernel's own call. M == 0 or N == 0
gives an empty result, K == 0 zeros. Non-contiguous inputs are copied (``.contiguous()``). No
autograd. Dispatch overhead (``test_dispatch_overhead``, the kernel replaced by a no-op, CPU):
about 1.3 us per call over calling the kernel directly.

``tune(a, b, out_dtype=None)`` compiles ``schedule.candidates`` in parallel, checks each against a
float32 torch product of the same inputs, times each (``tilews.profiler.do_bench``: CUDA events,
or the wall clock on the CPU) and keeps the fastest for the bucket. ``run(a, b, out_dtype,
schedule)`` runs a given schedule; ``matmul_schedule(a, b, out_dtype)`` says which one ``matmul``
uses for such inputs.

Under ``torch.compile`` ``matmul`` is the custom op ``tilews::matmul(Tensor a, Tensor b,
ScalarType? out_dtype=None) -> Tensor`` (a fake implementation gives the [M, N] result's shape,
dtype and device); outside it the op's implementation is called directly (a custom op's dispatch
costs microseconds).
"""
from __future__ import annotations

import functools
import json
import logging
import warnings
from typing import Callable, Optional

import torch

import tilews
import tilews.language as T
from tilews.cache import CacheWarning, cache_key, default_cache_dir, store_file
from tilews.compiler import sources_digest
from tilews.jit import compile_each
from tilews.lowering import dtypes
from tilews.lowering.settings import Settings
from tilews.profiler import do_bench
from tilews.profiler.compare import assert_outputs_close

from . import gemm_programs
from .schedule import Schedule, bucket, candidates, heuristic

logger = logging.getLogger("tilews.ops")

_OPERANDS = (torch.float16, torch.bfloat16)
_OUTPUTS = (torch.float16, torch.bfloat16, torch.float32)
_M = T.dynamic("M")
_FORMAT = 1

Runner = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# _plan_key (bucket(M), K, b.shape, dtypes, out_dtype as given, devices) -> runner: the hot
# path's one lookup; only checked, non-empty argument kinds are stored.
_plans: dict[tuple, Runner] = {}
# (schedule, N, K, dtype, out_dtype, device type) -> runner (one or two compiled kernels)
_kernels: dict[tuple, Runner] = {}
# (schedule, _plan_key) -> runner: ``run``'s one lookup
_scheduled: dict[tuple, Runner] = {}
# tuning key (see _tuning_key) -> the winner tuned in this process
_tuned: dict[tuple, Schedule] = {}


def matmul(a: torch.Tensor, b: torch.Tensor, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``a @ b`` for fp16/bf16 a [M, K] and b [K, N] (the same dtype), in ``out_dtype``
    (float16, bfloat16 or float32; default a's dtype) with float32 accumulation (module
    docstring)."""
    if torch.compiler.is_compiling():
        return torch.ops.tilews.matmul(a, b, out_dtype)
    return _matmul(a, b, out_dtype)


def _matmul(a, b, out_dtype):
    try:
        run = _plans[_plan_key(a, b, out_dtype)]
    except (KeyError, AttributeError, ValueError, TypeError):   # a new kind of call, or a bad one
        return _first_call(a, b, out_dtype)
    return run(a.contiguous(), b.contiguous())


def _plan_key(a, b, out_dtype) -> tuple:
    M, K = a.shape
    return bucket(M), K, b.shape, a.dtype, b.dtype, out_dtype, a.device, b.device


def _first_call(a, b, out_dtype) -> torch.Tensor:
    M, N, K, out = check(a, b, out_dtype)
    if M == 0 or N == 0 or K == 0:
        return torch.zeros(M, N, dtype=out, device=a.device)
    settings = Settings.from_env()
    if settings.tune and _stored(_tuning_key(M, N, K, a.dtype, out, a.device), settings) is None:
        tune(a, b, out_dtype)
    schedule = _choice(M, N, K, a.dtype, out, a.device, settings)
    run = _runner(schedule, N, K, a.dtype, out, a.device.type)
    _plans[_plan_key(a, b, out_dtype)] = run
    return run(a.contiguous(), b.contiguous())


def check(a, b, out_dtype, op: str = "matmul") -> tuple[int, int, int, torch.dtype]:
    """(M, N, K, the output dtype) of ``op(a, b, out_dtype)``, or the error naming the argument.
    Reads only shapes, dtypes and devices (fake tensors do)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}(): '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{op}(): '{name}' must be a 2-d tensor, got {t.dim()}-d "
                             f"{list(t.shape)}")
        if t.dtype not in _OPERANDS or t.dtype != a.dtype:
            raise TypeError(f"{op}(): '{name}' is {t.dtype}; a and b must both be torch.float16 "
                            f"or both torch.bfloat16 (a is {a.dtype})")
    out = a.dtype if out_dtype is None else out_dtype
    if out not in _OUTPUTS:
        raise TypeError(f"{op}(): out_dtype must be torch.float16, torch.bfloat16 or "
                        f"torch.float32, got {out_dtype}")
    (M, K), (K2, N) = a.shape, b.shape
    if K2 != K:
        raise ValueError(f"{op}(): a is [{M}, {K}] but b is [{K2}, {N}]: b must be [K, N] = "
                         f"[{K}, N]")
    if a.device != b.device:
        raise ValueError(f"{op}(): 'b' is on {b.device} but 'a' is on {a.device}")
    return M, N, K, out


def run(a: torch.Tensor, b: torch.Tensor, out_dtype: Optional[torch.dtype], schedule: Schedule) -> torch.Tensor:
    """``a @ b`` by ``schedule``, whatever ``matmul`` would pick (checked as ``matmul``'s, once per
    kind of call like ``matmul``)."""
    try:
        return _scheduled[(schedule, _plan_key(a, b, out_dtype))](a.contiguous(), b.contiguous())
    except (KeyError, AttributeError, ValueError, TypeError):   # a new kind of call, or a bad one
        pass
    if not isinstance(schedule, Schedule):
        raise TypeError(f"run(): schedule must be a tilews.ops.Schedule, got {type(schedule).__name__}")
    M, N, K, out = check(a, b, out_dtype, "run")
    if M == 0 or N == 0 or K == 0:
        return torch.zeros(M, N, dtype=out, device=a.device)
    runner = _scheduled[(schedule, _plan_key(a, b, out_dtype))] = _runner(schedule, N, K, a.dtype, out, a.device.type)
    return runner(a.contiguous(), b.contiguous())


def matmul_schedule(a: torch.Tensor, b: torch.Tensor, out_dtype: Optional[torch.dtype] = None) -> Schedule:
    """The schedule ``matmul`` uses for inputs like these: the tuned winner of their bucket, else
    the heuristic's (this never tunes)."""
    M, N, K, out = check(a, b, out_dtype, "matmul_schedule")
    return _choice(M, N, K, a.dtype, out, a.device, Settings.from_env())


def _choice(M, N, K, dtype, out, device, settings: Settings) -> Schedule:
    """The bucket's tuned winner, else the heuristic's guess for the bucket's M."""
    return (_stored(_tuning_key(M, N, K, dtype, out, device), settings)
            or heuristic(bucket(M), N, K, dtype, out, tilews.num_sms(), device.type == "cuda"))


# --- building -------------------------------------------------------------------------------------
def _runner(schedule: Schedule, N: int, K: int, dtype: torch.dtype, out: torch.dtype,
            device_type: str) -> Runner:
    key = (schedule, N, K, dtype, out, device_type)
    found = _kernels.get(key)
    if found is None:
        found = _kernels[key] = _build(schedule, N, K, dtypes.from_torch(dtype),
                                       dtypes.from_torch(out), device_type)
    return found


def _build(s: Schedule, N: int, K: int, dtype, out, device_type: str) -> Runner:
    """The compiled kernel(s) of ``s`` with a runtime M, as one callable (a, b) -> c."""
    target = "auto" if device_type == "cuda" else "interpret"
    blocks = dict(block_M=s.block_M, block_N=s.block_N, block_K=s.block_K, num_stages=s.num_stages,
                  threads=s.threads)
    if s.program == "split_k":
        partial = _program("split_k", target)(_M, N, K, splits=s.splits, dtype=dtype, **blocks)
        reduce = _program("split_k_reduce", target)(
            _M, N, s.splits, gemm_programs.split_width(N, s.block_N), out_dtype=out)
        return lambda a, b: reduce(partial(a, b))
    knobs = {"tiled": dict(swizzle=s.group),
             "persistent": dict(num_sms=tilews.num_sms(), group_size=s.group),
             "swap_ab": {}}[s.program]
    return _program(s.program, target)(_M, N, K, dtype=dtype, out_dtype=out, **blocks, **knobs)


@functools.lru_cache(maxsize=None)
def _program(name: str, target: str):
    """The ``gemm_programs`` factory ``name`` compiling for ``target``."""
    factory = getattr(gemm_programs, name)
    return factory if target == factory.target else tilews.jit(out_idx=[-1], target=target)(factory.fn)


# --- tuning ---------------------------------------------------------------------------------------
def tune(a: torch.Tensor, b: torch.Tensor, out_dtype: Optional[torch.dtype] = None, *,
         warmup: float = 25, rep: float = 100) -> Schedule:
    """Time ``schedule.candidates`` of this shape's bucket on ``a`` and ``b`` (``warmup`` and
    ``rep``: ``do_bench``'s millisecond budgets) and keep the fastest as the bucket's schedule,
    in this process and on disk; returns it. A candidate that does not compile, raises, or
    differs from a float32 torch product by more than 1% of its largest magnitude (or 1%
    relative) is dropped (logged on ``tilews.ops``); ``RuntimeError`` if none is left."""
    M, N, K, out = check(a, b, out_dtype, "tune")
    if M == 0 or N == 0 or K == 0:
        raise ValueError(f"tune(): nothing to tune in an empty product (M, N, K = {M}, {N}, {K})")
    a, b = a.contiguous(), b.contiguous()
    gpu = a.device.type == "cuda"
    space = candidates(bucket(M), N, K, a.dtype, out, tilews.num_sms(), gpu)
    runners = compile_each(space, lambda s: _attempt(_runner, s, N, K, a.dtype, out, a.device.type))
    reference = torch.matmul(a.float(), b.float())
    atol = 1e-2 * reference.abs().max().item()
    reference = reference.to(out)
    best, best_ms, failures = None, float("inf"), []
    for s, runner in zip(space, runners):
        try:
            if isinstance(runner, Exception):
                raise runner
            assert_outputs_close(runner(a, b), reference, atol=atol, rtol=1e-2, max_mismatched_ratio=0)
            ms = do_bench(lambda: runner(a, b), warmup=warmup, rep=rep, device=a.device)
        except Exception as e:  # noqa: BLE001  (a failing candidate only drops out)
            failures.append(f"{s}: {type(e).__name__}: {e}")
            logger.info("tune: %s dropped (%s: %s)", s, type(e).__name__, e)
            continue
        logger.info("tune: %s %.4f ms", s, ms)
        if ms < best_ms:
            best, best_ms = s, ms
    if best is None:
        raise RuntimeError("tune(): no candidate schedule ran correctly:\n  " + "\n  ".join(failures))
    key = _tuning_key(M, N, K, a.dtype, out, a.device)
    _tuned[key] = best
    _save(key, best, best_ms, Settings.from_env())
    _plans.clear()          # calls planned before pick the winner up at their next call
    return best


def _attempt(fn, *args):
    """``fn(*args)``, or the exception it raised."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001  (a schedule that does not compile is dropped by tune)
        return e


def _tuning_key(M, N, K, dtype, out, device) -> tuple:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return (name, str(dtype), str(out), N, K, bucket(M))


def _file(key: tuple, settings: Settings):
    if settings.disable_cache:
        return None
    digest = cache_key("tilews-ops-matmul", _FORMAT, sources_digest(), *key)
    return (settings.cache_dir or default_cache_dir()) / "ops" / "matmul" / f"{digest}.json"


def _stored(key: tuple, settings: Settings) -> Optional[Schedule]:
    """The bucket's tuned winner: this process's, else the disk's (an unreadable entry is a
    miss)."""
    if key in _tuned:
        return _tuned[key]
    path = _file(key, settings)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        if data["format"] == _FORMAT and data["key"] == list(key):
            return Schedule.from_text(data["schedule"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _save(key: tuple, schedule: Schedule, ms: float, settings: Settings) -> None:
    path = _file(key, settings)
    if path is None:
        return
    data = {"format": _FORMAT, "key": list(key), "schedule": str(schedule), "latency_ms": ms}
    try:
        store_file(path, json.dumps(data, indent=1).encode())
    except OSError as e:
        warnings.warn(f"tilews.ops.tune(): cannot write {path} ({e}); the winner is kept in memory "
                      f"only", CacheWarning, stacklevel=3)


# --- torch.library ---------------------------------------------------------------------------------
@torch.library.custom_op("tilews::matmul", mutates_args=(),
                         schema="(Tensor a, Tensor b, ScalarType? out_dtype=None) -> Tensor")
def _matmul_op(a, b, out_dtype=None):
    return _matmul(a, b, out_dtype)


@_matmul_op.register_fake
def _matmul_fake(a, b, out_dtype=None):
    M, N, _, out = check(a, b, out_dtype)
    return a.new_empty((M, N), dtype=out)
