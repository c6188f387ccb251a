"""RingBuffer and MemoryBudget: bounds, accounting, dedup and session order (pure, no IO)."""

from __future__ import annotations

from collections import defaultdict

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gateway.mirror.counters import LaneCounters
from gateway.mirror.replay.ring import RECENT_MAX, Entry, MemoryBudget, Offer, RingBuffer


def _ring(
    budget: MemoryBudget, items: int = 4, nbytes: int = 1000, window: float = 10.0
) -> RingBuffer[str]:
    return RingBuffer(items, nbytes, budget, LaneCounters(), window)


def _offer(
    ring: RingBuffer[str],
    body: bytes,
    now: float = 0.0,
    session: bytes | None = None,
    turn: int = 0,
) -> Offer:
    return ring.offer(body.decode(), id(body), len(body), body, session, now, turn)


def test_drop_oldest_on_item_overflow() -> None:
    """A full ring drops its oldest copy for a new one and counts it as overflow."""
    ring = _ring(MemoryBudget(10_000), items=2)
    bodies = [b"a" * 10, b"b" * 10, b"c" * 10]
    for body in bodies:
        assert _offer(ring, body) is Offer.ACCEPTED
    assert ring.items == 2 and ring.counters.dropped_overflow == 1
    first = ring.pop(1.0)
    assert first is not None and first.payload == "b" * 10


def test_byte_budget_and_oversize() -> None:
    """The byte cap evicts oldest copies, and a copy larger than the cap is oversize."""
    ring = _ring(MemoryBudget(10_000), items=100, nbytes=100)
    assert _offer(ring, b"x" * 60) is Offer.ACCEPTED
    assert _offer(ring, b"y" * 60) is Offer.ACCEPTED
    assert ring.bytes == 60 and ring.counters.dropped_overflow == 1
    assert _offer(ring, b"z" * 101) is Offer.OVERSIZE
    assert ring.counters.dropped_oversize == 1 and ring.bytes == 60


def test_dedup_pending_and_recently_sent() -> None:
    """Identical bodies are deduplicated while queued and for the window after being sent."""
    ring = _ring(MemoryBudget(10_000), window=5.0)
    body = b"same body"
    assert _offer(ring, body, 0.0) is Offer.ACCEPTED
    assert _offer(ring, bytes(body), 0.5) is Offer.DEDUPLICATED
    entry = ring.pop(1.0)
    assert entry is not None
    ring.done(entry)
    assert _offer(ring, body, 5.9) is Offer.DEDUPLICATED
    assert _offer(ring, body, 6.1) is Offer.ACCEPTED
    assert ring.counters.deduplicated == 2


def test_zero_window_dedups_only_pending() -> None:
    """With dedup_window_s = 0 a body can be queued again as soon as it was taken."""
    ring = _ring(MemoryBudget(10_000), window=0.0)
    assert _offer(ring, b"q", 0.0) is Offer.ACCEPTED
    assert ring.pop(0.0) is not None
    assert _offer(ring, b"q", 0.0) is Offer.ACCEPTED


def test_recent_digests_are_bounded() -> None:
    """The recently-sent digest set never grows past RECENT_MAX."""
    ring = _ring(MemoryBudget(10**9), items=RECENT_MAX + 10, window=1e9)
    for i in range(RECENT_MAX + 5):
        _offer(ring, str(i).encode())
        entry = ring.pop(0.0)
        assert entry is not None
        ring.done(entry)
    assert len(ring._recent) == RECENT_MAX


def test_shared_body_is_counted_once_globally() -> None:
    """One body queued to two rings costs its size once in the global budget."""
    budget = MemoryBudget(150)
    a, b = _ring(budget), _ring(budget)
    body = b"p" * 100
    assert _offer(a, body) is Offer.ACCEPTED
    assert _offer(b, body) is Offer.ACCEPTED
    assert budget.used == 100 and a.bytes == b.bytes == 100
    a.evict_oldest()
    assert budget.used == 100
    b.evict_oldest()
    assert budget.used == 0


def test_global_budget_evicts_from_largest_ring() -> None:
    """When the shared budget is full, the ring holding the most bytes gives up its oldest."""
    budget = MemoryBudget(300)
    hog, small = _ring(budget, items=10), _ring(budget, items=10)
    for i in range(3):
        _offer(hog, bytes([65 + i]) * 100)
    assert budget.used == 300
    assert _offer(small, b"s" * 50) is Offer.ACCEPTED
    assert hog.items == 2 and hog.counters.dropped_overflow == 1
    assert small.counters.dropped_overflow == 0 and budget.used == 250


