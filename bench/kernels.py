"""Building tilews kernels for a bench target: a kernel factory (``tilews.ops``, ``examples/``)
re-jitted for the target and without ``out_idx``, so the built kernel writes into the output the
bench passes last (``fn(*inputs, out)``)."""
from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Callable


@functools.lru_cache(maxsize=None)
def for_target(fn: Callable, target: str):
    """``fn`` (the function under a ``@tilews.jit`` factory, its ``.fn``) as a factory for ``target``;
    one per (fn, target), so its compiled kernels are cached across shapes and rounds."""
    import tilews
    return tilews.jit(target=target)(fn)


def example(name: str):
    """``examples/<name>.py``: importable from a checkout's root, else loaded from the checkout
    this bench lives in (an installed ``tilews-bench`` run from elsewhere)."""
    try:
        return importlib.import_module(f"examples.{name}")
    except ImportError:
        path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
        if not path.exists():
            raise ImportError(f"tilews's example kernels (examples/{name}.py) are not at {path}; run "
                              f"the bench from a tilews checkout") from None
        spec = importlib.util.spec_from_file_location(f"examples.{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
