"""``cache_key(*parts)``: the sha256 hex digest of a stable, type-tagged text encoding of plain
values (str, int, float, bool, None, bytes, and tuples, lists and dicts of them; dicts are
order-insensitive). Anything else is a ``TypeError``: a key never depends on ``id()``, ``repr()``
of an object or ``PYTHONHASHSEED``. The one key of every on-disk cache: the artifact store
(``tilews.cache``), tuned winners, the autotuner, the Metal CPU harness's builds.
"""
from __future__ import annotations

import hashlib


def _encode(value: object) -> str:
    # Every form is type-tagged and length-prefixed or delimited, so distinct values never collide.
    if value is None:
        return "N"
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "T" if value else "F"
    if isinstance(value, int):
        return f"i{int.__repr__(value)};"
    if isinstance(value, float):
        return f"f{float.__repr__(value)};"
    if isinstance(value, str):
        text = str.__str__(value)
        return f"s{len(text)}:{text}"
    if isinstance(value, bytes):
        return f"b{len(value)}:{bytes(value).hex()}"
    if isinstance(value, (tuple, list)):
        tag = "t" if isinstance(value, tuple) else "l"
        return f"{tag}{len(value)}[{''.join(_encode(v) for v in value)}]"
    if isinstance(value, dict):
        items = sorted(_encode(k) + _encode(v) for k, v in value.items())
        return f"d{len(items)}{{{''.join(items)}}}"
    raise TypeError(f"cache_key: unsupported type {type(value).__qualname__}; use str, int, float, "
                    "bool, None, bytes, or tuples/lists/dicts of them")


def cache_key(*parts: object) -> str:
    return hashlib.sha256(_encode(parts).encode("utf-8", "surrogatepass")).hexdigest()