def test_session_turns_are_released_in_order_one_at_a_time() -> None:
    """A later turn of a session is not ready until the earlier turn's copy is done."""
    ring = _ring(MemoryBudget(10_000), items=10)
    _offer(ring, b"s1-t0", session=b"s1")
    _offer(ring, b"s1-t1", session=b"s1")
    _offer(ring, b"other")
    first = ring.pop(0.0)
    second = ring.pop(0.0)
    assert first is not None and second is not None
    assert (first.payload, second.payload) == ("s1-t0", "other")
    assert ring.pop(0.0) is None
    ring.done(first)
    third = ring.pop(0.0)
    assert third is not None and third.payload == "s1-t1"


def test_evicting_a_session_head_sheds_the_rest_of_the_session() -> None:
    """Dropping a session's queued first turn sheds its queued and later turns, never sent."""
    ring = _ring(MemoryBudget(10_000), items=2)
    assert _offer(ring, b"t0", session=b"s", turn=0) is Offer.ACCEPTED
    assert _offer(ring, b"t1", session=b"s", turn=1) is Offer.ACCEPTED
    # Making room for t2 evicts t0 (the ready head): t1 is shed with it, t2 refused.
    assert _offer(ring, b"t2", session=b"s", turn=2) is Offer.BROKEN
    assert ring.pop(0.0) is None and ring.items == 0 and ring.bytes == 0
    c = ring.counters
    assert (c.dropped_overflow, c.shed_session_broken) == (1, 2)
    assert _offer(ring, b"t3", session=b"s", turn=3) is Offer.BROKEN
    assert _offer(ring, b"new", session=b"s", turn=0) is Offer.ACCEPTED  # it starts over


def test_unanswered_turn_breaks_its_session() -> None:
    """A turn the candidate never answered sheds the turns queued behind it and later ones."""
    ring = _ring(MemoryBudget(10_000), items=10)
    _offer(ring, b"t0", session=b"s", turn=0)
    _offer(ring, b"t1", session=b"s", turn=1)
    head = ring.pop(0.0)
    assert head is not None
    ring.done(head, answered=False)
    assert ring.pop(0.0) is None and ring.items == 0 and ring.pending == 0
    assert _offer(ring, b"t2", session=b"s", turn=2) is Offer.BROKEN
    assert ring.counters.shed_session_broken == 2


def test_a_skipped_turn_or_an_oversize_one_breaks_the_session() -> None:
    """A turn that skips one, or one too large to queue, sheds the session's later turns."""
    ring = _ring(MemoryBudget(10_000), items=10, nbytes=100)
    assert _offer(ring, b"a0", session=b"a", turn=0) is Offer.ACCEPTED
    assert _offer(ring, b"a2", session=b"a", turn=2) is Offer.BROKEN
    assert _offer(ring, b"a1", session=b"a", turn=1) is Offer.BROKEN
    assert _offer(ring, b"x" * 101, session=b"b", turn=0) is Offer.OVERSIZE
    assert _offer(ring, b"b1", session=b"b", turn=1) is Offer.BROKEN
    # A session first seen at a later turn (begun elsewhere) is taken, and a retry too.
    assert _offer(ring, b"c3", session=b"c", turn=3) is Offer.ACCEPTED
    assert _offer(ring, b"c3 again", session=b"c", turn=3) is Offer.ACCEPTED
    assert ring.counters.shed_session_broken == 3


def test_clear_counts_dropped_on_stop() -> None:
    """Clearing a ring counts every queued copy as overflow and as dropped on stop."""
    budget = MemoryBudget(10_000)
    ring = _ring(budget)
    _offer(ring, b"1")
    _offer(ring, b"2", session=b"s")
    _offer(ring, b"3", session=b"s")
    assert ring.clear() == 3
    assert ring.counters.dropped_overflow == 3 and ring.counters.dropped_on_stop == 3
    assert ring.items == 0 and ring.bytes == 0 and budget.used == 0
    ring.detach()
    assert budget.rings == []


def test_resize_shrinks_by_dropping_oldest() -> None:
    """Shrinking the limits drops the oldest copies until the ring fits."""
    ring = _ring(MemoryBudget(10_000), items=10)
    for i in range(6):
        _offer(ring, bytes([48 + i]) * 10)
    ring.resize(3, 25, 1.0)
    assert ring.items == 2 and ring.bytes == 20 and ring.counters.dropped_overflow == 4


