"""Building tilews kernels for a bench target: a kernel factory (``tilews.ops``, ``examples/``)
re-jitted for the target and without ``out_idx``, so the built kernel writes into the output the
bench passes last (``fn(*inputs, out)``), and the tile-language dtype of a case."""
from __future__ import annotations

import functools
from typing import Callable

import torch


@functools.lru_cache(maxsize=None)
def for_target(fn: Callable, target: str):
    """``fn`` (the function under a ``@tilews.jit`` factory, its ``.fn``) as a factory for ``target``;
    one per (fn, target), so its compiled kernels are cached across shapes and rounds."""
    import tilews
    return tilews.jit(target=target)(fn)


def tilews_dtype(dtype: torch.dtype):
    import tilews.language as T
    return {torch.bfloat16: T.bfloat16, torch.float16: T.float16}[dtype]
