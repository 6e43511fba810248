"""``tilews.ops.matmul(a, b, out_dtype=None)``: C = A @ B for fp16/bf16/fp32 A [M, K] and B [K, N],
with the GEMM program and knobs (``Schedule``) picked per shape.

float32 operands are multiplied as ``torch.matmul`` multiplies them: on tensor cores that round
them to tf32 when ``torch.backends.cuda.matmul.allow_tf32`` is set (read at each call, part of
every key below), exactly otherwise. The choice is the programs' ``T.gemm(precision=...)``
(``"tf32"`` / ``"ieee"``): on Hopper exact float32 never runs on wgmma (``legalize_wgmma``
refuses it; ``tl.dot(input_precision="ieee")``), and the programs' N-major B tile keeps tf32 off
wgmma too (``tl.dot(input_precision="tf32")``). CPU tensors (tilews's interpreter) are exact
either way.

Choosing (once per M bucket, N, K, dtypes and device; ``schedule.bucket``): the tuned winner
kept for that bucket (in memory, else on disk under ``<tilews cache dir>/ops/matmul/``, keyed by
the device name, tilews's source digest, dtypes, N, K and the bucket), else, with
``TILEWS_TUNE=1``, ``tune`` on this call's inputs, else ``schedule.heuristic``. The program is
compiled with a runtime M (``T.dynamic("M")``), so every M of a bucket, and of any bucket that
picks the same schedule, runs the same compiled kernel (but stream_k, which plans a fixed number
of tiles: one kernel per M); split_k launches ``split_k`` then ``split_k_reduce``; split_k_fused
and stream_k are one kernel given this stream's arrival counters (``arrivals``). CPU tensors run
on tilews's interpreter.

Calling: the first call of a kind (each operand's shape, strides, dtype, device and
``requires_grad``, ``out_dtype``, and for float32 operands ``allow_tf32``) checks the arguments (errors name the argument:
``TypeError`` for a dtype or a non-tensor, ``ValueError`` for shapes and devices), plans it (the
runner of its (bucket, N, K, dtypes, devices), chosen as above) and keeps a call for that kind:
the kernel's argument binding fixed to that signature (``Binder.bound``: no signature key or
look-up of its own; TMA operands' alignment is still checked per call) and its launch. A later
call of the kind is one key, one dict lookup and that call: no more than calling the kernel
itself (``test_cached_call_costs_no_more_than_the_kernel``; the launch stubbed, this CPU: 3.1 us
each, of which the output's allocation is 1.9 us). At most ``binding.SIGNATURES`` kinds are kept
(then it starts over). M == 0 or N == 0 gives an empty result, K == 0 zeros. Non-contiguous inputs are
copied (``.contiguous()``).

Autograd: when ``a`` or ``b`` requires grad and grad mode is on, ``matmul`` calls the op
``tilews::matmul`` (below), whose backward is dA = dC @ B^T and dB = A^T @ dC, each by the op
itself (so double backward works) in the operands' dtype, computed only where
``needs_input_grad`` asks (A is saved only for dB, B only for dA). dC is cast to the operands'
dtype first (rounding it when ``out_dtype`` is float32); the programs take row-major operands
only, so B^T and A^T (and a non-contiguous dC) are copied first: one pass over B for dA and over
A for dB. Operands requiring grad under ``torch.no_grad()`` skip the op (their own cached kind).

``tune(a, b, out_dtype=None)`` compiles ``schedule.candidates`` in parallel, checks each against a
float32 torch product of the same inputs, times each (``tilews.profiler.do_bench``: CUDA events,
or the wall clock on the CPU) and keeps the fastest for the bucket. ``run(a, b, out_dtype,
schedule)`` runs a given schedule; ``matmul_schedule(a, b, out_dtype)`` says which one ``matmul``
uses for such inputs.

Under ``torch.compile`` ``matmul`` is the custom op ``tilews::matmul(Tensor a, Tensor b,
ScalarType? out_dtype=None) -> Tensor`` (a fake implementation gives the [M, N] result's shape,
dtype and device; the autograd formula above); outside it, and without autograd, the op's
implementation runs directly (a custom op's dispatch costs microseconds).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch

import tilews
import tilews.language as T
from tilews.binding import remember
from tilews.jit import compile_each
from tilews.lowering import dtypes
from tilews.lowering.settings import Settings
from tilews.pass_config import PassConfigKey

from . import gemm_programs
from .arrivals import arrival_counters
from .schedule import Schedule, bucket, candidates, heuristic
from .winners import Winners, attempt, device_name, fastest


_OPERANDS = (torch.float16, torch.bfloat16, torch.float32)
_OUTPUTS = (torch.float16, torch.bfloat16, torch.float32)
_M = T.dynamic("M")

Call = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# the hot path's one lookup: (a's shape, strides, dtype, device, requires_grad, b's, out_dtype as
# given, tf32 allowed for float32 operands) -> the call for that kind; only checked kinds are stored
_calls: dict[tuple, Call] = {}
# _plan_key (bucket(M), K, b.shape, dtypes, out_dtype as given, devices, precision) -> runner: a
# new kind's plan; only checked, non-empty argument kinds are stored
_plans: dict[tuple, Runner] = {}
# (schedule, N, K, dtype, out_dtype, device type, precision) -> runner
_kernels: dict[tuple, Runner] = {}
# (schedule, and the operands' kind as in _calls) -> the call: ``run``'s one lookup
_scheduled: dict[tuple, Call] = {}
# the tuned schedules per tuning key (see _tuning_key): this process's, and the disk's
_winners = Winners("matmul", Schedule.from_text)


def matmul(a: torch.Tensor, b: torch.Tensor, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``a @ b`` for fp16/bf16/fp32 a [M, K] and b [K, N] (the same dtype), in ``out_dtype``
    (float16, bfloat16 or float32; default a's dtype) with float32 accumulation; float32
    operands in tf32 when ``torch.backends.cuda.matmul.allow_tf32`` is set (module
    docstring)."""
    if torch.compiler.is_compiling():
        return torch.ops.tilews.matmul(a, b, out_dtype)
    try:
        key = (a.shape, a.stride(), a.dtype, a.device, a.requires_grad,
               b.shape, b.stride(), b.dtype, b.device, b.requires_grad, out_dtype,
               _tf32(a.dtype))
        call = _calls[key]
    except KeyError:
        return _first_call(key, a, b, out_dtype)
    except (AttributeError, TypeError):     # not tensors: check() names the argument
        check(a, b, out_dtype)
        raise
    return call(a, b)


