"""When each shared buffer of a kernel holds a value: its live range in program order.

``live_ranges(kernel)`` numbers the statements in program order (a ``WarpSpecialize`` spans its
roles' statements, each role numbered after the previous one) and gives every shared buffer a
``LiveRange`` from its first access to its last, widened where the program needs the bytes longer:

* a buffer accessed in a loop is live over the whole loop when it is live around the back edge:
  the loop's first access of it is not a write of the whole buffer, or one of its accesses there
  lasts past the statement (a gemm operand, whose wgmma later passes may keep in flight into the
  next iteration; an asynchronous copy's destination, a pipelined ring slot among them);
* a shared -> global copy's source, and a tile ``atomic_add``'s shared tile, stay live until the
  next ``BulkStoreWait`` of its stream (else the stream's end): the store may be a bulk copy, the
  add a bulk reduce-add, still reading it;
* roles run concurrently: a buffer accessed by one role lives in that role's order, and only
  buffers of the same role can be ordered against it. A buffer accessed by several roles is live
  over the whole ``WarpSpecialize``, unless the other roles only hand it over: they access it
  outside loops, before arriving (outside loops) on a barrier that no role of its own order
  arrives on, and its role waits on that barrier's first phase outside loops before touching it;
  it then lives in its role's order from the role's start.

Ranges are compared with ``LiveRange.overlaps``; a range that is not in one role's order overlaps
every range it meets in block order. Barriers have no live range (they never share bytes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from . import ir
from .roles import split
from .traverse import buffers_read, buffers_written, bulk_reduce, exprs_of, subexprs


@dataclass(frozen=True)
class LiveRange:
    """Positions ``start..stop`` (inclusive) in block order; where the buffer lives in one role's
    order only, that role (``(WarpSpecialize position, warp groups)``) and its positions there."""
    start: int
    stop: int
    role: Optional[tuple] = None
    role_start: int = 0
    role_stop: int = 0

    def overlaps(self, other: "LiveRange") -> bool:
        if self.stop < other.start or other.stop < self.start:
            return False
        if self.role is not None and self.role == other.role:
            return not (self.role_stop < other.role_start or other.role_stop < self.role_start)
        return True


@dataclass
class _Access:
    pos: int
    loops: tuple          # enclosing loops of its stream, innermost last
    write: bool
    whole: bool           # a synchronous write of the whole buffer
    lasting: bool         # outlives its statement (gemm operand, asynchronous copy destination)
    store_source: bool    # read by a shared -> global copy or a tile reduce-add


@dataclass
class _Stream:
    """One order of statements: the block's, or one role's."""
    key: Optional[tuple]
    start: int = 0
    stop: int = 0
    accesses: dict = field(default_factory=dict)     # buffer name -> [_Access]
    store_waits: list = field(default_factory=list)
    arrivals: dict = field(default_factory=dict)     # barrier name -> [(pos, in a loop)]
    first_waits: dict = field(default_factory=dict)  # barrier name -> position of a first-phase
                                                     # wait outside loops


class _Walker:
    def __init__(self):
        self.pos = 0
        self.loop_spans: dict[int, list] = {}
        self.streams: list[_Stream] = []
        self.regions: list[tuple] = []               # (ws position, span, role streams)

    def stream(self, body: ir.Seq, key) -> _Stream:
        st = _Stream(key, start=self.pos)
        self.streams.append(st)
        self._seq(body, st, ())
        st.stop = self.pos
        return st

    def _seq(self, body: ir.Seq, st: _Stream, loops: tuple) -> None:
        for s in body.stmts:
            self.pos += 1
            self._stmt(s, st, loops)

    def _stmt(self, s: ir.Stmt, st: _Stream, loops: tuple) -> None:
        if isinstance(s, ir.WarpSpecialize):
            at, lo = self.pos, self.pos
            roles = [self.stream(r.body, (at, r.warpgroups)) for r in s.roles]
            self.regions.append((lo, self.pos, roles))
            return
        if isinstance(s, ir.For):
            lid = len(self.loop_spans)
            self.loop_spans[lid] = [self.pos, None]
            self._seq(s.body, st, loops + (lid,))
            self.loop_spans[lid][1] = self.pos
            return
        if isinstance(s, (ir.Parallel, ir.Role)):
            self._seq(s.body, st, loops)
            return
        if isinstance(s, ir.If):
            self._seq(s.then, st, loops)
            self._seq(s.orelse, st, loops)
            return
        if isinstance(s, ir.BulkStoreWait):
            st.store_waits.append(self.pos)
        if isinstance(s, ir.BarrierArrive):
            st.arrivals.setdefault(s.barrier.buffer.name, []).append((self.pos, bool(loops)))
        if isinstance(s, ir.Copy) and s.barrier is not None:
            st.arrivals.setdefault(s.barrier.buffer.name, []).append((self.pos, bool(loops)))
        if isinstance(s, ir.BarrierWait) and not loops and ir.as_int(s.parity) == 0:
            st.first_waits.setdefault(s.barrier.buffer.name, self.pos)
        for buf, write, whole, lasting, store in _shared_accesses(s):
            st.accesses.setdefault(buf.name, []).append(
                _Access(self.pos, loops, write, whole, lasting, store))


def _shared_accesses(s: ir.Stmt):
    """(buffer, write, whole synchronous write, lasting, store source) per shared access of ``s``."""
    if isinstance(s, (ir.Copy, ir.Gemm)):
        for e in exprs_of(s):      # index expressions reading shared buffers
            for x in subexprs(e):
                if isinstance(x, ir.Load) and x.buffer.scope is ir.Scope.SHARED:
                    yield x.buffer, False, False, False, False
    if isinstance(s, ir.Copy):
        store = s.dst.buffer.scope is ir.Scope.GLOBAL
        asynchronous = s.barrier is not None
        if s.src.buffer.scope is ir.Scope.SHARED:
            yield s.src.buffer, False, False, False, store
        if s.dst.buffer.scope is ir.Scope.SHARED:
            yield s.dst.buffer, True, s.dst.is_whole and not asynchronous, asynchronous, False
        return
    if isinstance(s, ir.Gemm):
        for r in (s.a, s.b):
            if r.buffer.scope is ir.Scope.SHARED:
                yield r.buffer, False, False, True, False
        if s.c.buffer.scope is ir.Scope.SHARED:
            yield s.c.buffer, True, False, True, False
        return
    written = {b.name: b for b in buffers_written(s) if b.scope is ir.Scope.SHARED}
    added = s.value.buffer.name if bulk_reduce(s) else None   # read as a bulk store reads
    for b in buffers_read(s):
        if b.scope is ir.Scope.SHARED and b.name not in written:
            yield b, False, False, False, b.name == added
    whole = isinstance(s, ir.Fill) and s.dst.is_whole
    for b in written.values():
        yield b, True, whole, False, False


def live_ranges(kernel: ir.Kernel) -> dict[str, LiveRange]:
    """Every shared buffer the kernel accesses -> its live range (see the module docstring)."""
    w = _Walker()
    block = w.stream(split(kernel).body, None)
    names = set(block.accesses)
    for _, _, roles in w.regions:
        for st in roles:
            names |= set(st.accesses)
    return {n: _range(w, block, n) for n in sorted(names)}


def _span(w: _Walker, st: _Stream, accesses: list) -> tuple[int, int]:
    """First and last position of ``accesses`` in ``st``, widened by loops and pending stores."""
    lo, hi = min(a.pos for a in accesses), max(a.pos for a in accesses)
    for a in accesses:
        if a.store_source:
            waits = [p for p in st.store_waits if p > a.pos]
            until = waits[0] if waits else st.stop
            hi = max(hi, until)
            for lid in a.loops:
                if w.loop_spans[lid][1] < until:
                    lo = min(lo, w.loop_spans[lid][0])
    for lid in {lid for a in accesses for lid in a.loops}:
        l_lo, l_hi = w.loop_spans[lid]
        inside = sorted((a for a in accesses if lid in a.loops), key=lambda a: a.pos)
        if not inside[0].whole or any(a.lasting for a in inside):
            lo, hi = min(lo, l_lo), max(hi, l_hi)
    return lo, hi


def _range(w: _Walker, block: _Stream, name: str) -> LiveRange:
    outside = block.accesses.get(name, [])
    lo, hi = _span(w, block, outside) if outside else (None, None)
    for ws_lo, ws_hi, roles in w.regions:
        users = [st for st in roles if name in st.accesses]
        if not users:
            continue
        lo, hi = min(ws_lo, lo if lo is not None else ws_lo), max(ws_hi, hi if hi is not None else ws_hi)
        owner = users[0] if len(users) == 1 else _receiver(name, users)
        if owner is None or len(w.regions) > 1:
            return LiveRange(lo, hi)
        r_lo, r_hi = _span(w, owner, owner.accesses[name])
        before = any(a.pos < ws_lo for a in outside)
        after = any(a.pos > ws_hi for a in outside)
        if len(users) > 1 or before:
            r_lo = owner.start
        if after:
            r_hi = owner.stop
        return LiveRange(lo, hi, owner.key, r_lo, r_hi)
    return LiveRange(lo, hi)


def _receiver(name: str, users: list) -> Optional[_Stream]:
    """The one role the others hand ``name`` over to (see the module docstring), or None."""
    for owner in users:
        first = min(a.pos for a in owner.accesses[name])
        if all(_hands_over(name, st, owner, first) for st in users if st is not owner):
            return owner
    return None


def _hands_over(name: str, st: _Stream, owner: _Stream, first: int) -> bool:
    accesses = st.accesses[name]
    if any(a.loops for a in accesses):
        return False
    last = max(a.pos for a in accesses)
    for barrier, arrivals in st.arrivals.items():
        wait = owner.first_waits.get(barrier)
        if wait is None or wait > first or barrier in owner.arrivals:
            continue
        if any(in_loop for _, in_loop in arrivals):
            continue
        if any(pos >= last for pos, _ in arrivals):
            return True
    return False
