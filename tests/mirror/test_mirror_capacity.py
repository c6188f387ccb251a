"""Capacity shares (pure): the controller lowers an overloaded candidate's share to what it
managed and releases it when the overload ends; `decide_kept` keeps a hash-chosen, nested subset
and leaves later turns in the band of recent shares to the mirror's admitted sessions."""

from __future__ import annotations

import random

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


def _loads(received: int, done: int, overflow: int, fill: float) -> list[cap.LaneLoad]:
    return [cap.LaneLoad("c", 1.0, received, done, overflow, fill)]


def test_lane_overload_lowers_to_what_it_completes_then_recovers() -> None:
    """A candidate completing 100 copies/s of 1,000 eligible/s (its ring overflowing) gets a
    share near 0.09 (90 % of what it managed) within ten ticks; once quiet the share rises and
    is released; every lowering is counted by reason."""
    shares = cap.CapacityShares()
    received = done = overflow = 0
    now = 0.0
    shares.tick(now, 1.0, 1000.0, _loads(0, 0, 0, 0.0), False)
    for _ in range(10):
        now += 1.0
        offered = int(1000 * (shares.share("c") or 1.0))
        received += offered
        done += 100
        overflow += max(0, offered - 100)
        shares.tick(now, 1.0, 1000.0, _loads(received, done, overflow, 1.0), False)
    share = shares.share("c")
    assert share is not None and 0.08 <= share <= 0.1, share
    assert shares.cuts["lane"] >= 2
    low = shares.wire([("c", 1.0)], now)["c"][1]
    assert low <= share
    for _ in range(40):  # quiet: the lane keeps up with what it is offered
        now += 1.0
        offered = int(1000 * (shares.share("c") or 1.0))
        received += offered
        done += offered
        shares.tick(now, 1.0, 1000.0, _loads(received, done, overflow, 0.0), False)
    assert shares.share("c") is None


def test_backlog_is_told_from_sampling_noise() -> None:
    """Copies received within the binomial noise of the promised rate do not lower a share; a
    channel that delivers half of them does."""
    rng = random.Random(7)
    shares = cap.CapacityShares()
    received, now = 0, 0.0
    shares.tick(now, 1.0, 200.0, _loads(0, 0, 0, 0.0), False)
    for _ in range(60):  # 200 eligible/s at share 1: 200 promised, Poisson-ish noise
        now += 1.0
        got = sum(rng.random() < 0.999 for _ in range(200)) - rng.randint(0, 20)
        received += got
        shares.tick(now, 1.0, 200.0, _loads(received, received, 0, 0.0), False)
    assert shares.share("c") is None and shares.cuts["backlog"] == 0
    now += 1.0
    received += 100
    shares.tick(now, 1.0, 200.0, _loads(received, received, 0, 0.0), False)
    assert shares.share("c") == cap.CUT_MAX and shares.cuts["backlog"] == 1  # at most -30 %


def test_guard_alone_lowers_by_a_tenth() -> None:
    """The loop guard shedding, with no rate signal, lowers a share by 10 % a tick."""
    shares = cap.CapacityShares()
    shares.tick(0.0, 1.0, 100.0, _loads(0, 0, 0, 0.0), True)
    shares.tick(1.0, 1.0, 100.0, _loads(100, 100, 0, 0.0), True)
    assert shares.share("c") == 0.9 and shares.cuts["guard"] == 1


def test_admitted_sessions_are_bounded_per_candidate() -> None:
    """The admitted sessions are remembered per candidate, the oldest forgotten past the bound."""
    admitted = cap.Admitted(max_sessions=2)
    for key in (b"a", b"b", b"c"):
        admitted.add("x", key)
    assert not admitted.holds("x", b"a") and admitted.holds("x", b"c")
    assert not admitted.holds("y", b"c")
    admitted.forget(["y"])
    assert not admitted.holds("x", b"c")
