"""tilews.cache: keys, entry verification, atomic writes, environment switches, cross-process builds."""

import dataclasses
import os
import pathlib
import subprocess
import sys
import signal
import textwrap
import time
import warnings

import platformdirs
import pytest

import tilews.cache
from tilews.cache import (CacheCorruptionWarning, CacheLockTimeout, CacheWarning, DiskCache, cache_disabled,
                          cache_key, default_cache_dir)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("TILEWS_CACHE_DIR", raising=False)
    monkeypatch.delenv("TILEWS_DISABLE_CACHE", raising=False)


def entry_path(root: pathlib.Path, key: str) -> pathlib.Path:
    return root / key[:2] / f"{key}.bin"


def all_files(root: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


class Builder:
    def __init__(self, payload: bytes):
        self.payload, self.calls = payload, 0

    def __call__(self) -> bytes:
        self.calls += 1
        return self.payload


# ---- keys -------------------------------------------------------------------------------------

def test_key_is_stable_and_pinned():
    parts = ("gemm", 128, 0.5, True, None, b"\x00\xff", (1, [2, 3]), {"b": 2, "a": 1})
    assert cache_key(*parts) == cache_key(*parts)
    # Pinned: a change of the encoding must be deliberate (it invalidates every user's cache).
    assert cache_key("tilews", 1) == "93b6cc0d1993f6db941862b89987f635e4012b3c41d009bf5f2264a94e47f321"
    assert len(cache_key()) == 64 and set(cache_key()) <= set("0123456789abcdef")


def test_key_ignores_dict_order_and_hash_seed():
    assert cache_key({"a": 1, "b": [2, 3]}) == cache_key({"b": [2, 3], "a": 1})
    code = "from tilews.cache import cache_key; print(cache_key({'x': 1, 'y': 'z', 'w': (1.5, None)}))"
    keys = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True).stdout.strip()
            for seed in ("1", "2")}
    assert keys == {cache_key({"w": (1.5, None), "y": "z", "x": 1})}


def test_key_sensitivity():
    variants = [
        (), (None,), ("",), ("a",), ("b",), ("a", "b"), ("ab",), (("a", "b"),), (["a", "b"],),
        (1,), (True,), (1.0,), ("1",), (b"1",), (0,), (False,), (0.0,), (-0.0,), (float("inf"),),
        (2**70,), ((1, 2),), ([1, 2],), ((1, (2,)),), (((1, 2),),), ({"a": 1},), ({"a": 2},),
        ({"b": 1},), ({1: "a"},), ({"1": "a"},), ({},), ([],), ((),), ("a:b",), ("a", ":b"),
    ]
    keys = [cache_key(*v) for v in variants]
    assert len(set(keys)) == len(variants)


@dataclasses.dataclass(frozen=True)
class Point:
    x: int


@pytest.mark.parametrize("bad", [object(), {1, 2}, frozenset(), bytearray(b"x"), Point(1), len,
                                 [1, object()], {"k": {1}}, {Point(1): 1}])
def test_key_rejects_unsupported_types(bad):
    with pytest.raises(TypeError, match="unsupported type"):
        cache_key("ok", bad)


# ---- get / put --------------------------------------------------------------------------------

def test_miss_then_hit(tmp_path):
    cache, key, payload = DiskCache(tmp_path), cache_key("k"), bytes(range(256)) * 3
    assert cache.get(key) is None
    cache.put(key, payload)
    assert cache.get(key) == payload
    assert entry_path(tmp_path, key).is_file()
    assert DiskCache(tmp_path).get(key) == payload  # another instance on the same root
    cache.put(cache_key("empty"), b"")
    assert cache.get(cache_key("empty")) == b""


def test_get_or_build_builds_once(tmp_path):
    cache, key, build = DiskCache(tmp_path), cache_key("k"), Builder(b"artifact")
    assert cache.get_or_build(key, build) == (b"artifact", False)
    assert cache.get_or_build(key, build) == (b"artifact", True)
    assert build.calls == 1


def test_rejects_bad_keys_and_payloads(tmp_path):
    cache = DiskCache(tmp_path)
    for bad in ("../../etc/passwd", "abc", cache_key().upper(), 7):
        with pytest.raises(ValueError, match="64 hex digits"):
            cache.get(bad)
    with pytest.raises(TypeError, match="must be bytes"):
        cache.put(cache_key(), "text")
    with pytest.raises(TypeError, match="must be bytes"):
        cache.get_or_build(cache_key(), lambda: "text")
    assert not list(tmp_path.rglob("*.bin"))


# ---- corruption -------------------------------------------------------------------------------

def _truncate(data: bytes) -> bytes:
    return data[:-5]


def _flip_payload_byte(data: bytes) -> bytes:
    i = data.index(b"\n") + 10
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]


def _garbage_header(data: bytes) -> bytes:
    return b"\x89PNG garbage" + data[12:]


