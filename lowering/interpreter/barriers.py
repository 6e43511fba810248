"""mbarriers with real phase semantics, and the vector clocks they carry between roles.

Contract:
* A vector clock is a dict actor -> int (missing: 0); ``join(into, other)`` is the pointwise max.
* An ``MBarrier`` counts arriving *threads*: each phase completes once its pending arrivals reach
  0 and no expected transaction bytes are outstanding; arrivals beyond the count spill into the
  next phase. ``passes(parity)`` is true once the phase of that parity has completed, i.e. while
  the current phase's parity differs (a fresh barrier passes parity 1 at once).
* Clocks: ``arrive`` and ``complete_tx`` release a clock into the barrier; at each completion the
  barrier's accumulated clock is published for that phase's parity, and ``released(parity)`` is
  what a wait that passes on ``parity`` acquires (the most recently completed such phase).
  Without checking, clocks are None and ignored.
* ``Barriers`` holds the mbarriers of a block, by barrier buffer and index.
"""
from __future__ import annotations

from typing import Optional

from .. import ir
from ..errors import OutOfBoundsError
from ..protocol import barrier_state
from .messages import at

Clock = dict


def join(into: Clock, other: Clock) -> None:
    for actor, t in other.items():
        if into.get(actor, 0) < t:
            into[actor] = t


class MBarrier:
    def __init__(self, name: str, index: int, count: int):
        self.name = name
        self.index = index
        self.count = count
        self.phase = 0            # completed phases so far; the current phase's parity is phase & 1
        self.pending = count      # arrivals the current phase still needs (negative: spilled)
        self.tx = 0               # transaction bytes expected but not landed
        self._clock: Clock = {}
        self._published: list[Clock] = [{}, {}]

    def passes(self, parity: int) -> bool:
        return (self.phase & 1) != parity

    def released(self, parity: int) -> Clock:
        return self._published[parity]

    def arrive(self, threads: int, clock: Optional[Clock]) -> None:
        if clock is not None:
            join(self._clock, clock)
        self.pending -= threads
        self._complete()

    def expect_tx(self, nbytes: int) -> None:
        self.tx += nbytes

    def complete_tx(self, nbytes: int, clock: Optional[Clock]) -> None:
        if clock is not None:
            join(self._clock, clock)
        self.tx -= nbytes
        self._complete()

    def _complete(self) -> None:
        while self.pending <= 0 and self.tx == 0:
            self._published[self.phase & 1] = dict(self._clock)
            self.phase += 1
            self.pending += self.count

    def describe(self) -> str:
        return barrier_state(self.name, self.index, self.phase, self.pending, self.count, self.tx)


class Barriers:
    def __init__(self):
        self._by_buffer: dict[str, list[MBarrier]] = {}

    def allocate(self, buf: ir.Buffer) -> None:
        self._by_buffer[buf.name] = [MBarrier(buf.name, i, c) for i, c in enumerate(buf.arrive_counts)]

    def get(self, buf: ir.Buffer, index: int, loc: ir.Loc) -> MBarrier:
        bars = self._by_buffer.get(buf.name)
        if bars is None:
            raise RuntimeError(at(loc, f"barrier '{buf.name}' is used before its allocation runs"))
        if not 0 <= index < len(bars):
            raise OutOfBoundsError(at(loc, f"barrier index {index} is outside '{buf.name}' "
                                     f"({len(bars)} barriers)"))
        return bars[index]
