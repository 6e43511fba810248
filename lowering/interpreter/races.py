"""Happens-before race detection on shared memory, with vector clocks.

Actors: each role of a block, and for each (issuing role, mbarrier) a *lane* of the asynchronous
copies completing on it; copy n of a lane has epoch (lane, n). A copy on one barrier lands before
the phase it registered on completes, and phases complete in order, so acquiring (lane, n) from
that barrier covers copies 1..n of the lane.

Contract:
* ``access(buf, box, write, loc)`` by the ``current`` actor raises ``RaceError`` if a recorded
  access of ``buf`` by another actor overlaps ``box``, one of the two writes, and the record's
  epoch is not covered by the current actor's clock (not ordered before it by barriers); the
  message names the buffer, both source lines and both actors. Then the access is recorded.
* ``issue_async`` checks and records an asynchronous copy's write *at issue*: the bytes may land
  at any moment until the barrier phase completes, so any access not ordered after that phase
  conflicts with it. It returns the copy's clock, to be released into the barrier on landing.
* ``release`` returns an actor's clock and ticks it (an arrive); ``acquire`` joins a clock in (a
  wait that passed); ``retire`` marks a finished role.
* Records are keyed by (actor, box, kind), keeping the latest epoch (a later access of the same
  actor conflicts with whatever the earlier one did), and pruned once every unfinished role's
  clock covers them (nothing can race with them any more), so long loops stay cheap.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Optional

from .. import ir
from ..errors import RaceError
from .barriers import Clock, join
from .memory import Box
from .messages import at, box_text


@dataclass
class Actor:
    key: Hashable
    name: str
    clock: Clock = field(default_factory=dict)
    live: bool = True


@dataclass(frozen=True)
class _Access:
    actor: Hashable
    time: int
    write: bool
    box: Box
    loc: ir.Loc
    who: str


class RaceTracker:
    _PRUNE_AT = 32

    def __init__(self):
        self.current: Optional[Actor] = None
        self._roles: list[Actor] = []
        self._records: dict[str, dict[tuple, _Access]] = {}
        self._prune_at: dict[str, int] = {}
        self._lanes: dict[Hashable, int] = {}

    def add_role(self, name: str) -> Actor:
        actor = Actor(len(self._roles), name)
        actor.clock[actor.key] = 1
        self._roles.append(actor)
        return actor

    def release(self, actor: Actor) -> Clock:
        snapshot = dict(actor.clock)
        actor.clock[actor.key] += 1
        return snapshot

    def acquire(self, actor: Actor, clock: Clock) -> None:
        join(actor.clock, clock)

    def retire(self, actor: Actor) -> None:
        actor.live = False

    def access(self, buf: ir.Buffer, box: Box, write: bool, loc: ir.Loc) -> None:
        a = self.current
        self._check(buf, box, write, loc, a.clock, a.name, a.key)
        self._record(buf, _Access(a.key, a.clock[a.key], write, box, loc, a.name))

    def issue_async(self, buf: ir.Buffer, box: Box, loc: ir.Loc, issuer: Actor,
                    lane: Hashable) -> Clock:
        n = self._lanes[lane] = self._lanes.get(lane, 0) + 1
        who = f"an asynchronous copy issued by {issuer.name}"
        self._check(buf, box, True, loc, issuer.clock, who, None)
        self._record(buf, _Access(lane, n, True, box, loc, who))
        clock = dict(issuer.clock)
        clock[lane] = n
        return clock

    def _check(self, buf, box, write, loc, clock: Clock, who: str, me: Optional[Hashable]) -> None:
        for r in self._records.get(buf.name, {}).values():
            if (write or r.write) and r.actor != me and clock.get(r.actor, 0) < r.time \
                    and _overlap(r.box, box):
                raise RaceError(at(loc, f"data race on shared buffer '{buf.name}': the "
                                        f"{_kind(write)} of {box_text(box)} by {who} is not "
                                        f"ordered by a barrier with the {_kind(r.write)} of "
                                        f"{box_text(r.box)} by {r.who} at {r.loc}"))

    def _record(self, buf: ir.Buffer, access: _Access) -> None:
        records = self._records.setdefault(buf.name, {})
        records[(access.actor, access.box, access.write)] = access
        limit = self._prune_at.get(buf.name, self._PRUNE_AT)
        if len(records) > limit:
            live = [a.clock for a in self._roles if a.live]
            for key, r in list(records.items()):
                if all(c.get(r.actor, 0) >= r.time for c in live):
                    del records[key]
            self._prune_at[buf.name] = max(self._PRUNE_AT, 2 * len(records))


def _kind(write: bool) -> str:
    return "write" if write else "read"


def _overlap(a: Box, b: Box) -> bool:
    return all(alo < bhi and blo < ahi for (alo, ahi), (blo, bhi) in zip(a, b))