CORRUPTIONS = {
    "truncated": _truncate,
    "flipped_payload_byte": _flip_payload_byte,
    "garbage_header": _garbage_header,
    "header_only": lambda data: data[:data.index(b"\n") + 1],
    "empty_file": lambda data: b"",
    "trailing_bytes": lambda data: data + b"x",
    "wrong_length_same_payload": lambda data: data.replace(b" 64\n", b" 63\n", 1),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_corrupt_entry_is_a_warned_miss_and_rebuilt(tmp_path, corrupt):
    cache, key, payload = DiskCache(tmp_path), cache_key("corrupt"), b"0123456789abcdef" * 4
    cache.put(key, payload)
    path = entry_path(tmp_path, key)
    tampered = corrupt(path.read_bytes())
    assert tampered != path.read_bytes()
    path.write_bytes(tampered)

    with pytest.warns(CacheCorruptionWarning, match=key):
        assert cache.get(key) is None
    assert not path.exists()

    path.write_bytes(tampered)
    build = Builder(payload)
    with pytest.warns(CacheCorruptionWarning, match=str(path)):
        assert cache.get_or_build(key, build) == (payload, False)
    assert build.calls == 1
    assert cache.get(key) == payload
    assert cache.get_or_build(key, build) == (payload, True)
    assert build.calls == 1


@pytest.mark.timeout(60)  # reading a FIFO entry used to block forever
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_entry_that_is_not_a_file_is_removed_and_rebuilt(tmp_path, kind):
    cache, key, build = DiskCache(tmp_path), cache_key("not a file"), Builder(b"artifact")
    path = entry_path(tmp_path, key)
    path.parent.mkdir()
    if kind == "directory":
        path.mkdir()
        (path / "inside").write_bytes(b"x")
    else:
        os.mkfifo(path)
    with pytest.warns(CacheCorruptionWarning, match=str(path)):
        assert cache.get_or_build(key, build) == (b"artifact", False)
    assert path.is_file() and cache.get(key) == b"artifact"


# ---- broken cache directories -----------------------------------------------------------------

def _root_is_a_file(root, key, monkeypatch):
    root.write_text("not a folder")


def _shard_is_a_file(root, key, monkeypatch):
    root.mkdir()
    (root / key[:2]).write_text("not a folder")


def _permission_denied(root, key, monkeypatch):
    # As root, chmod blocks nothing: deny every open and mkdir under the cache root instead.
    root.mkdir()
    for name in ("open", "mkdir"):
        def denied(path, *args, real=getattr(os, name), **kwargs):
            if str(path).startswith(str(root)):
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, *args, **kwargs)
        monkeypatch.setattr(os, name, denied)


BROKEN_ROOTS = {"root_is_a_file": _root_is_a_file, "shard_is_a_file": _shard_is_a_file,
                "permission_denied": _permission_denied}


@pytest.mark.parametrize("breakage", BROKEN_ROOTS.values(), ids=BROKEN_ROOTS.keys())
def test_unusable_cache_dir_warns_once_and_compiles_in_memory(tmp_path, monkeypatch, breakage):
    root, key, build = tmp_path / "cache", cache_key("broken"), Builder(b"built")
    breakage(root, key, monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = DiskCache(root)
        assert cache.get(key) is None
        cache.put(key, b"skipped")
        assert cache.get_or_build(key, build) == (b"built", False)
        assert DiskCache(root).get_or_build(key, build) == (b"built", False)
        source = cache.source_file("x = 1\n")
    monkeypatch.undo()
    assert build.calls == 2
    assert source.read_text() == "x = 1\n"
    assert (breakage is _shard_is_a_file) == (root in source.parents)  # else the private folder
    warned = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(warned) == 1, warned
    assert str(root) in warned[0] and "TILEWS_CACHE_DIR" in warned[0] and "TILEWS_DISABLE_CACHE=1" in warned[0]


# ---- atomicity --------------------------------------------------------------------------------

def test_put_leaves_only_the_entry_and_replaces(tmp_path):
    cache, key = DiskCache(tmp_path), cache_key("atomic")
    cache.put(key, b"first")
    cache.put(key, b"second, longer than the first")
    assert cache.get(key) == b"second, longer than the first"
    cache.put(key, b"3")
    assert cache.get(key) == b"3"
    assert all_files(tmp_path) == [str(entry_path(tmp_path, key).relative_to(tmp_path))]


def test_failed_put_keeps_old_entry_and_no_temp_file(tmp_path, monkeypatch):
    cache, key = DiskCache(tmp_path), cache_key("atomic")
    cache.put(key, b"old")

    def failing_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(tilews.cache.os, "fsync", failing_fsync)
    with pytest.warns(CacheWarning, match="disk full"):  # never a raw OSError: warned, skipped
        cache.put(key, b"new")
    monkeypatch.undo()
    assert cache.get(key) == b"old"
    assert all_files(tmp_path) == [str(entry_path(tmp_path, key).relative_to(tmp_path))]


# ---- environment ------------------------------------------------------------------------------

def test_cache_dir_env_is_honored_lazily(tmp_path, monkeypatch):
    assert default_cache_dir() == pathlib.Path(platformdirs.user_cache_dir("tilews", appauthor=False))
    cache, key = DiskCache(), cache_key("env")  # created before the variable is set
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path / "a"))
    assert default_cache_dir() == tmp_path / "a"
    cache.put(key, b"in a")
    assert entry_path(tmp_path / "a", key).is_file()
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(tmp_path / "b"))
    assert cache.get(key) is None
    assert DiskCache(tmp_path / "a").get(key) == b"in a"


