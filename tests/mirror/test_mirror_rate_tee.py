"""Adaptive sampling (`target_rps`) inside the `Mirror`: on the eligible rate the workers report
it converges, reports the realized rate, and in session mode counts the
conversations a lowered share cuts and those a raised share joins mid-way — exactly the ones
the sampling hash says."""

from __future__ import annotations

import time

import pytest
import xxhash

from domain.endpoint import Endpoint
from domain.exposition import render
from gateway.mirror.channel import frames
from gateway.mirror.replay.sinks import InMemorySink
from gateway.mirror.sampling.sampler import SALT
from gateway.mirror.tee import Mirror
from tests.mirror.test_mirror_lane import chat, headers, make_mirror, send

TWO_64 = float(2**64)


def test_mirror_converges_on_the_reported_eligible_rate() -> None:
    """200 eligible requests a second (reported as a worker does), target 20 copies/s: after the
    climb from the safe start the mirror copies 20 +- 15 % a second, and its stats and metrics
    say so."""
    cand = Endpoint(name="c", url="http://127.0.0.1:9", target_rps=20.0, sample_rate=1.0)
    mirror = make_mirror([cand], InMemorySink())
    t0 = time.monotonic()
    per_second = []
    for second in range(30):
        copies = 0
        for i in range(200):
            copies += send(mirror, chat(f"q {second} {i}"), f"r-{second}-{i}") is not None
        per_second.append(copies)
        mirror.adaptive.control.eligible.report("worker", 200, 1.0, t0 + second + 1)
        mirror.control_tick(t0 + second + 1)
    assert per_second[0] <= 2  # the safe start: 20 / START_REFERENCE_RPS of 200 requests
    assert sum(per_second[10:]) / 20 == pytest.approx(20, rel=0.15)
    stats = mirror.rate_stats()["c"]
    assert stats["target_rps"] == 20.0
    assert stats["effective_sample_rate"] == pytest.approx(0.1, rel=0.15)
    assert stats["realized_copies_per_second"] == pytest.approx(20, rel=0.2)
    assert stats["eligible_requests_per_second"] == pytest.approx(200, rel=0.02)
    lines = "\n".join(render(mirror.prometheus_lines()))
    for metric in (
        "canary_mirror_effective_sample_rate",
        "canary_mirror_realized_copies_per_second",
        "canary_mirror_target_copies_per_second",
        "canary_mirror_sample_rate_changes_total",
    ):
        assert f'{metric}{{candidate="c"}} ' in lines
    assert "canary_mirror_eligible_requests_per_second 2" in lines


def test_fixed_rate_candidates_are_left_alone() -> None:
    """A candidate without a target samples at `sample_rate` whatever the controller does."""
    fixed = Endpoint(name="f", url="http://127.0.0.1:9", sample_rate=0.3)
    mirror = make_mirror([fixed], InMemorySink())
    mirror.adaptive.schedule(frames.RatesMeta(1, 0.0, 5.0, 5.0))
    stats = mirror.rate_stats()["f"]
    assert stats["effective_sample_rate"] == 0.3 and stats["rate_changes"] == 0
    assert stats["target_rps"] is None


def _h(session: str) -> float:
    return xxhash.xxh3_64_intdigest(SALT + session.encode()) / TWO_64


def _turn(mirror: Mirror, session: str, turn: int) -> bool:
    texts = [f"{session} turn {k}" for k in range(turn + 1)]
    token = send(mirror, chat(*texts), f"{session}-{turn}", headers(x_session_id=session))
    return token is not None


def test_session_changes_count_cut_and_joined_conversations() -> None:
    """Session mode, target 20: at a reference of 100 req/s (share 0.2) 600 conversations
    play two turns; the reference doubles (share 0.1): the cut conversations are exactly those
    hashed in [0.1, 0.2); it drops to 50 (share 0.4): turn 2 reaches exactly the conversations
    hashed below 0.4, and those in [0.1, 0.4) are counted joined mid-way, once."""
    cand = Endpoint(
        name="s",
        url="http://127.0.0.1:9",
        target_rps=20.0,
        sample_rate=1.0,
        sampling="session",
        buffer_max_items=100_000,
    )
    mirror = make_mirror([cand], InMemorySink())
    sessions = [f"sess-{i}" for i in range(600)]
    mirror.adaptive.schedule(frames.RatesMeta(1, 0.0, 100.0, 100.0))
    for turn in (0, 1):
        mirrored = {s for s in sessions if _turn(mirror, s, turn)}
        assert mirrored == {s for s in sessions if _h(s) < 0.2}
    mirror.adaptive.schedule(frames.RatesMeta(2, 0.0, 200.0, 200.0))
    stats = mirror.rate_stats()["s"]
    cut = sum(1 for s in sessions if 0.1 <= _h(s) < 0.2)
    assert cut > 20 and stats["sessions_cut"] == cut
    assert stats["rate_changes"] == 2  # from the safe start to 0.2, then to 0.1
    mirror.adaptive.schedule(frames.RatesMeta(3, 0.0, 50.0, 50.0))
    mirrored = {s for s in sessions if _turn(mirror, s, 2)}
    assert mirrored == {s for s in sessions if _h(s) < 0.4}
    for s in sessions:
        _turn(mirror, s, 3)
    stats = mirror.rate_stats()["s"]
    assert stats["sessions_joined"] == sum(1 for s in sessions if 0.1 <= _h(s) < 0.4)
    assert stats["rate_changes"] == 3 and stats["sessions_cut"] == cut
    lines = "\n".join(render(mirror.prometheus_lines()))
    assert f'canary_mirror_sessions_cut_total{{candidate="s"}} {cut}' in lines


def test_a_tick_looks_at_the_rings_until_every_one_was_empty() -> None:
    """`sample_rings` keeps each ring's lowest occupancy of the tick and says when every ring's
    is 0: the tick's loop then sleeps out the tick, since no later look can find less. One
    ring holding a copy keeps it looking."""
    idle = Endpoint(name="idle", url="http://127.0.0.1:9", sample_rate=0.0)
    busy = Endpoint(name="busy", url="http://127.0.0.1:9", sample_rate=1.0)
    mirror = make_mirror([idle, busy], InMemorySink())  # not started: a copy stays queued
    assert mirror.sample_rings()  # nothing queued anywhere
    mirror.capacity_tick(time.monotonic())
    assert send(mirror, chat("one"), "r-1") is not None
    assert not mirror.sample_rings()  # busy's ring holds the copy, idle's is empty
    assert mirror.counters()["busy"]["sampled"] == 1
    assert mirror.counters()["idle"]["sampled"] == 0
    mirror.capacity_tick(time.monotonic())
    assert not mirror.sample_rings()  # a new tick, the copy still queued