def _first_call(key: tuple, a, b, out_dtype) -> torch.Tensor:
    """A new kind of call (``key``): checked, run, and its call kept for the kind."""
    M, N, K, out = check(a, b, out_dtype)
    if a.requires_grad or b.requires_grad:
        call = functools.partial(_autograd, out_dtype=out_dtype)
        result = call(a, b)
    elif M == 0 or N == 0 or K == 0:
        call = functools.partial(_zeros, (M, N), out)
        result = call(a, b)
    else:
        result, call = _plan(a, b, out_dtype, M, N, K, out, _precision(a.dtype, key[-1])).direct(a, b)
    remember(_calls, key, call)
    return result


def _autograd(a, b, out_dtype) -> torch.Tensor:
    """The product of operands at least one of which requires grad: the op (recording its
    backward) while grad mode is on, else the plain product."""
    if torch.is_grad_enabled():
        return torch.ops.tilews.matmul(a, b, out_dtype)
    return matmul(a.detach(), b.detach(), out_dtype)


def _zeros(shape, dtype, a, b) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device=a.device)


def _precision(dtype: torch.dtype, tf32: bool) -> str:
    """``T.gemm``'s precision for operands of ``dtype``: for float32 ``"tf32"`` where
    ``allow_tf32`` (``tf32``) is set, else ``"ieee"``; ``"tf32"``, the default and without
    effect, for 16-bit operands."""
    return "ieee" if dtype is torch.float32 and not tf32 else "tf32"


