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
"""

from __future__ import annotations

from collections import OrderedDict
from enum import Enum
from typing import Final, Generic, Protocol, TypeVar

from gateway.mirror.counters import LaneCounters

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


class Entry(Generic[T]):
    """One queued copy. `payload` is what the dispatcher needs; the ring never looks inside."""

    __slots__ = (
        "body_id",
        "digest",
        "enqueued_at",
        "nbytes",
        "payload",
        "seq",
        "session",
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
    ) -> None:
        self.seq = seq
        self.payload = payload
        self.body_id = body_id
        self.nbytes = nbytes
        self.digest = digest
        self.session = session
        self.enqueued_at = enqueued_at
        self.waiting = False  # behind an earlier turn of its session, not yet ready


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
    ) -> Offer:
        """Queue one copy; O(1) amortised, never copies the body."""
        if nbytes > self.max_bytes or nbytes > self.budget.limit:
            self.counters.dropped_oversize += 1
            return Offer.OVERSIZE
        self._expire_recent(now)
        if digest in self._pending_digests or digest in self._recent:
            self.counters.deduplicated += 1
            return Offer.DEDUPLICATED
        while self._order and (
            len(self._order) >= self.max_items or self.bytes + nbytes > self.max_bytes
        ):
            self.evict_oldest()
        self.budget.make_room(body_id, nbytes)
        self._seq += 1
        entry = Entry(self._seq, payload, body_id, nbytes, digest, session, now)
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

    def done(self, entry: Entry[T]) -> None:
        """The copy taken by `pop` is finished: release its session's next turn."""
        self.inflight -= 1
        if entry.session is not None:
            self._advance(entry.session)

    def evict_oldest(self) -> None:
        """Drop the oldest queued copy and count it as `dropped_overflow`."""
        _, entry = self._order.popitem(last=False)
        self._drop(entry)

    def resize(self, max_items: int, max_bytes: int, dedup_window_s: float) -> None:
        """Apply new limits, dropping the oldest copies that no longer fit."""
        self.max_items, self.max_bytes, self.dedup_window_s = max_items, max_bytes, dedup_window_s
        while self._order and (len(self._order) > max_items or self.bytes > max_bytes):
            self.evict_oldest()

    def clear(self) -> int:
        """Drop every queued copy (candidate removed or shutdown); returns how many."""
        n = len(self._order)
        while self._order:
            self.evict_oldest()
        self.counters.dropped_on_stop += n
        return n

    def detach(self) -> None:
        """Leave the global budget (after `clear`): this ring will never hold a copy again."""
        self.budget.rings.remove(self)

    def _drop(self, entry: Entry[T]) -> None:
        if entry.waiting:
            assert entry.session is not None
            del self._sessions[entry.session][entry.seq]
        else:
            del self._ready[entry.seq]
            if entry.session is not None:
                self._advance(entry.session)  # it was its session's head: the next turn may go
        self._unqueue(entry)
        self.counters.dropped_overflow += 1

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
