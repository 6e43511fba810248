"""The on-disk artifact cache: store and fetch bytes by key.

Contract:
* A key is ``cache_key(*parts)``: the sha256 hex digest of a stable, type-tagged text encoding of
  plain values (str, int, float, bool, None, bytes, and tuples, lists and dicts of them; dicts are
  order-insensitive). Anything else is a ``TypeError``: a key never depends on ``id()``, ``repr()``
  of an object or ``PYTHONHASHSEED``.
* The root is ``$TILEWS_CACHE_DIR`` if set, else the platform's user cache dir (``~/.cache/tilews``),
  resolved each time the cache is used. An entry is ``<root>/<key[:2]>/<key>.bin``: one header line
  ``tilews-cache 1 <sha256 of payload> <length>`` and then the payload.
* ``get`` never returns bytes that fail verification: such an entry (a bad header, length or
  digest, or a ``.bin`` that is not a regular file: a folder, a FIFO) is removed, reported with a
  ``CacheCorruptionWarning`` naming its path, and treated as a miss. Reading never blocks.
* ``put`` is atomic (temp file in the entry's folder, fsync, ``os.replace``): a reader sees the old
  entry or the new one, never a partial one, and a failed put leaves no temp file behind.
* No ``OSError`` but ``CacheLockTimeout`` ever comes out of the cache. A cache directory that
  cannot be used (not writable, a file, a shard folder that is a file, a full disk, ...) is one
  ``CacheWarning`` per process and root, naming the path and the way out (``TILEWS_CACHE_DIR``,
  ``TILEWS_DISABLE_CACHE=1``); the compile goes on in memory: ``get`` misses, ``put`` is skipped,
  ``get_or_build`` builds, and ``source_file`` uses the private folder below.
* ``get_or_build`` builds at most once across concurrent processes sharing a root (a
  ``filelock.FileLock`` per key: an OS lock, which a dead holder does not keep; the entry is
  re-checked under the lock). Waiting on a lock another process holds is a ``CacheWarning`` after
  ``_LOCK_NOTICE_S`` seconds and a ``CacheLockTimeout`` (a ``TimeoutError`` naming the lock file)
  after ``lock_timeout`` seconds (120 by default).
* ``TILEWS_DISABLE_CACHE`` on (the truth rule of ``lowering.settings``): ``get`` misses, ``put``
  does nothing, ``get_or_build`` always builds, and nothing at all (entries, locks, sources) is
  written under the root. Both variables are read through ``Settings.from_env`` when a
  ``DiskCache`` without an explicit root / switch is used.
* As the backends' ``ArtifactStore``: ``fetch(parts, build)`` is ``get_or_build`` under
  ``cache_key(*parts)``; ``source_file(text)`` is a file holding ``text`` (content-addressed, written
  atomically) under ``<root>/src`` — or, with the cache disabled or unusable, under a private
  temporary folder of this process.
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
import stat
import tempfile
import warnings
from typing import Callable

import filelock

from tilews.lowering.digest import cache_key
from tilews.lowering.settings import Settings

__all__ = ["CacheCorruptionWarning", "CacheLockTimeout", "CacheWarning", "DiskCache", "cache_disabled",
           "cache_key", "default_cache_dir"]

_MAGIC = b"tilews-cache 1"
_HEADER = re.compile(rb"tilews-cache 1 ([0-9a-f]{64}) ([0-9]+)")
_KEY = re.compile(r"[0-9a-f]{64}")
_LOCK_NOTICE_S = 3.0          # waiting longer than this on a build lock is reported
_WAY_OUT = "set TILEWS_CACHE_DIR to a writable folder, or TILEWS_DISABLE_CACHE=1"
_warned_roots: set[pathlib.Path] = set()


class CacheWarning(UserWarning):
    """A problem with the on-disk cache (unusable, a corrupted entry, a long wait on a lock);
    tilews goes on without the cache where it can."""


class CacheCorruptionWarning(CacheWarning):
    """A cache entry failed verification; it was deleted and treated as a miss."""


class CacheLockTimeout(TimeoutError):
    """Another process held an entry's build lock for longer than ``DiskCache.lock_timeout``."""