def _tf32(dtype: torch.dtype) -> bool:
    """Whether operands of ``dtype`` may be rounded to tf32 now: float32 ones, where
    ``allow_tf32`` is set (read at each call; part of the call keys)."""
    return dtype is torch.float32 and torch.backends.cuda.matmul.allow_tf32


def _call_precision(dtype: torch.dtype) -> str:
    """The precision of a call now (``allow_tf32`` read at the call)."""
    return _precision(dtype, _tf32(dtype))


def _plan(a, b, out_dtype, M, N, K, out, precision: str) -> Runner:
    """The runner of checked, non-empty ``a`` and ``b``: chosen once per ``_plan_key`` (with
    ``TILEWS_TUNE=1``, after tuning the bucket if nothing is stored for it)."""
    key = _plan_key(a, b, out_dtype, precision)
    runner = _plans.get(key)
    if runner is None:
        settings = Settings.from_env()
        tuning = _tuning_key(M, N, K, a.dtype, out, a.device, precision)
        if settings.tune and _winners.get(tuning, settings) is None:
            tune(a, b, out_dtype)
        schedule = _choice(M, N, K, a.dtype, out, a.device, settings, precision)
        runner = _plans[key] = _runner(schedule, N, K, a.dtype, out, a.device.type, precision)
    return runner


def _plan_key(a, b, out_dtype, precision: str) -> tuple:
    M, K = a.shape
    return bucket(M), K, b.shape, a.dtype, b.dtype, out_dtype, a.device, b.device, precision


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
            raise TypeError(f"{op}(): '{name}' is {t.dtype}; a and b must both be torch.float16, "
                            f"both torch.bfloat16 or both torch.float32 (a is {a.dtype})")
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
    kind of call, and then called as directly as ``matmul``'s cached calls)."""
    try:
        key = (schedule, a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype,
               b.device, out_dtype, _tf32(a.dtype))
        call = _scheduled[key]
    except KeyError:
        pass
    except (AttributeError, TypeError):     # not tensors, or a schedule that is not hashable
        check(a, b, out_dtype, "run")
        raise
    else:
        return call(a, b)
    if not isinstance(schedule, Schedule):
        raise TypeError(f"run(): schedule must be a tilews.ops.Schedule, got {type(schedule).__name__}")
    M, N, K, out = check(a, b, out_dtype, "run")
    if M == 0 or N == 0 or K == 0:
        call = functools.partial(_zeros, (M, N), out)
        result = call(a, b)
    else:
        precision = _precision(a.dtype, key[-1])
        result, call = _runner(schedule, N, K, a.dtype, out, a.device.type, precision).direct(a, b)
    remember(_scheduled, key, call)
    return result


def matmul_schedule(a: torch.Tensor, b: torch.Tensor, out_dtype: Optional[torch.dtype] = None) -> Schedule:
    """The schedule ``matmul`` uses for inputs like these: the tuned winner of their bucket, else
    the heuristic's (this never tunes)."""
    M, N, K, out = check(a, b, out_dtype, "matmul_schedule")
    return _choice(M, N, K, a.dtype, out, a.device, Settings.from_env(), _call_precision(a.dtype))


def _choice(M, N, K, dtype, out, device, settings: Settings, precision: str) -> Schedule:
    """The bucket's tuned winner, else the heuristic's guess for the bucket's M."""
    return (_winners.get(_tuning_key(M, N, K, dtype, out, device, precision), settings)
            or heuristic(bucket(M), N, K, dtype, out, tilews.num_sms(), device.type == "cuda", precision))


