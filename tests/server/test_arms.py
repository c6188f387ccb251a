"""The ramp's routing core (gateway/rollout/arms.py), on real files and spawned processes."""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash

from domain.errors import CanaryError, ConfigError, UsageError
from gateway.rollout.arms import (
    CANDIDATE,
    PRODUCTION,
    ArmRouter,
    SessionArms,
    Split,
    tick,
)

SALT = 0xC0FFEE
N = 20_000


def _keys(prefix: str, n: int = N) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def _split(weight: float, generation: int = 1, salt: int = SALT) -> Split:
    return Split(generation, salt=salt, weight=weight, candidate="cand", state="ramping")


def _within_binomial(hits: int, n: int, p: float) -> bool:
    """Within 5 standard deviations of n * p (keys are fixed: fails for ~1 salt in 3.5 M)."""
    return abs(hits - n * p) <= 5 * math.sqrt(n * p * (1 - p))


def _fresh_arm(key: str, weight: float, salt: int = SALT) -> int:
    """The arm a session would get if it were new at `weight` (the independent reference)."""
    return int(xxhash.xxh3_64_intdigest(key.encode(), salt) < round(weight * 2**64))


def _route_and_send(path: str, rollout: Split, keys: list[str], start: Any, out: Any) -> None:
    """Runs in a spawned process: open the table by path, wait for the others, route `keys`."""
    with SessionArms.open(path) as table:
        router = ArmRouter(table, rollout)
        start.wait(timeout=60)
        arms = [router.arm_for(k) for k in keys]
    out.put((os.getpid(), arms))