def default_cache_dir() -> pathlib.Path:
    return Settings.from_env().cache_root()


def cache_disabled() -> bool:
    return Settings.from_env().disable_cache


class DiskCache:
    def __init__(self, root: os.PathLike | str | None = None, disabled: bool | None = None, *,
                 lock_timeout: float = 120.0) -> None:
        self._root = None if root is None else pathlib.Path(root)
        self._disabled = disabled
        self.lock_timeout = lock_timeout

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
            data = _read_regular(path)
        except FileNotFoundError:
            return None
        except OSError as error:
            return self._unusable(error)
        header, _, payload = (data or b"").partition(b"\n")  # not a regular file: no header
        match = _HEADER.fullmatch(header)
        if (match is None or int(match[2]) != len(payload)
                or hashlib.sha256(payload).hexdigest().encode() != match[1]):
            try:
                _remove(path)
            except OSError as error:
                return self._unusable(error)
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
        header = b"%s %s %d\n" % (_MAGIC, hashlib.sha256(payload).hexdigest().encode(), len(payload))
        try:
            store_file(path, header + payload)
        except OSError as error:
            self._unusable(error)

    def get_or_build(self, key: str, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        lock_path = self._path(key, ".lock")
        if self.disabled:
            return build(), False
        payload = self.get(key)
        if payload is not None:
            return payload, True
        lock = self._lock(lock_path)
        try:
            payload = self.get(key)
            if payload is not None:
                return payload, True
            payload = build()
            self.put(key, payload)
            return payload, False
        finally:
            if lock is not None:
                lock.release()

    def _lock(self, path: pathlib.Path) -> filelock.FileLock | None:
        """The build lock at ``path``, held; None where the cache directory cannot hold one."""
        lock, notice = filelock.FileLock(path), min(_LOCK_NOTICE_S, self.lock_timeout)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                lock.acquire(timeout=notice)
            except filelock.Timeout:
                warnings.warn(f"tilews cache: waiting for the lock {path} held by another tilews process",
                              CacheWarning, stacklevel=4)
                lock.acquire(timeout=self.lock_timeout - notice)
        except filelock.Timeout:  # before OSError: a TimeoutError is one
            raise CacheLockTimeout(
                f"tilews cache: gave up after {self.lock_timeout:g} s waiting for the lock {path}, held "
                f"by another tilews process (a stopped or hung one). End that process (`fuser {path}` "
                f"names it; if none does, delete the file), or {_WAY_OUT}") from None
        except OSError as error:
            return self._unusable(error)
        return lock

    def _unusable(self, error: OSError) -> None:
        """Report (once per process and root) that the cache directory failed with ``error``."""
        if self.root not in _warned_roots:
            _warned_roots.add(self.root)
            warnings.warn(f"tilews cache: cannot use the cache directory {self.root} ({error}); "
                          f"compiling in memory. To silence this, {_WAY_OUT}", CacheWarning, stacklevel=3)

    # -- the backends' ArtifactStore -------------------------------------------------------------
    def fetch(self, parts: tuple, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        return self.get_or_build(cache_key(*parts), build)

    def source_file(self, text: str, suffix: str = ".py") -> pathlib.Path:
        data = text.encode()
        name = f"{hashlib.sha256(data).hexdigest()}{suffix}"
        if not self.disabled:
            try:
                return store_file(self.root / "src" / name, data, reuse=True)
            except OSError as error:
                self._unusable(error)
        return store_file(_private_dir() / name, data, reuse=True)


def _read_regular(path: pathlib.Path) -> bytes | None:
    """The bytes of the file at ``path``; None if it is not a regular file (opening a FIFO this way
    does not block)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _remove(path: pathlib.Path) -> None:
    """Remove the file, link or folder at ``path``."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def store_file(path: pathlib.Path, data: bytes, reuse: bool = False) -> pathlib.Path:
    """``path`` holding ``data``, written atomically (``reuse``: unless it already holds them)."""
    with contextlib.suppress(FileNotFoundError):
        if reuse and _read_regular(path) == data:
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, data)
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