# --- building -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Runner:
    """A schedule's compiled kernels as one callable (a, b) -> c: one kernel, or split_k's
    partial product (a, b) -> w and its reduction w -> c. ``arrivals``: split_k_fused's and
    stream_k's (block_M, block_N); their kernel takes (a, b, arrival counters) and returns
    (w, c)."""
    kernels: tuple
    arrivals: tuple = ()

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = self.kernels[0](a, b, *self._counters(a, b))
        if self.arrivals:           # (w, c)
            out = out[-1]
        for kernel in self.kernels[1:]:
            out = kernel(out)
        return out

    def _counters(self, a: torch.Tensor, b: torch.Tensor) -> tuple:
        if not self.arrivals:
            return ()
        block_M, block_N = self.arrivals
        tiles = -(-a.shape[0] // block_M) * -(-b.shape[1] // block_N)
        return (arrival_counters(a.device, tiles),)

    def direct(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, Call]:
        """``self(a, b)``, and a call doing the same for operands of ``a`` and ``b``'s signature
        (shapes, strides, dtypes, devices): each kernel's binding fixed to its arguments'
        signature (``Kernel.bound``), after copying operands that are not contiguous."""
        ca, cb = a.contiguous(), b.contiguous()
        counters = self._counters(ca, cb)
        args, calls = (ca, cb, *counters), []
        for kernel in self.kernels:
            calls.append(kernel.bound(args))
            args = (calls[-1](*args),)
        if counters:
            # the current stream's counters, at least as many as bound here: a larger tensor
            # (grown since for another kind) keeps this binding's count, which covers the tiles
            (fused,), count, device = calls, counters[0].numel(), ca.device
            call = lambda a, b: fused(a, b, arrival_counters(device, count))   # noqa: E731
        elif len(calls) == 1:
            call = calls[0]
        else:
            partial, reduce = calls
            call = lambda a, b: reduce(partial(a, b))   # noqa: E731
        if ca is a and cb is b:
            return args[0], call
        return args[0], lambda a, b: call(a.contiguous(), b.contiguous())


def _runner(schedule: Schedule, N: int, K: int, dtype: torch.dtype, out: torch.dtype,
            device_type: str, precision: str) -> Runner:
    key = (schedule, N, K, dtype, out, device_type, precision)
    found = _kernels.get(key)
    if found is None:
        found = _kernels[key] = _build(schedule, N, K, dtypes.from_torch(dtype),
                                       dtypes.from_torch(out), device_type, precision)
    return found


def _build(s: Schedule, N: int, K: int, dtype, out, device_type: str, precision: str) -> Runner:
    """The compiled kernel(s) of ``s`` with a runtime M (stream_k's: per M, ``PerM``)."""
    target = "auto" if device_type == "cuda" else "interpret"
    blocks = dict(block_M=s.block_M, block_N=s.block_N, block_K=s.block_K, num_stages=s.num_stages,
                  threads=s.threads, precision=precision)
    program = functools.partial(_program, target=target, registers=s.registers)
    if s.program == "split_k":
        partial = program("split_k")(_M, N, K, splits=s.splits, dtype=dtype, **blocks)
        reduce = _program("split_k_reduce", target)(
            _M, N, s.splits, gemm_programs.split_width(N, s.block_N), out_dtype=out)
        return Runner((partial, reduce))
    if s.program == "split_k_fused":
        fused = program("split_k_fused")(_M, N, K, splits=s.splits, dtype=dtype, out_dtype=out,
                                         **blocks)
        return Runner((fused,), (s.block_M, s.block_N))
    if s.program == "stream_k":
        stream_k = program("stream_k")
        return PerM(lambda M: Runner((stream_k(M, N, K, num_sms=tilews.num_sms(), group_size=s.group,
                                               dtype=dtype, out_dtype=out, **blocks),),
                                     (s.block_M, s.block_N)))
    knobs = {"tiled": dict(swizzle=s.group),
             "persistent": dict(num_sms=tilews.num_sms(), group_size=s.group),
             "swap_ab": {}}[s.program]
    return Runner((program(s.program)(_M, N, K, dtype=dtype, out_dtype=out, **blocks, **knobs),))


class PerM:
    """The runners of a program compiled for each M (stream_k shares out a fixed number of
    tiles), built on first use; called as a ``Runner``."""

    def __init__(self, build: Callable[[int], Runner]):
        self._build, self._runners = build, {}

    def runner(self, M: int) -> Runner:
        found = self._runners.get(M)
        if found is None:
            found = self._runners[M] = self._build(M)
        return found

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.runner(a.shape[0])(a, b)

    def direct(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, Call]:
        return self.runner(a.shape[0]).direct(a, b)


@functools.lru_cache(maxsize=None)
def _program(name: str, target: str, registers: bool = False):
    """The ``gemm_programs`` factory ``name`` compiling for ``target`` (``registers``: with pass
    config ``tl.enable_lower_ldgstg``, ``Schedule.registers``)."""
    factory = getattr(gemm_programs, name)
    if target == factory.target and not registers:
        return factory
    configs = {PassConfigKey.TL_ENABLE_LOWER_LDGSTG: True} if registers else None
    return tilews.jit(out_idx=factory.out_idx, target=target, pass_configs=configs)(factory.fn)


# --- tuning ---------------------------------------------------------------------------------------
def tune(a: torch.Tensor, b: torch.Tensor, out_dtype: Optional[torch.dtype] = None, *,
         warmup: float = 25, rep: float = 100) -> Schedule:
    """Time ``schedule.candidates`` of this shape's bucket on ``a`` and ``b`` (``warmup`` and
    ``rep``: ``do_bench``'s millisecond budgets) and keep the fastest as the bucket's schedule,
    in this process and on disk; returns it. A candidate that does not compile, raises, or
    differs from a float32 torch product by more than 1% of its largest magnitude (or 1%
    relative) is dropped (logged on ``tilews.ops``); ``RuntimeError`` if none is left
    (``winners.fastest``)."""
    M, N, K, out = check(a, b, out_dtype, "tune")
    if M == 0 or N == 0 or K == 0:
        raise ValueError(f"tune(): nothing to tune in an empty product (M, N, K = {M}, {N}, {K})")
    a, b = a.contiguous(), b.contiguous()
    gpu = a.device.type == "cuda"
    precision = _call_precision(a.dtype)
    space = candidates(bucket(M), N, K, a.dtype, out, tilews.num_sms(), gpu, precision)
    runners = compile_each(space, lambda s: attempt(_runner, s, N, K, a.dtype, out, a.device.type,
                                                    precision))
    runs = [r if isinstance(r, Exception) else functools.partial(r, a, b) for r in runners]
    best, best_ms = fastest("tune", space, runs, torch.matmul(a.float(), b.float()),
                            warmup=warmup, rep=rep)
    _winners.put(_tuning_key(M, N, K, a.dtype, out, a.device, precision), best, best_ms,
                 Settings.from_env())
    _plans.clear()          # calls planned before pick the winner up at their next call
    _calls.clear()
    return best


def _tuning_key(M, N, K, dtype, out, device, precision: str) -> tuple:
    """float32 operands' precision is part of the dtype's field (16-bit keys are unchanged)."""
    operands = f"{dtype}/{precision}" if dtype is torch.float32 else str(dtype)
    return (device_name(device), operands, str(out), N, K, bucket(M))


# --- torch.library ---------------------------------------------------------------------------------
@torch.library.custom_op("tilews::matmul", mutates_args=(),
                         schema="(Tensor a, Tensor b, ScalarType? out_dtype=None) -> Tensor")
def _matmul_op(a, b, out_dtype=None):
    return matmul(a.detach(), b.detach(), out_dtype)


@_matmul_op.register_fake
def _matmul_fake(a, b, out_dtype=None):
    M, N, _, out = check(a, b, out_dtype)
    return a.new_empty((M, N), dtype=out)


def _setup_backward(ctx, inputs, output):
    a, b, _ = inputs
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None)


def _backward(ctx, grad):
    """dA = dC @ B^T, dB = A^T @ dC in the operands' dtype, each only where needed."""
    a, b = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[:2]
    dtype = (b if need_a else a).dtype
    grad = grad.to(dtype)
    da = torch.ops.tilews.matmul(grad, b.t(), dtype) if need_a else None
    db = torch.ops.tilews.matmul(a.t(), grad, dtype) if need_b else None
    return da, db, None


_matmul_op.register_autograd(_backward, setup_context=_setup_backward)
