"""Hashable forms of call arguments, for the caches keyed on them: the eager ``@tilews.jit``'s
compiled kernels and the autotuner's results."""
from __future__ import annotations

import torch


def frozen(value):
    """A hashable form of ``value``: a tensor by ``tensor_signature``; lists, tuples, dicts and
    sets element by element, tagged with their kind; any other value as it is. ``TypeError`` for
    a value that is not hashable."""
    if isinstance(value, torch.Tensor):
        return ("tensor",) + tensor_signature(value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(frozen(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((repr(k), frozen(v)) for k, v in value.items()))))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(frozen(v) for v in value))
    hash(value)
    return value


def tensor_signature(t: torch.Tensor) -> tuple:
    """What a cache key keeps of a tensor: dtype, shape, strides, device type."""
    return (str(t.dtype), tuple(t.shape), tuple(t.stride()), t.device.type)
