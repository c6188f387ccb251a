"""Capacity shares (pure): the controller lowers an overloaded candidate's share to what it
managed and releases it when the overload ends; `decide_kept` keeps a hash-chosen, nested subset
and leaves later turns in the band of recent shares to the mirror's admitted sessions."""

from __future__ import annotations

import xxhash

from domain.endpoint import Endpoint
from gateway.mirror.sampling import capacity as cap
from gateway.mirror.sampling.sampler import SALT, Offer, apply_capacity, decide_kept


def _offer(name: str, rate: float, mode: str = "request") -> Offer:
    ep = Endpoint(
        name=name, url="http://127.0.0.1:1", role="candidate", sample_rate=rate, sampling=mode
    )
    return Offer(ep, (1000.0, 1000.0))


def _h(key: bytes) -> float:
    return xxhash.xxh3_64_intdigest(SALT + key) / float(2**64)


def test_kept_copies_are_the_hash_prefix_and_nested() -> None:
    """Under shares 0.3 and 0.1 of a 0.8 sample, exactly the keys hashed below each share are
    kept, the rest of the sample is shed, and the 0.1 set is inside the 0.3 set."""
    keys = [f"r{i}".encode() for i in range(20_000)]
    kept_sets = []
    for share in (0.3, 0.1):
        offer = _offer("c", 0.8)
        apply_capacity([offer], {"c": (share, share)})
        kept, shed = set(), set()
        for key in keys:
            k, s, check, undecided = decide_kept([offer], key, None, True)
            assert not check and not undecided
            if k:
                kept.add(key)
            if s:
                shed.add(key)
        assert kept == {k for k in keys if _h(k) < share}
        assert shed == {k for k in keys if share <= _h(k) < 0.8}
        kept_sets.append(kept)
    assert kept_sets[1] <= kept_sets[0]


def test_session_first_turns_decided_later_turns_in_the_band_checked() -> None:
    """Session mode under a share 0.2 that was 0.1 lately: a first turn is kept iff its hash is
    under 0.2; a later turn is kept outright under 0.1, and between 0.1 and the sample rate it
    is left to the mirror's admitted sessions; without a limit nothing is checked."""
    offer = _offer("s", 1.0, "session")
    apply_capacity([offer], {"s": (0.2, 0.1)})
    for i in range(5000):
        key = f"s{i}".encode()
        h = _h(key)
        kept, shed, check, _ = decide_kept([offer], b"rid", key, True)
        assert (kept == [offer]) == (h < 0.2) and (shed == [offer]) == (h >= 0.2)
        kept, shed, check, _ = decide_kept([offer], b"rid", key, False)
        assert (kept == [offer]) == (h < 0.1) and (check == [offer]) == (h >= 0.1) and not shed
    apply_capacity([offer], {})
    assert decide_kept([offer], b"rid", b"s1", False)[2] == []


class _Lane:
    """One candidate's counters and ring as the mirror process would show them each tick."""

    def __init__(self) -> None:
        self.received = self.done = self.overflow = 0
        self.ring = cap.Occupancy()

    def load(self, fills: list[float]) -> list[cap.LaneLoad]:
        for fill in fills:
            self.ring.sample(fill)
        self.ring.close_tick()
        return [cap.LaneLoad("c", 1.0, self.received, self.done, self.overflow, self.ring)]


def _quiet_channel() -> cap.Occupancy:
    channel = cap.Occupancy()
    channel.sample(0.0)
    channel.close_tick()
    return channel


def test_lane_overload_lowers_to_what_it_completes_then_recovers() -> None:
    """A candidate completing 100 copies/s of 1,000 eligible/s, its ring full all along, gets a
    share near 0.09 (90 % of what it managed) within ten ticks; the share holds while the ring
    drains above FILL_LOW, then rises and is released; every lowering is counted by reason."""
    shares, lane, channel = cap.CapacityShares(), _Lane(), _quiet_channel()
    now, size, queued = 0.0, 1000, 1000
    shares.tick(now, 1.0, 1000.0, lane.load([1.0]), channel, False)
    for _ in range(10):
        now += 1.0
        offered = int(1000 * (shares.share("c") or 1.0))
        lane.received += offered
        lane.done += 100
        queued = min(size, queued + offered - 100)
        shares.tick(now, 1.0, 1000.0, lane.load([queued / size] * 4), channel, False)
    share = shares.share("c")
    assert share is not None and 0.08 <= share <= 0.1, share
    assert shares.cuts["lane"] >= 2 and shares.cuts["channel"] == 0
    low = shares.wire(["c"], now)["c"][1]
    assert low <= share
    held = []
    while shares.share("c") == share:  # 200 copies/s again: the ring drains, the share holds
        now += 1.0
        offered = int(1000 * share)
        lane.received += offered
        served = min(200, queued + offered)
        lane.done += served
        queued -= served - offered
        shares.tick(now, 1.0, 1000.0, lane.load([queued / size] * 4), channel, False)
        held.append(queued / size)
    assert len(held) > 3 and held[-1] < cap.FILL_LOW <= held[-2], held  # rose once under LOW
    for _ in range(40):  # the candidate keeps up with whatever it is offered
        now += 1.0
        offered = int(1000 * (shares.share("c") or 1.0))
        lane.received += offered
        lane.done += offered
        shares.tick(now, 1.0, 1000.0, lane.load([0.0] * 4), channel, False)
    assert shares.share("c") is None


