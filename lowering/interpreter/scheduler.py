"""Runs the roles of a block as cooperative coroutines under a seeded random scheduler.

A role is a generator that yields at each scheduling point: ``SWITCH`` (another role may run, or
an in-flight copy land, before it goes on) or a ``Wait`` (it goes on only once ``wait.ready()``
holds, and is resumed at a moment it does). Asynchronous copies in flight are events posted with
``post``; landing one is a choice like resuming a role.

Contract:
* At every point the scheduler picks uniformly at random (``random.Random``, so a seed fixes the
  interleaving) among the roles that can go on and the copies in flight; ``trace`` gets the name
  of each pick.
* ``run`` returns when every role has finished and every posted copy has landed. If every
  unfinished role is blocked and no copy is in flight, it raises ``DeadlockError`` listing each
  blocked role's wait.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Generator, Optional

from ..errors import DeadlockError
from ..protocol import deadlock_report

SWITCH = object()


@dataclass
class Wait:
    """What a blocked role waits for; ``describe`` says so for a deadlock report."""
    ready: Callable[[], bool]
    describe: Callable[[], str]


@dataclass
class _Role:
    name: str
    steps: Generator
    waiting: Optional[Wait] = None
    done: bool = False


@dataclass
class _Landing:
    name: str
    land: Callable[[], None]


class Scheduler:
    def __init__(self, rng: random.Random, trace: list[str], where: str):
        self.rng = rng
        self.trace = trace
        self.where = where
        self._in_flight: list[_Landing] = []

    def post(self, name: str, land: Callable[[], None]) -> None:
        self._in_flight.append(_Landing(name, land))

    def run(self, roles: list[tuple[str, Generator]]) -> None:
        tasks = [_Role(name, steps) for name, steps in roles]
        while True:
            live = [t for t in tasks if not t.done]
            choices: list = [t for t in live if t.waiting is None or t.waiting.ready()]
            choices += self._in_flight
            if not choices:
                if live:
                    raise DeadlockError(self._deadlock(tasks))
                return
            pick = choices[self.rng.randrange(len(choices))]
            self.trace.append(pick.name)
            if isinstance(pick, _Landing):
                self._in_flight.remove(pick)
                pick.land()
                continue
            pick.waiting = None
            try:
                point = next(pick.steps)
            except StopIteration:
                pick.done = True
                continue
            if isinstance(point, Wait):
                pick.waiting = point

    def _deadlock(self, tasks: list[_Role]) -> str:
        return deadlock_report(self.where, [(t.name, None if t.done else t.waiting.describe())
                                            for t in tasks])
