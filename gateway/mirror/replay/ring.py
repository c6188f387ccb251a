"""Bounded, deduplicated, session-ordered ring buffers of mirror copies (pure: no IO, no asyncio).

One `RingBuffer` per candidate holds at most `max_items` copies and `max_bytes` request bytes;
one `MemoryBudget` caps the bytes of all rings together. `offer` is synchronous and O(1)
amortised (plus O(rings) to find a victim when the global budget is full); it never copies a
body, it keeps a reference to the bytes the proxy already read.

Memory accounting is honest about real allocations: a ring counts every copy it holds at full
size against its own `max_bytes`, but the global budget counts each body *object* once, however
many rings hold it (the proxy reads a body once and every candidate's copy refers to it). A
copy is charged from `offer` until a worker takes it (`pop`); bodies being sent are bounded by
the lanes' concurrency instead, and are not in the budget.

Overflow drops the oldest copy — of this ring for its own limits, of the ring holding the most
bytes for the global budget, so one hung candidate cannot starve the others. A copy larger than
either budget is `dropped_oversize`. A body whose xxh3_128 is already queued, or was taken by a
worker within `dedup_window_s`, is `deduplicated`.

Session ordering: copies with a session key are released one at a time per session — a later
turn becomes ready only when the earlier turn's copy is `done` (finished or evicted), so a
candidate sees a conversation's turns in order and never two at once.

Whole sessions: a candidate receives a session's turns as a prefix or not at all. When a copy
of a session leaves without reaching the candidate (dropped on overflow, oversize, or sent and
left unanswered: `done(entry, answered=False)`), the session is broken (`SessionTrail`): its
turns queued behind it and every later turn offered are `shed_session_broken`, never sent. A
turn that skips one (the one between never got here) breaks it too. Copies still queued when
the ring is cleared (removal, shutdown) stay `dropped_overflow`: nothing of the lane is sent
again.

Every copy that leaves without being taken by a worker (overflow, shed, cleared) is handed to
`on_discard` when one is set: a job waiting for that copy's answer (scoring, grading) learns it
will never come, instead of waiting out a deadline.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from enum import Enum
from typing import Final, Generic, Protocol, TypeVar

from gateway.mirror.counters import LaneCounters
from gateway.mirror.replay.order import SessionTrail

__all__ = ["Entry", "MemoryBudget", "Offer", "RingBuffer"]

T = TypeVar("T")

# Digests of copies recently taken by workers, kept for `dedup_window_s`. Bounded so a burst of
# distinct bodies cannot grow it without limit (~150 B per entry, ~2.4 MB per candidate at most);
# past the bound the oldest are forgotten early, which can only let a duplicate through.
RECENT_MAX: Final = 16384


class Offer(Enum):
    ACCEPTED = "accepted"
    DEDUPLICATED = "deduplicated"
    OVERSIZE = "oversize"
    BROKEN = "broken"  # a later turn of a broken session: shed_session_broken


class Entry(Generic[T]):
    """One queued copy. `payload` is what the dispatcher needs; the ring never looks inside."""

    __slots__ = (
        "answered",
        "body_id",
        "digest",
        "enqueued_at",
        "nbytes",
        "payload",
        "seq",
        "session",
        "turn",
        "waiting",
    )

    def __init__(
        self,
        seq: int,
        payload: T,
        body_id: int,
        nbytes: int,
        digest: bytes,
        session: bytes | None,
        enqueued_at: float,
        turn: int = 0,
    ) -> None:
        self.seq = seq
        self.payload = payload
        self.body_id = body_id
        self.nbytes = nbytes
        self.digest = digest
        self.session = session
        self.enqueued_at = enqueued_at
        self.turn = turn
        self.waiting = False  # behind an earlier turn of its session, not yet ready
        self.answered = False  # the sender got the candidate's response head (set by it)


class _Evictable(Protocol):
    bytes: int

    @property
    def items(self) -> int: ...

    def evict_oldest(self) -> None: ...


class MemoryBudget:
    """The process-wide byte budget of all rings; each body object is counted once."""

    __slots__ = ("_holders", "limit", "rings", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._holders: dict[int, int] = {}  # id(body) -> number of queued copies holding it
        self.rings: list[_Evictable] = []

    def cost(self, body_id: int, nbytes: int) -> int:
        """Bytes that holding one more copy of this body would add."""
        return 0 if body_id in self._holders else nbytes

    def hold(self, body_id: int, nbytes: int) -> None:
        held = self._holders.get(body_id, 0)
        if not held:
            self.used += nbytes
        self._holders[body_id] = held + 1

    def release(self, body_id: int, nbytes: int) -> None:
        held = self._holders[body_id] - 1
        if held:
            self._holders[body_id] = held
        else:
            del self._holders[body_id]
            self.used -= nbytes

    def make_room(self, body_id: int, nbytes: int) -> None:
        """Evict the oldest copies of the largest rings until this body fits, if it can."""
        while self.used + self.cost(body_id, nbytes) > self.limit:
            victim = max(self.rings, key=lambda r: r.bytes, default=None)
            if victim is None or not victim.items:
                return
            victim.evict_oldest()


class RingBuffer(Generic[T]):
    """One candidate's queue of copies: bounded, deduplicated, drop-oldest, session-ordered."""

    __slots__ = (
        "_order",
        "_pending_digests",
        "_ready",
        "_recent",
        "_seq",
        "_sessions",
        "budget",
        "bytes",
        "counters",
        "dedup_window_s",
        "inflight",
        "max_bytes",
        "max_items",
        "on_discard",
        "trail",
    )

    def __init__(
        self,
        max_items: int,
        max_bytes: int,
        budget: MemoryBudget,
        counters: LaneCounters,
        dedup_window_s: float,
    ) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.budget = budget
        self.counters = counters
        self.dedup_window_s = dedup_window_s
        self.bytes = 0
        self.inflight = 0
        self._seq = 0
        self._order: OrderedDict[int, Entry[T]] = OrderedDict()  # every queued copy, oldest first
        self._ready: OrderedDict[int, Entry[T]] = OrderedDict()  # queued copies a worker may take
        # Session -> its later turns, queued behind the one that is ready or in flight. A key is
        # present exactly while one copy of that session is ready or in flight.
        self._sessions: dict[bytes, OrderedDict[int, Entry[T]]] = {}
        self._pending_digests: dict[bytes, int] = {}
        self._recent: OrderedDict[bytes, float] = OrderedDict()
        self.trail = SessionTrail()
        # Called with the payload of every queued copy that leaves unsent (module docstring).
        self.on_discard: Callable[[T], None] | None = None
        budget.rings.append(self)

    @property
    def items(self) -> int:
        return len(self._order)

    @property
    def pending(self) -> int:
        """Copies queued or in flight."""
        return len(self._order) + self.inflight

    @property
    def has_ready(self) -> bool:
        return bool(self._ready)

    def offer(
        self,
        payload: T,
        body_id: int,
        nbytes: int,
        digest: bytes,
        session: bytes | None,
        now: float,
        turn: int = 0,
    ) -> Offer:
        """Queue one copy (`turn`: its index in `session`); O(1) amortised, never copies the
        body."""
        if nbytes > self.max_bytes or nbytes > self.budget.limit:
            self.counters.dropped_oversize += 1
            if session is not None:
                self.break_session(session)
            return Offer.OVERSIZE
        self._expire_recent(now)
        if digest in self._pending_digests or digest in self._recent:
            self.counters.deduplicated += 1
            return Offer.DEDUPLICATED
        if session is not None and not self.trail.admit(session, turn):
            self.counters.shed_session_broken += 1
            return Offer.BROKEN
        while self._order and (
            len(self._order) >= self.max_items or self.bytes + nbytes > self.max_bytes
        ):
            self.evict_oldest()
        self.budget.make_room(body_id, nbytes)
        if session is not None and self.trail.broken(session):
            # Making room dropped an earlier copy of this session: a later turn would go
            # headless; a first turn starts it over.
            if turn:
                self.counters.shed_session_broken += 1
                return Offer.BROKEN
            self.trail.admit(session, 0)
        self._seq += 1
        entry = Entry(self._seq, payload, body_id, nbytes, digest, session, now, turn)
        self._order[entry.seq] = entry
        if session is None:
            self._ready[entry.seq] = entry
        elif (queue := self._sessions.get(session)) is not None:
            entry.waiting = True
            queue[entry.seq] = entry
        else:
            self._sessions[session] = OrderedDict()
            self._ready[entry.seq] = entry
        self.bytes += nbytes
        self._pending_digests[digest] = self._pending_digests.get(digest, 0) + 1
        self.budget.hold(body_id, nbytes)
        return Offer.ACCEPTED

    def pop(self, now: float) -> Entry[T] | None:
        """Take the oldest ready copy for sending (it stays `pending` until `done`)."""
        if not self._ready:
            return None
        _, entry = self._ready.popitem(last=False)
        del self._order[entry.seq]
        self._unqueue(entry)
        self._recent[entry.digest] = now
        self._recent.move_to_end(entry.digest)
        if len(self._recent) > RECENT_MAX:
            self._recent.popitem(last=False)
        self.inflight += 1
        return entry

    def done(self, entry: Entry[T], answered: bool = True) -> None:
        """The copy taken by `pop` is finished: release its session's next turn, or, when the
        candidate never answered it, break the session (its queued turns are shed)."""
        self.inflight -= 1
        session = entry.session
        if session is None:
            return
        if not answered:
            self.break_session(session)
            self._shed_waiting(session)
        self._advance(session)

    def break_session(self, session: bytes) -> None:
        """A turn of `session` will never reach the candidate (dropped or shed before it was
        offered here, or here): its later turns are shed, never sent."""
        self.trail.break_(session)

    def evict_oldest(self) -> None:
        """Drop the oldest queued copy and count it as `dropped_overflow`; its session is
        broken, and its turns queued behind it are shed."""
        _, entry = self._order.popitem(last=False)
        self._drop(entry, cascade=True)

    def resize(self, max_items: int, max_bytes: int, dedup_window_s: float) -> None:
        """Apply new limits, dropping the oldest copies that no longer fit."""
        self.max_items, self.max_bytes, self.dedup_window_s = max_items, max_bytes, dedup_window_s
        while self._order and (len(self._order) > max_items or self.bytes > max_bytes):
            self.evict_oldest()

    def clear(self) -> int:
        """Drop every queued copy (candidate removed or shutdown); returns how many."""
        n = len(self._order)
        while self._order:
            _, entry = self._order.popitem(last=False)
            self._drop(entry, cascade=False)
        self.counters.dropped_on_stop += n
        return n

    def detach(self) -> None:
        """Leave the global budget (after `clear`): this ring will never hold a copy again."""
        self.budget.rings.remove(self)

    def _drop(self, entry: Entry[T], cascade: bool) -> None:
        """Count a queued copy (already out of `_order`) `dropped_overflow`; with `cascade`,
        break its session and shed the turns queued behind it."""
        session = entry.session
        if entry.waiting:
            assert session is not None
            del self._sessions[session][entry.seq]
        else:
            del self._ready[entry.seq]
        self._unqueue(entry)
        self.counters.dropped_overflow += 1
        if self.on_discard is not None:
            self.on_discard(entry.payload)
        if session is None:
            return
        if cascade:
            self.break_session(session)
            self._shed_waiting(session)
        if not entry.waiting:
            self._advance(session)  # it was its session's head: the next turn may go

    def _shed_waiting(self, session: bytes) -> None:
        """Shed the turns of a broken session queued behind its head (`shed_session_broken`)."""
        queue = self._sessions.get(session)
        if not queue:
            return
        shed = list(queue.values())
        queue.clear()
        for entry in shed:
            del self._order[entry.seq]
            self._unqueue(entry)
        self.counters.shed_session_broken += len(shed)
        if (discard := self.on_discard) is not None:
            for entry in shed:
                discard(entry.payload)

    def _unqueue(self, entry: Entry[T]) -> None:
        self.bytes -= entry.nbytes
        left = self._pending_digests[entry.digest] - 1
        if left:
            self._pending_digests[entry.digest] = left
        else:
            del self._pending_digests[entry.digest]
        self.budget.release(entry.body_id, entry.nbytes)

    def _advance(self, session: bytes) -> None:
        queue = self._sessions[session]
        if not queue:
            del self._sessions[session]
            return
        _, nxt = queue.popitem(last=False)
        nxt.waiting = False
        self._ready[nxt.seq] = nxt
        # It arrived before the copies now ready, so it goes first.
        self._ready.move_to_end(nxt.seq, last=False)

    def _expire_recent(self, now: float) -> None:
        horizon = now - self.dedup_window_s
        recent = self._recent
        while recent:
            digest = next(iter(recent))
            if recent[digest] > horizon and self.dedup_window_s > 0:
                return
            del recent[digest]