BODIES = [bytes([97 + i]) * size for i, size in enumerate((1, 7, 30, 64, 120, 200, 333, 600))]


class RingMachine(RuleBasedStateMachine):
    """Random offers, pops, completions and resizes over three rings sharing one budget; each
    session's turns come in order, and what is sent of it is a prefix of its turns."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = MemoryBudget(700)
        self.rings = [
            RingBuffer[str](3, 400, self.budget, LaneCounters(), 2.0),
            RingBuffer[str](5, 900, self.budget, LaneCounters(), 0.0),
            RingBuffer[str](8, 250, self.budget, LaneCounters(), 1.0),
        ]
        self.offered = [0, 0, 0]
        self.taken = [0, 0, 0]
        self.inflight: list[list[Entry[str]]] = [[], [], []]
        self.order: dict[tuple[int, bytes], list[int]] = defaultdict(list)
        self.busy: set[tuple[int, bytes]] = set()
        # The next turn of each conversation offered to each ring (a ring is a candidate).
        self.turns: dict[tuple[int, bytes], int] = defaultdict(int)
        self.sent: dict[tuple[int, bytes], list[int]] = defaultdict(list)  # turns sent
        self.conversation = 0
        self.now = 0.0

    @rule()
    def new_conversation(self) -> None:
        self.conversation += 1

    @rule(
        ring=st.integers(0, 2),
        body=st.sampled_from(BODIES),
        session=st.sampled_from([None, b"s1", b"s2"]),
        dt=st.floats(0.0, 1.5),
    )
    def offer(self, ring: int, body: bytes, session: bytes | None, dt: float) -> None:
        self.now += dt
        self.offered[ring] += 1
        payload = f"{self.offered[ring]}"
        turn, digest = 0, body
        if session is not None:
            session += b"-%d" % self.conversation
            turn = self.turns[(ring, session)]
            self.turns[(ring, session)] += 1
            digest = body + session + b"-%d" % turn  # turns differ; dedup is by body alone
        r = self.rings[ring]
        result = r.offer(payload, id(body), len(body), digest, session, self.now, turn)
        if result is Offer.ACCEPTED and session is not None:
            self.order[(ring, session)].append(self.offered[ring])

    @rule(ring=st.integers(0, 2))
    def pop(self, ring: int) -> None:
        entry = self.rings[ring].pop(self.now)
        if entry is None:
            return
        self.taken[ring] += 1
        if entry.session is not None:
            key = (ring, entry.session)
            assert key not in self.busy, "two turns of one session in flight"
            self.busy.add(key)
            seqs = self.order[key]
            n = int(entry.payload)
            assert all(s > n for s in seqs[seqs.index(n) + 1 :])
            # Every earlier accepted turn was either sent already or evicted.
            del seqs[: seqs.index(n) + 1]
            sent = self.sent[key]
            assert entry.turn == len(sent), f"turn {entry.turn} sent after {sent}"
            sent.append(entry.turn)
        self.inflight[ring].append(entry)

    @precondition(lambda self: any(self.inflight))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        ring = data.draw(st.sampled_from([i for i, f in enumerate(self.inflight) if f]))
        entry = self.inflight[ring].pop(data.draw(st.integers(0, len(self.inflight[ring]) - 1)))
        if entry.session is not None:
            self.busy.discard((ring, entry.session))
        self.rings[ring].done(entry, answered=data.draw(st.booleans()))

    @rule(ring=st.integers(0, 2), items=st.integers(1, 6), nbytes=st.integers(50, 700))
    def resize(self, ring: int, items: int, nbytes: int) -> None:
        self.rings[ring].resize(items, nbytes, 1.0)

    @invariant()
    def bounds_and_accounting(self) -> None:
        held: dict[int, int] = {}
        for i, ring in enumerate(self.rings):
            c = ring.counters
            assert ring.items <= ring.max_items and ring.bytes <= ring.max_bytes
            assert ring.inflight == len(self.inflight[i])
            dropped = c.deduplicated + c.dropped_overflow + c.dropped_oversize
            dropped += c.shed_session_broken
            assert self.offered[i] == dropped + self.taken[i] + ring.items
            assert ring.bytes == sum(e.nbytes for e in ring._order.values())
            for e in ring._order.values():
                held[e.body_id] = e.nbytes
        assert self.budget.used <= self.budget.limit
        assert self.budget.used == sum(held.values())


TestRingMachine = RingMachine.TestCase
TestRingMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
