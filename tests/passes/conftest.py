"""Golden journals for pass tests.

``expect(text)`` compares ``text`` with this test's entry in ``test_<pass>.expected`` next to the
test file. The journal holds one entry per test, keyed by the test's name and sorted:

    === test_name
    <text>

``file.py:123`` is normalized to ``file.py:N``, so moving a test does not churn its golden.
``EXPECTTEST_ACCEPT=1`` writes the new text instead of comparing (under a file lock in the temp
dir, so it works with ``pytest -n``).
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import filelock
import pytest

_HEADER = "=== "
_FILE_LINE = re.compile(r"([\w.-]+\.py):\d+")


def normalize(text: str) -> str:
    return _FILE_LINE.sub(r"\1:N", text).rstrip("\n") + "\n"


def read_journal(path: Path) -> dict[str, str]:
    entries: dict[str, str] = {}
    key = None
    for line in path.read_text().splitlines(keepends=True) if path.exists() else ():
        if line.startswith(_HEADER):
            key = line[len(_HEADER):].strip()
            entries[key] = ""
        elif key is not None:
            entries[key] += line
    return {k: v.rstrip("\n") + "\n" for k, v in entries.items()}


def write_journal(path: Path, entries: dict[str, str]) -> None:
    text = "".join(f"{_HEADER}{k}\n{entries[k]}" for k in sorted(entries))
    tmp = path.with_suffix(".expected.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture
def expect(request):
    """``expect(text)``: assert ``text`` equals this test's journal entry."""
    path = Path(request.node.path).with_suffix(".expected")
    key = request.node.name

    def check(text: str) -> None:
        actual = normalize(text)
        if os.environ.get("EXPECTTEST_ACCEPT") == "1":
            lock = Path(tempfile.gettempdir()) / f"tilews-journal-{path.stem}.lock"
            with filelock.FileLock(str(lock)):
                entries = read_journal(path)
                entries[key] = actual
                write_journal(path, entries)
            return
        expected = read_journal(path).get(key)
        if expected is None:
            pytest.fail(f"no entry '{key}' in {path.name}; run with EXPECTTEST_ACCEPT=1 to record:\n"
                        f"{actual}")
        assert actual == expected, f"{path.name}[{key}] differs (EXPECTTEST_ACCEPT=1 to accept)"
    return check
