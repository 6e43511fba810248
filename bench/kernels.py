"""Building tilews kernels for a bench target: a kernel factory (``tilews.ops``, ``examples/``)
re-jitted for the target and without ``out_idx``, so the built kernel writes into the output the
bench passes last (``fn(*inputs, out)``)."""
from __future__ import annotations

import functools
from typing import Callable


@functools.lru_cache(maxsize=None)
def for_target(fn: Callable, target: str):
    """``fn`` (the function under a ``@tilews.jit`` factory, its ``.fn``) as a factory for ``target``;
    one per (fn, target), so its compiled kernels are cached across shapes and rounds."""
    import tilews
    return tilews.jit(target=target)(fn)
