"""The on-disk artifact cache: store and fetch bytes by key.

Contract:
* A key is ``cache_key(*parts)``: the sha256 hex digest of a stable, type-tagged text encoding of
  plain values (str, int, float, bool, None, bytes, and tuples, lists and dicts of them; dicts are
  order-insensitive). Anything else is a ``TypeError``: a key never depends on ``id()``, ``repr()``
  of an object or ``PYTHONHASHSEED``.
* The root is ``$TILEWS_CACHE_DIR`` if set, else the platform's user cache dir (``~/.cache/tilews``),
  resolved each time the cache is used. An entry is ``<root>/<key[:2]>/<key>.bin``: one header line
  ``tilews-cache 1 <sha256 of payload> <length>`` and then the payload.
* ``get`` never returns bytes that fail verification: such an entry is deleted, reported with a
  ``CacheCorruptionWarning`` naming its path, and treated as a miss.
* ``put`` is atomic (temp file in the entry's folder, fsync, ``os.replace``): a reader sees the old
  entry or the new one, never a partial one, and a failed put leaves no temp file behind.
* ``get_or_build`` builds at most once across concurrent processes sharing a root (a
  ``filelock.FileLock`` per key; the entry is re-checked under the lock).
* ``TILEWS_DISABLE_CACHE`` on (the truth rule of ``lowering.settings``): ``get`` misses, ``put``
  does nothing and ``get_or_build`` always builds. Both variables are read through
  ``Settings.from_env`` when a ``DiskCache`` without an explicit root / switch is used.
* As the backends' ``ArtifactStore``: ``fetch(parts, build)`` is ``get_or_build`` under
  ``cache_key(*parts)``; ``source_file(text)`` is a file holding ``text`` (content-addressed, written
  atomically) under ``<root>/src`` — or, with the cache disabled, under a private temporary folder of
  this process, so nothing is written to the cache directory.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import pathlib
import re
import shutil
import tempfile
import warnings
from typing import Callable

import filelock

from tilews.lowering.settings import Settings

__all__ = ["CacheCorruptionWarning", "DiskCache", "cache_disabled", "cache_key", "default_cache_dir"]

_MAGIC = b"tilews-cache 1"
_HEADER = re.compile(rb"tilews-cache 1 ([0-9a-f]{64}) ([0-9]+)")
_KEY = re.compile(r"[0-9a-f]{64}")


class CacheCorruptionWarning(UserWarning):
    """A cache entry failed verification; it was deleted and treated as a miss."""


def default_cache_dir() -> pathlib.Path:
    configured = Settings.from_env().cache_dir
    if configured is not None:
        return configured
    try:
        import platformdirs
    except ImportError:  # minimal environments (e.g. a bare GPU image): the XDG default
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return pathlib.Path(base) / "tilews"
    return pathlib.Path(platformdirs.user_cache_dir("tilews", appauthor=False))


def cache_disabled() -> bool:
    return Settings.from_env().disable_cache


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


class DiskCache:
    def __init__(self, root: os.PathLike | str | None = None, disabled: bool | None = None) -> None:
        self._root = None if root is None else pathlib.Path(root)
        self._disabled = disabled

    @classmethod
    def from_settings(cls, settings: Settings) -> "DiskCache":
        return cls(settings.cache_dir if settings.cache_dir is not None else default_cache_dir(),
                   settings.disable_cache)

    @property
    def root(self) -> pathlib.Path:
        return self._root if self._root is not None else default_cache_dir()

    @property
    def disabled(self) -> bool:
        return self._disabled if self._disabled is not None else cache_disabled()

    def _path(self, key: str, suffix: str) -> pathlib.Path:
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"cache key must be a cache_key() digest (64 hex digits), got {key!r}")
        return self.root / key[:2] / f"{key}{suffix}"

    def get(self, key: str) -> bytes | None:
        path = self._path(key, ".bin")
        if self.disabled:
            return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        header, _, payload = data.partition(b"\n")
        match = _HEADER.fullmatch(header)
        if (match is None or int(match[2]) != len(payload)
                or hashlib.sha256(payload).hexdigest().encode() != match[1]):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            warnings.warn(f"tilews cache: deleted corrupted entry {path}", CacheCorruptionWarning,
                          stacklevel=2)
            return None
        return payload

    def put(self, key: str, payload: bytes) -> None:
        path = self._path(key, ".bin")
        if not isinstance(payload, bytes):
            raise TypeError(f"cache payload must be bytes, got {type(payload).__qualname__}")
        if self.disabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        header = b"%s %s %d\n" % (_MAGIC, hashlib.sha256(payload).hexdigest().encode(), len(payload))
        _write_atomically(path, header + payload)

    def get_or_build(self, key: str, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        lock_path = self._path(key, ".lock")
        if self.disabled:
            return build(), False
        payload = self.get(key)
        if payload is not None:
            return payload, True
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(lock_path):
            payload = self.get(key)
            if payload is not None:
                return payload, True
            payload = build()
            self.put(key, payload)
        return payload, False

    # -- the backends' ArtifactStore -------------------------------------------------------------
    def fetch(self, parts: tuple, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        return self.get_or_build(cache_key(*parts), build)

    def source_file(self, text: str, suffix: str = ".py") -> pathlib.Path:
        digest = hashlib.sha256(text.encode()).hexdigest()
        folder = _private_dir() if self.disabled else self.root / "src"
        path = folder / f"{digest}{suffix}"
        if path.exists() and path.read_text() == text:
            return path
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, text.encode())
        return path


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@functools.lru_cache(maxsize=None)
def _private_dir() -> pathlib.Path:
    """A temporary folder of this process, removed at exit."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="tilews-"))
    atexit.register(shutil.rmtree, path, True)
    return path
