"""Keys by content, for the caches keyed on call arguments: ``specialization_key`` is the one
key of every ``@tilews.jit`` style's compiled kernels (factory, eager, direct), and ``frozen``
(the form of one value) is also the autotuner's tuning key.

The content rule (``frozen``): a tensor by ``tensor_signature``; lists, tuples, dicts and sets
element by element, tagged with their kind; ``int``, ``float``, ``bool`` and ``str`` by type and
value (``True``, ``1`` and ``1.0`` are three keys); enums (tilews dtypes), torch dtypes and
``None`` as themselves; any other hashable object by its type and its own ``__hash__``/``__eq__``
(content, where its class defines them; identity otherwise: the same object hits, another one
with an equal ``repr`` does not). A value that is not hashable (a class with ``__eq__`` and no
``__hash__``, a ``bytearray``) has no key: ``Unhashable``, naming the argument.
"""
from __future__ import annotations

import enum
from typing import Any, Mapping

import torch

_SCALARS = (bool, int, float, str)


class Unhashable(TypeError):
    """An argument of a specialization has no content hash."""

    def __init__(self, name: str, value: Any):
        self.name = name
        super().__init__(f"argument '{name}' ({type(value).__qualname__}) is not hashable, so it "
                         f"cannot be part of the specialization key")


def frozen(value):
    """A hashable form of ``value`` by content (the module docstring's rule). ``TypeError`` for
    a value that is not hashable."""
    if isinstance(value, torch.Tensor):
        return ("tensor",) + tensor_signature(value)
    if type(value) in _SCALARS:
        return (type(value).__name__, value.hex() if type(value) is float else value)
    if isinstance(value, (list, tuple)):     # a named tuple tagged with its class
        kind = type(value).__name__ if type(value) in (list, tuple) else type(value)
        return (kind, tuple(frozen(v) for v in value))
    if isinstance(value, dict):
        return ("dict", frozenset((frozen(k), frozen(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(frozen(v) for v in value))
    if value is None or isinstance(value, (enum.Enum, torch.dtype)):
        return value
    hash(value)
    return (type(value), value)


_FLAT = (bool, int, float, str, type(None))


def call_key(args: tuple, kwargs: dict):
    """A quick key of a call whose arguments are all flat values (``bool``, ``int``, ``float``,
    ``str``, ``None``, enums, torch dtypes), each with its type (so ``True``, ``1`` and ``1.0``
    differ, as in ``frozen``; floats by their bits); ``None`` for any other call. Two calls with one ``call_key`` have
    one ``specialization_key``: a memo in front of the one key, for the factory style's hot path
    (binding to parameter names costs microseconds)."""
    for v in args:
        if type(v) not in _FLAT and not isinstance(v, (enum.Enum, torch.dtype)):
            return None
    for v in kwargs.values():
        if type(v) not in _FLAT and not isinstance(v, (enum.Enum, torch.dtype)):
            return None
    return (tuple(map(_typed, args)), tuple((k, _typed(v)) for k, v in kwargs.items()))


def _typed(v):
    """A flat value with its type; a float by its bits (``-0.0`` is not ``0.0``)."""
    return (type(v), v.hex() if type(v) is float else v)


def specialization_key(values: Mapping[str, Any]) -> tuple:
    """The key of a specialization made of named values (each style's build-time arguments,
    ``T.const`` values, bound dims, target): ``(name, frozen(value))`` pairs in name order.
    ``Unhashable`` naming the first value that has no content hash."""
    key = []
    for name in sorted(values):
        try:
            key.append((name, frozen(values[name])))
        except TypeError:
            raise Unhashable(name, values[name]) from None
    return tuple(key)


def tensor_signature(t: torch.Tensor) -> tuple:
    """What a cache key keeps of a tensor: dtype, shape, strides, device type."""
    return (str(t.dtype), tuple(t.shape), tuple(t.stride()), t.device.type)
