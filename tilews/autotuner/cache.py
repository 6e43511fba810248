"""Keys of tuning results, and the results kept on disk.

* ``call_key(param_names, args, kwargs, drop)``: the in-memory key of one call: its arguments by
  parameter name (positional ones named by ``param_names``; names in ``drop`` left out), tensors as
  (dtype, shape, stride, device type), lists/dicts/sets frozen. Another value must be hashable,
  else ``TypeError`` naming the parameter.
* ``disk_key(fn, configs, call, settings)``: the sha256 (``tilews.cache.cache_key``) of tilews's
  source digest, the device (``torch.cuda`` device name, or "cpu"), the function's source, its
  parameter defaults, the int/float/str/bool/None/enum (dtype) values of its closure and of the
  module globals it reads, the configurations, the call's arguments and ``settings`` (compile and profile
  arguments). ``None`` when any of these has no stable plain form (an object other than a tensor,
  dtype, enum, number, string or container of them; a function without source): then the disk
  is not used.
* ``load(key, configs)`` / ``save(key, record)``: ``<cache dir>/autotuner/<key>.json`` under the
  tilews cache dir (``Settings.from_env()``: ``TILEWS_CACHE_DIR`` or ``~/.cache/tilews``), holding
  the winning configuration's index (and the configuration itself, which ``load`` checks) and its
  latencies. With ``TILEWS_DISABLE_CACHE`` nothing is read or written. An unreadable or
  inconsistent file is a miss; a failed write is a ``CacheWarning`` and tuning goes on.
"""
from __future__ import annotations

import enum
import inspect
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from tilews.cache import CacheWarning, store_file, cache_key, default_cache_dir
from tilews.compiler import sources_digest
from tilews.keys import frozen, tensor_signature
from tilews.lowering.settings import Settings

_FORMAT = 1
_SCALARS = (int, float, str, bool, type(None), enum.Enum)   # closure/global values in the key


class _NotPlain(TypeError):
    """A value with no stable plain form."""


@dataclass(frozen=True)
class Record:
    """A tuning result as stored: which configuration won, with what latencies (ms)."""
    index: int
    latency: Optional[float]
    ref_latency: Optional[float]


def bind(param_names: Sequence[str], args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by parameter name (extra positional ones as ``"*<i>"``)."""
    named = {f"*{i}": a for i, a in enumerate(args[len(param_names):], len(param_names))}
    named.update(zip(param_names, args))
    named.update(kwargs)
    return named


def call_key(call: dict[str, Any]) -> tuple:
    key = []
    for name in sorted(call):
        try:
            key.append((name, frozen(call[name])))
        except TypeError:
            raise TypeError(f"autotune: argument '{name}' ({type(call[name]).__qualname__}) is not "
                            f"hashable, so it cannot be part of the tuning key; list it in "
                            f"do_not_specialize") from None
    return tuple(key)


def plain(value):
    """``value`` as JSON-compatible data (lists, str-keyed dicts, str, int, float, bool, None)."""
    if isinstance(value, torch.Tensor):
        return {"__tensor__": [str(v) if isinstance(v, str) else list(v)
                               for v in tensor_signature(value)]}
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):     # str subclasses too: a str enum (PassConfigKey) is its string
        return str.__str__(value)
    if isinstance(value, (int, float)):
        return int(value) if isinstance(value, int) else float(value)
    if isinstance(value, enum.Enum):
        return {"__enum__": [type(value).__qualname__, plain(value.value)]}
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        items = {}
        for k, v in value.items():
            pk = plain(k)
            items[pk if isinstance(pk, str) else json.dumps(pk, sort_keys=True)] = plain(v)
        return items
    raise _NotPlain(f"{type(value).__qualname__} has no stable plain form")


def disk_key(fn: Callable, configs: list[dict], call: dict[str, Any],
             settings: dict[str, Any]) -> Optional[str]:
    try:
        source = inspect.getsource(fn)
        parts = (sources_digest(), _device_name(), source, plain(_defaults(fn)),
                 plain(_scalars(_closure(fn))), plain(_scalars(_globals_read(fn))),
                 plain(configs), plain(call), plain(settings))
    except (OSError, TypeError):   # no source (OSError), or a value with no plain form
        return None
    return cache_key("tilews-autotune", _FORMAT, *parts)


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def _defaults(fn: Callable) -> dict[str, Any]:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _closure(fn: Callable) -> dict[str, Any]:
    cells = fn.__closure__ or ()
    return {name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, cells)}


def _globals_read(fn: Callable) -> dict[str, Any]:
    """Module globals named in ``fn``'s code or the code of the functions it defines."""
    names, codes = set(), [fn.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if inspect.iscode(c))
    return {n: fn.__globals__[n] for n in names if n in fn.__globals__}


def _scalars(values: dict[str, Any]) -> dict[str, Any]:
    return {n: v for n, v in values.items() if isinstance(v, _SCALARS)}


def _directory(settings: Settings) -> Optional[Path]:
    if settings.disable_cache:
        return None
    return (settings.cache_dir or default_cache_dir()) / "autotuner"


def load(key: str, configs: list[dict]) -> Optional[Record]:
    folder = _directory(Settings.from_env())
    if folder is None:
        return None
    try:
        data = json.loads((folder / f"{key}.json").read_text())
        index = data["config_index"]
        consistent = (data["format"] == _FORMAT and isinstance(index, int)
                      and 0 <= index < len(configs) and data["config"] == plain(configs[index]))
        if consistent:
            return Record(index, data["latency"], data["ref_latency"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def save(key: str, record: Record, config: dict) -> None:
    folder = _directory(Settings.from_env())
    if folder is None:
        return
    data = {"format": _FORMAT, "config_index": record.index, "config": plain(config),
            "latency": record.latency, "ref_latency": record.ref_latency}
    try:
        store_file(folder / f"{key}.json", json.dumps(data, indent=1).encode())
    except OSError as e:
        warnings.warn(f"tilews autotuner: cannot write {folder} ({e}); the result is kept in "
                      f"memory only", CacheWarning, stacklevel=2)