def _in_processes(*jobs: tuple[str, Split, list[str]]) -> list[tuple[int, list[int]]]:
    """Route each job in its own spawned process, all starting together; (pid, arms) each."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(len(jobs))
    outs = [ctx.SimpleQueue() for _ in jobs]
    procs = [
        ctx.Process(target=_route_and_send, args=(*job, start, out))
        for job, out in zip(jobs, outs, strict=True)
    ]
    for p in procs:
        p.start()
    results = [out.get() for out in outs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.fixture
def table(tmp_path: Path) -> Iterator[SessionArms]:
    with SessionArms.create(str(tmp_path / "arms"), slots=1 << 16) as t:
        yield t


def test_sessions_keep_their_arm_when_the_weight_rises(table: SessionArms) -> None:
    """Sessions seen at 5 % keep their arm at 25 %, while new sessions follow 25 %."""
    router = ArmRouter(table, _split(0.05))
    early = _keys("early")
    at_5 = [router.arm_for(k) for k in early]
    assert _within_binomial(sum(at_5), N, 0.05)

    router.swap(router.rollout.step(0.25))
    assert [router.arm_for(k) for k in early] == at_5
    # The memory did the work: as new sessions, ~20 % of them would have moved to the candidate.
    moved = sum(1 for k, a in zip(early, at_5, strict=True) if a != _fresh_arm(k, 0.25))
    assert _within_binomial(moved, N, 0.20)

    late = [router.arm_for(k) for k in _keys("late")]
    assert _within_binomial(sum(late), N, 0.25)
    assert router.counters()["new_sessions"] == 2 * N


def test_rollback_sends_every_session_to_production_at_once(table: SessionArms) -> None:
    """After a rollback every session, candidate ones included, is served by production, with
    no table work; a later rollout leaves those sessions on production too."""
    router = ArmRouter(table, _split(0.5))
    keys = _keys("s")
    before = [router.arm_for(k) for k in keys]
    assert _within_binomial(sum(before), N, 0.5)

    rolled_back = router.rollout.rolled_back()
    router.swap(rolled_back)
    inserted = table.inserted
    assert all(router.arm_for(k) == PRODUCTION for k in keys)
    assert table.inserted == inserted and table.evicted == 0

    router.swap(_split(1.0, generation=rolled_back.generation + 1, salt=SALT + 1))
    assert all(router.arm_for(k) == PRODUCTION for k in keys)
    assert all(router.arm_for(k) == CANDIDATE for k in _keys("new", 1000))


def test_sessions_from_before_a_rollout_stay_on_production(table: SessionArms) -> None:
    """Sessions that started with no rollout stay on production even at weight 1."""
    router = ArmRouter(table)
    old = _keys("old", 5000)
    assert all(router.arm_for(k) == PRODUCTION for k in old)
    router.swap(_split(1.0))
    assert all(router.arm_for(k) == PRODUCTION for k in old)
    assert all(router.arm_for(k) == CANDIDATE for k in _keys("new", 5000))
    assert router.counters()["production"] == 10_000
    assert router.counters()["candidate"] == 5000


def test_two_spawned_processes_sharing_one_table_agree(table: SessionArms) -> None:
    """Two worker processes opening the same table by path agree on every session: the second
    one, at a higher weight, answers what the first one recorded; run at the same time on the
    same sessions in opposite orders, they answer alike."""
    early = _keys("early", 10_000)
    both = _keys("both", 10_000)
    [(_, first)] = _in_processes((table.path, _split(0.05), early))
    [(_, second)] = _in_processes((table.path, _split(0.25), early))
    assert second == first
    assert any(a != _fresh_arm(k, 0.25) for k, a in zip(early, first, strict=True))

    (pid_a, arms_a), (pid_b, arms_b) = _in_processes(
        (table.path, _split(0.5), both), (table.path, _split(0.5), both[::-1])
    )
    assert pid_a != pid_b
    assert arms_a == arms_b[::-1]
    assert _within_binomial(sum(arms_a), 10_000, 0.5)
    # The parent sees the same memory.
    router = ArmRouter(table, _split(0.9))
    assert [router.arm_for(k) for k in early] == first
    assert table.inserted == 0


def test_the_arm_is_deterministic_across_processes_for_the_same_salt(tmp_path: Path) -> None:
    """Two processes with tables of their own route new sessions identically for one salt, and
    differently for another."""
    keys = _keys("k", 10_000)
    tables = [SessionArms.create(str(tmp_path / name), slots=1 << 16) for name in "abc"]
    try:
        (pid_a, a), (pid_b, b), (_, other) = _in_processes(
            (tables[0].path, _split(0.3), keys),
            (tables[1].path, _split(0.3), keys),
            (tables[2].path, _split(0.3, salt=7), keys),
        )
    finally:
        for t in tables:
            t.close()
    assert pid_a != pid_b
    assert a == b == [_fresh_arm(k, 0.3) for k in keys]
    assert other != a
    assert not list(tmp_path.iterdir())


def test_an_overfull_table_stays_bounded_and_counts_evictions(tmp_path: Path) -> None:
    """Routing far more sessions than the table has slots keeps its file at its size and counts
    each live session pushed out."""
    path = tmp_path / "small"
    with SessionArms.create(str(path), slots=64) as table:
        size = path.stat().st_size
        router = ArmRouter(table, _split(0.5))
        for k in _keys("x", 5000):
            router.arm_for(k)
        assert path.stat().st_size == size == 64 + 64 * 8
        assert table.live(tick()) == 64
        assert table.inserted == 5000
        assert table.evicted == 5000 - 64 == router.counters()["evicted"]


def test_the_stalest_session_is_evicted_and_dead_ones_are_reclaimed(tmp_path: Path) -> None:
    """When both buckets of a new session are live, the least recently seen session is the one
    forgotten; a session idle past the TTL frees its slot without counting an eviction."""
    # 16 slots: every session's two buckets are the whole table.
    with SessionArms.create(str(tmp_path / "t"), slots=16, ttl_s=16) as table:  # ttl: 2 ticks
        sessions = [(i + 1) << 32 for i in range(16)]  # fingerprints 1..16, the table full
        for i, h in enumerate(sessions):
            assert table.remember(h, 1, stamp=0, arm=i % 2) == i % 2
        for i, h in enumerate(sessions[1:], start=1):
            assert table.remember(h, 1, stamp=1, arm=1 - i % 2) == i % 2  # seen again
        # At tick 3, session 0 (last seen at 0) is dead; the others (seen at 1) live.
        assert table.remember(99 << 32, 1, stamp=3, arm=1) == 1
        assert (table.inserted, table.evicted, table.reclaimed) == (17, 0, 1)
        for i, h in enumerate(sessions[1:], start=1):
            assert table.remember(h, 1, stamp=3, arm=1 - i % 2) == i % 2
        assert table.inserted == 17

    with SessionArms.create(str(tmp_path / "u"), slots=16) as table:
        sessions = [(i + 1) << 32 for i in range(16)]
        for i, h in enumerate(sessions):
            table.remember(h, 1, stamp=i, arm=1)
        assert table.remember(99 << 32, 1, stamp=20, arm=0) == 0
        assert (table.inserted, table.evicted, table.reclaimed) == (17, 1, 0)
        for h in sessions[1:]:
            assert table.remember(h, 1, stamp=21, arm=0) == 1  # remembered
        assert table.inserted == 17
        assert table.remember(sessions[0], 1, stamp=21, arm=0) == 0  # forgotten: new again
        assert table.inserted == 18


def test_the_table_file_is_removed_at_close_by_its_creator_only(tmp_path: Path) -> None:
    """A worker's close leaves the file; the supervisor's close removes it; and a file that is
    not a table, or a bad size, is refused."""
    path = str(tmp_path / "arms")
    owner = SessionArms.create(path, slots=32)
    worker = SessionArms.open(path)
    worker.close()
    assert os.path.exists(path)
    owner.close()
    owner.close()
    assert not os.path.exists(path)

    (tmp_path / "other").write_bytes(b"x" * 4096)
    with pytest.raises(CanaryError):
        SessionArms.open(str(tmp_path / "other"))
    with pytest.raises(ConfigError):
        SessionArms.create(str(tmp_path / "bad"), slots=100)
    assert not (tmp_path / "bad").exists()


def test_the_weight_only_rises_within_a_rollout(table: SessionArms) -> None:
    """A lower weight or another salt in the same generation, or an older generation, is
    refused."""
    router = ArmRouter(table, _split(0.25, generation=3))
    with pytest.raises(UsageError):
        router.rollout.step(0.05)
    with pytest.raises(UsageError):
        router.swap(_split(0.05, generation=3))
    with pytest.raises(UsageError):
        router.swap(_split(0.5, generation=2))
    with pytest.raises(UsageError):
        router.swap(_split(0.5, generation=3, salt=SALT + 1))
    with pytest.raises(UsageError):
        Split(4, weight=0.1)
    router.swap(router.rollout.step(0.5))
    assert router.rollout.weight == 0.5 and router.rollout.generation == 3


def test_a_hold_sends_new_sessions_to_production_and_keeps_the_candidates(
    table: SessionArms,
) -> None:
    """Held (weight 0, same generation), new sessions go to production while sessions already
    on the candidate keep it, and the weight may rise back; a drop to anything but 0 is still
    refused."""
    router = ArmRouter(table, _split(0.5))
    keys = _keys("s")
    before = [router.arm_for(k) for k in keys]
    with pytest.raises(UsageError):
        router.swap(_split(0.25))
    router.swap(router.rollout.held())
    assert [router.arm_for(k) for k in keys] == before
    assert all(router.arm_for(k) == PRODUCTION for k in _keys("held", 1000))
    router.swap(_split(0.5))
    assert [router.arm_for(k) for k in keys] == before
    assert all(router.arm_for(k) == PRODUCTION for k in _keys("held", 1000))
    assert _within_binomial(sum(router.arm_for(k) for k in _keys("later")), N, 0.5)
