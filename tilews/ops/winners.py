"""Tuning a ready-made op: timing its candidates (``fastest``) and keeping the winners
(``Winners``).

``fastest`` runs each candidate's compiled callable, drops one that did not compile, raises, or
differs from the reference by more than 1% of the reference's largest magnitude (or 1% relative),
times the others with ``do_bench`` (CUDA events on a GPU, the wall clock on the CPU) and returns
the fastest with its milliseconds; every outcome is logged on ``tilews.ops``; ``RuntimeError``
listing the failures when none is left.

``Winners(op, parse)`` holds one op's winners per key (a tuple of plain values naming the device,
the dtypes and the shape bucket): in this process, and on disk under ``<tilews cache
dir>/ops/<op>/`` as one JSON file per key (``{"format", "key", "winner": str(winner),
"latency_ms"}``, named by a digest of the op, the format, tilews's source digest and the key, so
a new tilews starts afresh). ``get`` reads memory, else the disk (an unreadable file, or one
naming another key or format, is a miss; ``parse`` reads the text back); ``put`` writes both (an
unwritable cache folder is a ``CacheWarning``, the winner kept in memory). With the cache
disabled (``TILEWS_DISABLE_CACHE``) nothing is read from or written to disk.
"""
from __future__ import annotations

import json
import logging
import warnings
from typing import Callable, Generic, Optional, Sequence, TypeVar

import torch

from tilews.cache import CacheWarning, cache_key, default_cache_dir, store_file
from tilews.compiler import sources_digest
from tilews.lowering.settings import Settings
from tilews.profiler import do_bench
from tilews.profiler.compare import assert_outputs_close

logger = logging.getLogger("tilews.ops")
W = TypeVar("W")
FORMAT = 2


def device_name(device: torch.device) -> str:
    """The GPU's name (winners are kept per device model), ``"cpu"`` off a GPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def attempt(fn, *args):
    """``fn(*args)``, or the exception it raised (a candidate that does not compile is dropped
    by ``fastest``)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        return e


def fastest(op: str, space: Sequence[W], runs: Sequence, reference: torch.Tensor, *,
            warmup: float, rep: float) -> tuple[W, float]:
    """(the fastest correct candidate of ``space``, its milliseconds): ``runs[i]`` is candidate
    i's callable of no arguments returning its result (or the exception its build raised);
    ``reference`` a float32 result the others are compared with (module docstring)."""
    atol = 1e-2 * reference.abs().max().item()
    best, best_ms, failures = None, float("inf"), []
    for candidate, run in zip(space, runs):
        try:
            if isinstance(run, Exception):
                raise run
            got = run()
            assert_outputs_close(got, reference.to(got.dtype), atol=atol, rtol=1e-2,
                                 max_mismatched_ratio=0)
            ms = do_bench(run, warmup=warmup, rep=rep, device=reference.device)
        except Exception as e:  # noqa: BLE001  (a failing candidate only drops out)
            failures.append(f"{candidate}: {type(e).__name__}: {e}")
            logger.info("%s: %s dropped (%s: %s)", op, candidate, type(e).__name__, e)
            continue
        logger.info("%s: %s %.4f ms", op, candidate, ms)
        if ms < best_ms:
            best, best_ms = candidate, ms
    if best is None:
        raise RuntimeError(f"{op}(): no candidate ran correctly:\n  " + "\n  ".join(failures))
    return best, best_ms


class Winners(Generic[W]):
    def __init__(self, op: str, parse: Callable[[str], W]):
        self.op, self.parse = op, parse
        self.tuned: dict[tuple, W] = {}

    def get(self, key: tuple, settings: Settings) -> Optional[W]:
        if key in self.tuned:
            return self.tuned[key]
        path = self._file(key, settings)
        if path is None:
            return None
        try:
            data = json.loads(path.read_text())
            if data["format"] == FORMAT and data["key"] == list(key):
                return self.parse(data["winner"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def put(self, key: tuple, winner: W, ms: float, settings: Settings) -> None:
        self.tuned[key] = winner
        path = self._file(key, settings)
        if path is None:
            return
        data = {"format": FORMAT, "key": list(key), "winner": str(winner), "latency_ms": ms}
        try:
            store_file(path, json.dumps(data, indent=1).encode())
        except OSError as e:
            warnings.warn(f"tilews.ops: cannot write {path} ({e}); the {self.op} winner is kept "
                          f"in memory only", CacheWarning, stacklevel=3)

    def _file(self, key: tuple, settings: Settings):
        if settings.disable_cache:
            return None
        digest = cache_key(f"tilews-ops-{self.op}", FORMAT, sources_digest(), *key)
        return (settings.cache_dir or default_cache_dir()) / "ops" / self.op / f"{digest}.json"
