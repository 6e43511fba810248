"""The Triton installed here: its version is part of both Triton backends' fingerprints (their
generated code and compiled stages depend on it)."""
from __future__ import annotations

import functools
import importlib.metadata


@functools.lru_cache(maxsize=None)
def triton_version() -> str:
    """The installed Triton's version, or "absent"."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "absent"