@pytest.mark.parametrize("value", ["1", "true", "yes", "TRUE"])
def test_disable_env_is_honored(tmp_path, monkeypatch, value):
    cache, key = DiskCache(tmp_path), cache_key("disabled")
    cache.put(key, b"before")
    monkeypatch.setenv("TILEWS_DISABLE_CACHE", value)
    assert cache_disabled()
    assert cache.get(key) is None
    cache.put(cache_key("other"), b"ignored")
    build = Builder(b"fresh")
    assert cache.get_or_build(key, build) == (b"fresh", False)
    assert cache.get_or_build(key, build) == (b"fresh", False)
    assert build.calls == 2
    assert all_files(tmp_path) == [str(entry_path(tmp_path, key).relative_to(tmp_path))]
    monkeypatch.delenv("TILEWS_DISABLE_CACHE")
    assert cache.get(key) == b"before"


@pytest.mark.parametrize("disabled", [False, True])
def test_disabled_cache_writes_nothing_under_its_root(tmp_path, monkeypatch, disabled):
    import torch

    import tilews
    import tilews.language as T

    root = tmp_path / "cache"
    monkeypatch.setenv("TILEWS_CACHE_DIR", str(root))
    monkeypatch.setenv("TILEWS_DISABLE_CACHE", "1" if disabled else "0")

    def add_one(M, N):
        @T.prim_func
        def main(X: T.Tensor((M, N), T.float32), Y: T.Tensor((M, N), T.float32)):
            with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
                for i, j in T.Parallel(16, N):
                    Y[bx * 16 + i, j] = X[bx * 16 + i, j] + 1
        return main

    kernel = tilews.jit(out_idx=[-1], target="triton")(add_one)(32, 8)
    x = torch.randn(32, 8)
    assert torch.equal(kernel(x), x + 1)
    assert root.exists() != disabled  # enabled, the same compile does write there


@pytest.mark.parametrize("value", ["", "0", "false", "no"])
def test_other_disable_values_keep_cache_on(monkeypatch, value):
    monkeypatch.setenv("TILEWS_DISABLE_CACHE", value)
    assert not cache_disabled()


# ---- concurrency ------------------------------------------------------------------------------

WORKER = textwrap.dedent("""
    import os, pathlib, sys, time
    from tilews.cache import DiskCache
    root, key, counter, go = sys.argv[1:5]
    while not os.path.exists(go):
        time.sleep(0.005)

    def build():
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(0.2)
        return f"built by {os.getpid()}".encode()

    payload, hit = DiskCache(pathlib.Path(root)).get_or_build(key, build)
    print(payload.hex(), hit)
""")


def test_concurrent_processes_build_once(tmp_path):
    root, counter, go = tmp_path / "cache", tmp_path / "builds.txt", tmp_path / "go"
    key = cache_key("concurrent")
    src_root = str(pathlib.Path(tilews.cache.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src_root, os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(root), key, str(counter), str(go)],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    time.sleep(0.3)  # let the workers start; they all race once `go` appears
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        payload_hex, hit = out.split()
        results.append((bytes.fromhex(payload_hex), hit == "True"))

    builders = counter.read_text().split()
    assert len(builders) == 1
    assert {payload for payload, _ in results} == {f"built by {builders[0]}".encode()}
    assert sorted(hit for _, hit in results) == [False, True, True, True]
    assert DiskCache(root).get(key) == f"built by {builders[0]}".encode()


HOLDER = textwrap.dedent("""
    import sys, time, filelock
    lock = filelock.FileLock(sys.argv[1])
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
""")


def test_lock_of_a_stopped_process_times_out_and_of_a_dead_one_does_not_block(tmp_path, monkeypatch):
    monkeypatch.setattr(tilews.cache, "_LOCK_NOTICE_S", 0.2)
    cache, key, build = DiskCache(tmp_path, lock_timeout=1.0), cache_key("locked"), Builder(b"artifact")
    lock = tmp_path / key[:2] / f"{key}.lock"
    lock.parent.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        holder.send_signal(signal.SIGSTOP)  # alive but stuck: it keeps the lock
        t0 = time.monotonic()
        with pytest.warns(CacheWarning, match=f"waiting for the lock {lock} held by another tilews process"), \
                pytest.raises(CacheLockTimeout, match=f"after 1 s waiting for the lock {lock}") as info:
            cache.get_or_build(key, build)
        assert 1.0 <= time.monotonic() - t0 < 10
        assert isinstance(info.value, TimeoutError) and "TILEWS_DISABLE_CACHE=1" in str(info.value)
        assert build.calls == 0
    finally:
        holder.kill()  # also ends a stopped process; the OS then drops its lock
        holder.wait()
    assert lock.exists()  # the lock file stays behind, and does not block
    t0 = time.monotonic()
    assert cache.get_or_build(key, build) == (b"artifact", False)
    assert time.monotonic() - t0 < 1.0