def test_a_backlog_that_drains_or_a_late_reader_is_not_overload() -> None:
    """A ring that is full for a moment in each tick but empties within it (the mirror process
    late to read on a busy host), or that stays high while it drains, lowers nothing; a full
    channel that never drains does, by what the mirror process read."""
    shares, lane = cap.CapacityShares(), _Lane()
    channel = _quiet_channel()
    now = 0.0
    shares.tick(now, 1.0, 200.0, lane.load([0.0]), channel, False)
    for i in range(30):
        now += 1.0
        lane.received += 200
        lane.done += 200
        bursty = [1.0, 0.9, 0.0, 0.6] if i % 2 else [0.95, 1.0, 0.8, 0.3]
        shares.tick(now, 1.0, 200.0, lane.load(bursty), channel, False)
    for fill in (0.9, 0.8, 0.7, 0.6, 0.5):  # high, but draining every tick
        now += 1.0
        lane.received += 200
        lane.done += 200
        shares.tick(now, 1.0, 200.0, lane.load([fill]), channel, False)
    assert shares.share("c") is None and sum(shares.cuts.values()) == 0
    full = cap.ChannelFill()
    for _ in range(cap.SUSTAIN_TICKS):  # the worker's channel never below 80 %
        now += 1.0
        lane.received += 100
        lane.done += 100
        full.report("w", 0.8, now)
        full.tick(now)
        shares.tick(now, 1.0, 200.0, lane.load([0.0]), full.occupancy, False)
    assert shares.cuts["channel"] == 1
    assert shares.share("c") == cap.CUT_MAX  # 90 % of 100/200 is 0.45: at most -30 % a tick


def test_an_overflow_cuts_at_once_only_from_a_ring_that_stayed_full() -> None:
    """A ring that overflowed in a burst but emptied within the tick lowers nothing; one that
    overflowed without leaving FILL_HIGH all tick is cut at once (no SUSTAIN_TICKS wait)."""
    shares, lane, channel = cap.CapacityShares(), _Lane(), _quiet_channel()
    shares.tick(0.0, 1.0, 100.0, lane.load([0.0]), channel, False)
    lane.received, lane.done, lane.overflow = 100, 100, 5
    shares.tick(1.0, 1.0, 100.0, lane.load([1.0, 0.2, 0.0, 0.1]), channel, False)
    assert shares.share("c") is None
    lane.received, lane.done, lane.overflow = 200, 150, 30
    shares.tick(2.0, 1.0, 100.0, lane.load([0.9, 1.0, 1.0, 1.0]), channel, False)
    assert shares.cuts["lane"] == 1 and shares.share("c") == cap.CUT_MAX  # 90 % of 50/100


def test_guard_alone_lowers_by_a_tenth() -> None:
    """The loop guard shedding, with no occupancy signal, lowers a share by 10 % a tick."""
    shares, lane, channel = cap.CapacityShares(), _Lane(), _quiet_channel()
    shares.tick(0.0, 1.0, 100.0, lane.load([0.0]), channel, True)
    lane.received = lane.done = 100
    shares.tick(1.0, 1.0, 100.0, lane.load([0.0]), channel, True)
    assert shares.share("c") == 0.9 and shares.cuts["guard"] == 1


def test_limit_times_say_when_a_share_was_in_force() -> None:
    """The seconds with a capacity share in force, first and last (wall clock), per candidate."""
    shares, lane, channel = cap.CapacityShares(), _Lane(), _quiet_channel()
    times = cap.LimitTimes()
    shares.tick(0.0, 1.0, 100.0, lane.load([0.0]), channel, True)
    times.tick(shares, ["c"], 1000.0)
    assert times.fields("c") == {}
    for t in (1, 2, 3):
        lane.received = lane.done = 100 * t
        shares.tick(float(t), 1.0, 100.0, lane.load([0.0]), channel, True)
        times.tick(shares, ["c"], 1000.0 + t)
    assert times.fields("c") == {
        "shed_capacity_first_at": 1001,
        "shed_capacity_last_at": 1003,
        "shed_capacity_seconds": 3,
    }


def test_admitted_sessions_are_bounded_per_candidate() -> None:
    """The admitted sessions are remembered per candidate, the oldest forgotten past the bound."""
    admitted = cap.Admitted(max_sessions=2)
    for key in (b"a", b"b", b"c"):
        admitted.add("x", key)
    assert not admitted.holds("x", b"a") and admitted.holds("x", b"c")
    assert not admitted.holds("y", b"c")
    admitted.forget(["y"])
    assert not admitted.holds("x", b"c")


def test_occupancy_keeps_the_lowest_look_of_a_tick() -> None:
    """Each look returns the tick's lowest so far; the tick closes on it (0 when never looked)."""
    occ = cap.Occupancy()
    assert occ.sample(0.8) == 0.8
    assert occ.sample(0.9) == 0.8
    assert occ.sample(0.0) == 0.0
    assert occ.sample(0.7) == 0.0
    assert occ.close_tick() == 0.0
    assert occ.sample(0.6) == 0.6
    assert occ.close_tick() == 0.6
    assert occ.close_tick() == 0.0
