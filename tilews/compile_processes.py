"""Compiles of a list of items in forked child processes, whose builds the parent then loads from
the artifact store: ``prebuild(items, compile_one, workers)``.

Contract: ``workers`` children are forked from the calling thread; child ``i`` runs
``compile_one(item)`` for ``items[i::workers]``, one after the other, ignoring every exception
(the parent's own compile of that item reports it), and exits without running the parent's exit
handlers. The parent waits for all of them (each at most ``TIMEOUT_S`` seconds, then it is
killed). Nothing comes back through a pipe: what a child builds lands in the artifact store
(``tilews.cache``: a file lock per key, atomic writes), so the caller then compiles every item
itself and gets the children's builds as cache hits, and the kernels, their failures and their
order are the serial ones whatever the children did. A build costs the parent only its frontend,
passes and emit (attention D128 for ``hopper``: ~0.3 s of ~3 s; the rest is Triton).

Why processes: the heavy part of a compile (Triton's code generator, LLVM, ptxas for
``hopper``) runs one build at a time per process (``triton_ext.passes.checking`` holds a lock:
Triton's stage hook and cache folder are process-wide; under ``TRITON_INTERPRET=1`` one compile
server per process), so threads do not overlap it. A forked child has its own: it starts its own
compile server where one is needed (``triton_ext.gluon.launch`` forgets the parent's at fork).
Forking copies the user's closures, so nothing needs to pickle. A child must not touch CUDA
where the parent has (it cannot be initialized again after a fork: every compile of a child on a
GPU host failed that way, silently, and the parent then built everything itself): it answers the
machine's facts from the parent's ``targets.snapshot``, taken before the fork.

``usable(settings)``: where this applies: ``os.fork`` exists, the artifact store is on (else a
child's build is lost) and ``TILEWS_COMPILE_PROCESSES`` is on (it is off by default).
"""
from __future__ import annotations

import os
import signal
import time
from typing import Callable, Sequence

from tilews import targets
from tilews.lowering.settings import Settings

TIMEOUT_S = 900           # a child still compiling after this long is taken for a hung one


def usable(settings: Settings) -> bool:
    """Whether ``prebuild`` can help here (see the module docstring)."""
    return hasattr(os, "fork") and not settings.disable_cache and settings.compile_processes


def prebuild(items: Sequence, compile_one: Callable, workers: int) -> None:
    """Compile ``items`` in ``workers`` forked children, into the artifact store; wait for them."""
    children, facts = [], targets.snapshot()
    for i in range(min(workers, len(items))):
        pid = os.fork()
        if pid == 0:                                    # the child: build its share, then leave
            try:
                targets.pin(facts)                      # CUDA is not to be touched here
                for item in items[i::workers]:
                    try:
                        compile_one(item)
                    except BaseException:               # noqa: BLE001  (reported by the parent)
                        pass
            finally:
                os._exit(0)
        children.append(pid)
    deadline = time.monotonic() + TIMEOUT_S
    for pid in children:
        _wait(pid, deadline)


def _wait(pid: int, deadline: float) -> None:
    while True:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        time.sleep(0.01)
