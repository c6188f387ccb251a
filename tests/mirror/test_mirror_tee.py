"""The Mirror as a whole: sampling modes, records, run-time candidate changes, overload
accounting, memory budget, loop guard and shutdown (real sockets where a candidate is needed)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest
import uvloop

from domain.endpoint import Endpoint
from domain.exposition import render
from gateway.mirror.counters import identity_holds
from gateway.mirror.replay.sinks import InMemorySink
from gateway.mirror.sampling.loopguard import (
    FAST_ABOVE_BUSY,
    IDLE_INTERVAL_S,
    INTERVAL_S,
    LoopLagGuard,
)
from gateway.mirror.tee import Mirror
from gateway.server.meter import MeterResult
from tests.mirror.test_mirror_lane import (
    Run,
    chat,
    headers,
    make_mirror,
    quiesce,
    send,
    sim,
)
from tests.waiting import SETTLE_S, until

HANG = dict(timeout_s=30.0, concurrency=2)


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run[Any]:
    """Runs a scenario to completion on a fresh loop of the parametrised kind."""
    factory = uvloop.new_event_loop if request.param == "uvloop" else None

    def runner(coro: Any) -> Any:
        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(coro)

    return runner


def _conversations(
    mirror: Mirror, n_sessions: int, turns: int, *, user: bool
) -> dict[str, set[int]]:
    """Offer `turns` turns of `n_sessions` conversations; return the mirrored turns per session."""
    mirrored: dict[str, set[int]] = {}
    for s in range(n_sessions):
        for t in range(turns):
            texts = [f"conversation {s} turn {k}" for k in range(t + 1)]
            body = msgspec.json.decode(chat(*texts))
            if user:
                body["user"] = f"user-{s}"
            token = send(mirror, msgspec.json.encode(body), f"req-{s}-{t}")
            if token is not None:
                mirrored.setdefault(f"s{s}", set()).add(t)
    return mirrored


@pytest.mark.parametrize("user", [True, False])
def test_session_mode_mirrors_whole_conversations(user: bool) -> None:
    """In session mode each conversation is mirrored at every turn or not at all."""
    sink = InMemorySink()
    ep = Endpoint(name="kv", url="http://127.0.0.1:9", sample_rate=0.5, sampling="session")
    mirror = make_mirror([ep], sink)
    mirrored = _conversations(mirror, 200, 3, user=user)
    assert 60 < len(mirrored) < 140
    assert all(turns == {0, 1, 2} for turns in mirrored.values())
    assert sorted({e.turn_index for e in sink.exchanges}) == [0, 1, 2]


def test_request_mode_samples_turns_independently() -> None:
    """In request mode the turns of one conversation are sampled independently."""
    sink = InMemorySink()
    ep = Endpoint(name="r", url="http://127.0.0.1:9", sample_rate=0.5)
    mirrored = _conversations(make_mirror([ep], sink), 200, 3, user=True)
    assert any(turns != {0, 1, 2} for turns in mirrored.values())


def test_exchange_and_production_records() -> None:
    """on_response emits the exchange (targets, hashed session) and production's observation."""
    sink = InMemorySink()
    eps = [
        Endpoint(name="a", url="http://127.0.0.1:9", sample_rate=1.0),
        Endpoint(name="b", url="http://127.0.0.1:9", sample_rate=1.0, state="paused"),
        Endpoint(name="c", url="http://127.0.0.1:9", sample_rate=0.0),
    ]
    mirror = make_mirror(eps, sink, store_text_max_chars=5)
    body = msgspec.json.encode(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}],
            "temperature": 0.2,
            "stream": True,
            "response_format": {"type": "json_schema"},
        }
    )
    token = mirror.on_request(
        "POST", "/v1/chat/completions", headers(X_Session_ID="secret-session"), body, "r1"
    )
    assert token is not None
    result = MeterResult(
        status=200, is_sse=True, text="hello world", output_hash="ab", prompt_tokens=7
    )
    mirror.on_response(token, result, None)
    (ex,) = sink.exchanges
    assert ex.targets == ("a",) and ex.route == "/v1/chat/completions" and ex.replica == "test"
    assert ex.stream and ex.temperature == 0.2 and ex.turn_index == 1 and ex.json_requested
    assert ex.session_key is not None and "secret" not in ex.session_key
    assert ex.prompt_tokens == 7 and len(ex.request_hash) == 32
    (obs,) = sink.observations
    assert (obs.arm, obs.endpoint, obs.exchange_id) == ("production", "live", ex.id)
    assert obs.output_text == "hello" and obs.text_truncated and obs.output_hash == "ab"


def test_store_text_false_keeps_only_the_hash() -> None:
    """With store_text off, observations keep the output hash and no text."""
    sink = InMemorySink()
    mirror = make_mirror(
        [Endpoint(name="a", url="http://x:1", sample_rate=1.0)], sink, store_text=False
    )
    token = mirror.on_request("POST", "/v1/completions", headers(), b'{"prompt":"p"}', "r")
    mirror.on_response(
        token, MeterResult(status=200, is_sse=False, text="t", output_hash="h"), None
    )
    (obs,) = sink.observations
    assert obs.output_text is None and obs.output_hash == "h"


def test_what_is_not_mirrored() -> None:
    """Other routes, GETs and unparseable bodies are not mirrored; unparseable ones are counted."""
    sink = InMemorySink()
    mirror = make_mirror([Endpoint(name="a", url="http://x:1", sample_rate=1.0)], sink)
    h = headers()
    assert mirror.on_request("GET", "/v1/models", h, b"", "1") is None
    assert mirror.on_request("POST", "/tokenize", h, b"{}", "2") is None
    assert mirror.on_request("POST", "/v1/chat/completions", h, b"not json", "3") is None
    assert mirror.process_counters() == {
        "skipped_unparseable": 1,
        "skipped_loop": 0,
        "skipped_unmirrorable_state": 0,
        "skipped_unknown_candidate": 0,
        "out_of_order_turns": 0,
    }
    assert mirror.counters()["a"]["sampled"] == 0
    assert mirror.on_request("POST", "/v1/embeddings", h, b'{"input":"x"}', "4") is not None


def test_a_candidate_this_process_does_not_run_yet_is_counted_and_reread() -> None:
    """A worker hands off a copy for a candidate registered since the mirror process last read
    the registry: the copy is counted (skipped_unknown_candidate), never silently lost, and the
    registry is asked to read again at once; with no candidate at all as with one other."""
    sink = InMemorySink()
    mirror = make_mirror([], sink)
    pokes: list[int] = []
    mirror.on_unknown_candidate = lambda: pokes.append(1)
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    assert (
        mirror.on_request("POST", "/v1/chat/completions", headers(), body, "1", only=["a"]) is None
    )
    mirror.apply([Endpoint(name="b", url="http://x:1", sample_rate=1.0)])
    token = mirror.on_request("POST", "/v1/chat/completions", headers(), body, "2", only=["a", "b"])
    assert token is not None
    assert mirror.process_counters()["skipped_unknown_candidate"] == 2 and len(pokes) == 2
    assert mirror.counters()["b"]["sampled"] == 1


def test_duplicate_bodies_are_deduplicated() -> None:
    """The same body offered twice while queued is counted once as deduplicated."""
    sink = InMemorySink()
    mirror = make_mirror([Endpoint(name="a", url="http://x:1", sample_rate=1.0)], sink)
    body = chat("same")
    assert send(mirror, body, "r1") is not None
    assert send(mirror, body, "r2") is None
    c = mirror.counters()["a"]
    assert c["deduplicated"] == 1 and c["pending"] == 1 and identity_holds(c)


def test_session_mode_deduplicates_within_a_conversation_only() -> None:
    """Two conversations opening with the same turn both reach a session-mode candidate."""
    sink = InMemorySink()
    ep = Endpoint(name="kv", url="http://x:1", sample_rate=1.0, sampling="session")
    mirror = make_mirror([ep], sink)
    body = chat("the same opening question")
    assert send(mirror, body, "r1", headers(X_Session_ID="s1")) is not None
    assert send(mirror, body, "r2", headers(X_Session_ID="s2")) is not None
    assert send(mirror, body, "r3", headers(X_Session_ID="s2")) is None  # a resend in s2
    c = mirror.counters()["kv"]
    assert c["deduplicated"] == 1 and c["pending"] == 2 and identity_holds(c)


def test_accounting_holds_under_overload(run: Run[None]) -> None:
    """A hung candidate flooded past its buffer keeps both identities at every await point."""

    async def scenario() -> None:
        server = await sim("hang")
        sink = InMemorySink()
        ep = Endpoint(name="h", url=server.url, sample_rate=1.0, buffer_max_items=20, timeout_s=0.2)
        mirror = make_mirror([ep], sink, drain_timeout_s=0.1)
        await mirror.start()
        try:
            for i in range(400):
                send(mirror, chat(f"flood {i}"), f"r{i}")
                if i % 10 == 0:
                    await asyncio.sleep(0)
                assert identity_holds(mirror.counters()["h"])
            c = mirror.counters()["h"]
            assert c["dropped_overflow"] > 300 and c["buffer_items"] <= 20
        finally:
            await mirror.close()
            await server.close()
        c = mirror.counters()["h"]
        assert identity_holds(c) and c["pending"] == 0 and c["sampled"] == 400
        assert len(sink.candidate("h")) == c["sent"]

    run(scenario())


def test_memory_stays_inside_the_global_budget(run: Run[None]) -> None:
    """100 KB prompts to three hung candidates never push the rings past a 1 MiB budget."""

    async def scenario() -> None:
        server = await sim("hang")
        sink = InMemorySink()
        eps = [
            Endpoint(
                name=f"h{i}", url=server.url, sample_rate=1.0, buffer_max_bytes=600_000, **HANG
            )
            for i in range(3)
        ]
        mirror = make_mirror(
            eps,
            sink,
            mirror_memory_budget_bytes=1 << 20,
            drain_timeout_s=0.0,
        )
        await mirror.start()
        try:
            for i in range(200):
                send(mirror, chat(f"{i} " + "x" * 100_000), f"r{i}")
                assert mirror.budget.used <= 1 << 20
                counters = mirror.counters()
                assert all(c["buffer_bytes"] <= 600_000 for c in counters.values())
                await asyncio.sleep(0)
            # Each body is shared by three rings and counted once.
            held = max(c["buffer_bytes"] for c in counters.values())
            assert mirror.budget.used >= held
            assert all(identity_holds(c) for c in counters.values())
        finally:
            await mirror.close()
            await server.close()
        assert mirror.budget.used == 0

    run(scenario())


def test_sustained_lag_sheds_a_proportional_share(run: Run[None]) -> None:
    """The mirror process sheds only under lag sustained over the window, a share that grows
    with the excess, counted by reason; mirroring resumes once the average is back."""

    async def scenario() -> None:
        sink = InMemorySink()
        mirror = make_mirror(
            [Endpoint(name="a", url="http://127.0.0.1:9", sample_rate=1.0)],
            sink,
            mirror_shed_loop_lag_ms=20.0,
        )
        guard = mirror.guard
        guard.observe_cpu(0.6, 1.0)  # the mirror process itself is busy (its own load)
        for _ in range(100):
            guard.observe(0.002, 0.01)
        guard.observe(0.5, 0.5)  # one wake-up 500 ms late (a busy host): one sample of many
        assert not guard.shedding
        for _ in range(400):  # 4 s of wake-ups 30 ms late: sustained, 1.5x the threshold
            guard.observe(0.030, 0.01)
        assert 0.4 < guard.shed_fraction < 0.6
        guard.observe_cpu(0.1, 1.0)  # the same lag while the mirror idles: the host's load
        assert not guard.shedding
        guard.observe_cpu(0.6, 1.0)
        shed = sum(send(mirror, chat(f"s{i}"), f"r{i}") is None for i in range(200))
        counters = mirror.counters()["a"]
        assert counters["shed_overload"] == shed == guard.reasons["lag"]
        assert 60 < shed < 140  # deterministic by body hash, about half
        assert identity_holds(counters)
        for _ in range(400):
            guard.observe(0.001, 0.01)
        assert not guard.shedding
        assert send(mirror, chat("after"), "r-after") is not None
        assert any("canary_mirror_shed_total" in line for line in render(mirror.prometheus_lines()))
        await mirror.close()

    run(scenario())


def test_one_late_wakeup_never_sheds(run: Run[None]) -> None:
    """A single 200 ms stall of the mirror's loop (a busy host) sheds no copy (issue: copies
    shed at light load): the guard's running task sees it, and the offer path keeps queueing."""

    async def scenario() -> None:
        sink = InMemorySink()
        mirror = make_mirror(
            [Endpoint(name="a", url="http://127.0.0.1:9", sample_rate=1.0)],
            sink,
            mirror_shed_loop_lag_ms=20.0,
        )
        await mirror.start()
        try:
            await asyncio.sleep(0.3)
            time.sleep(0.2)  # noqa: ASYNC251 - blocks the loop on purpose: one late wake-up
            await asyncio.sleep(0.03)
            # The stall began anywhere in the guard's interval: its wake-up was due up to one
            # interval after the stall's start, so it ran at least 200 ms less that late.
            assert mirror.guard.max_lag_s >= 0.2 - mirror.guard.interval_s - 0.01
            assert not mirror.guard.shedding
            assert send(mirror, chat("x"), "r1") is not None
            assert mirror.counters()["a"]["shed_overload"] == 0
        finally:
            await mirror.close()

    run(scenario())


def test_apply_adds_updates_pauses_and_removes(run: Run[None]) -> None:
    """Swapping the candidate set keeps queued copies, pauses, and counts a removed lane's queue."""

    async def scenario() -> None:
        server = await sim("hang")
        sink = InMemorySink()
        a = Endpoint(name="a", url=server.url, sample_rate=1.0, concurrency=1, timeout_s=0.3)
        mirror = make_mirror([a], sink)
        await mirror.start()
        try:
            for i in range(5):
                send(mirror, chat(f"a{i}"), f"r{i}")
            assert mirror.counters()["a"]["pending"] == 5
            # A change keeps the queue; more workers start.
            a2 = msgspec.structs.replace(a, concurrency=3, buffer_max_items=10)
            b = Endpoint(name="b", url=server.url, sample_rate=1.0, timeout_s=0.3)
            mirror.apply([a2, b])
            assert mirror.counters()["a"]["pending"] == 5 and "b" in mirror.counters()
            # Paused: no new copies for a; b still gets them.
            mirror.apply([msgspec.structs.replace(a2, state="paused"), b])
            send(mirror, chat("paused"), "rp")
            assert mirror.counters()["a"]["sampled"] == 5 and mirror.counters()["b"]["sampled"] == 1
            # Removed: its queued copies are dropped and counted, in-flight ones finish.
            before = mirror.counters()["b"]
            assert before["pending"] == 1
            mirror.apply([msgspec.structs.replace(a2, state="paused")])
            assert "b" not in mirror.counters()
            await quiesce(mirror)
            assert identity_holds(mirror.counters()["a"])
        finally:
            await mirror.close()
            await server.close()

    run(scenario())


def test_shutdown_drains_then_counts_the_rest(run: Run[None]) -> None:
    """close() finishes what it can within drain_timeout_s and counts the rest; no task survives."""

    async def scenario() -> None:
        fast, hang = await sim("fast"), await sim("hang")
        sink = InMemorySink()
        eps = [
            Endpoint(name="fast", url=fast.url, sample_rate=1.0, concurrency=2),
            Endpoint(name="hang", url=hang.url, sample_rate=1.0, concurrency=2, timeout_s=60),
        ]
        mirror = make_mirror(eps, sink, drain_timeout_s=0.5)
        await mirror.start()
        for i in range(30):
            send(mirror, chat(f"q{i}"), f"r{i}")
        t0 = time.perf_counter()
        await mirror.close()
        elapsed = time.perf_counter() - t0
        await fast.close()
        await hang.close()
        assert elapsed < 30  # bounded by the drain timeout, not by the hung candidate's 60 s
        c = mirror.counters()
        assert c["fast"]["observed_ok"] == 30 and c["fast"]["pending"] == 0
        assert c["hang"]["timed_out"] == 2 and c["hang"]["dropped_on_stop"] == 28
        assert all(identity_holds(x) for x in c.values())
        assert {o.error_kind for o in sink.candidate("hang")} == {"cancelled"}
        assert send(mirror, chat("late"), "late") is None
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == []

    run(scenario())


def test_prometheus_lines() -> None:
    """Counters are exported with the documented names and labels."""
    sink = InMemorySink()
    mirror = make_mirror([Endpoint(name="a", url="http://x:1", sample_rate=1.0)], sink)
    send(mirror, chat("x"), "r")
    lines = render(mirror.prometheus_lines())
    assert 'canary_mirror_copies_total{candidate="a",outcome="sampled"} 1' in lines
    assert 'canary_mirror_pending{candidate="a"} 1' in lines
    assert 'canary_mirror_skipped_total{reason="unparseable"} 0' in lines
    assert 'canary_mirror_dropped_on_stop_total{candidate="a"} 0' in lines
    assert not any('outcome="dropped_on_stop"' in line for line in lines)
    assert any(line.startswith("canary_mirror_memory_bytes ") for line in lines)


def test_guard_sheds_on_cpu_saturation_and_lag() -> None:
    """The guard sheds while either the average lag or the CPU share is over its limit, in
    proportion to the excess, and counts episodes."""
    guard = LoopLagGuard(20.0, cpu_busy=0.9, window_s=1.0)
    guard.observe(0.001, 0.01)
    guard.observe_cpu(0.5, 1.0)
    assert not guard.shedding
    guard.observe_cpu(0.95, 1.0)
    assert guard.shedding and guard.sheds == 1 and abs(guard.shed_fraction - 0.5) < 1e-6
    guard.observe(0.001, 0.01)  # an on-time tick does not clear a CPU-saturated window
    assert guard.shedding
    guard.observe_cpu(0.3, 1.0)
    assert not guard.shedding
    for _ in range(10):
        guard.observe(0.1, 0.1)  # a whole window at 100 ms lag, the process idle: host load
    assert not guard.shedding
    guard.observe_cpu(0.6, 1.0)  # the same lag with the mirror itself busy: its own overload
    assert guard.shedding and guard.sheds == 2 and guard.shed_fraction == 1.0
    assert guard.max_lag_s == 0.1
    off = LoopLagGuard(20.0, cpu_busy=None)
    off.observe_cpu(1.0, 1.0)
    assert not off.shedding


def test_guard_wakes_rarely_while_its_lag_cannot_shed() -> None:
    """Below FAST_ABOVE_BUSY of a core (half of what lag needs to count) the guard's next
    wake-up is IDLE_INTERVAL_S away, at or above it `interval_s`: an idle mirror process does
    not wake 20 times a second."""
    guard = LoopLagGuard(20.0, cpu_busy=0.9, window_s=1.0)
    assert guard.current_interval_s == guard.interval_s == INTERVAL_S  # until a window says
    guard.observe_cpu(FAST_ABOVE_BUSY * 0.9, 1.0)
    assert guard.current_interval_s == IDLE_INTERVAL_S > INTERVAL_S
    guard.observe_cpu(FAST_ABOVE_BUSY, 1.0)
    assert guard.current_interval_s == INTERVAL_S
    guard.observe_cpu(0.95, 1.0)
    assert guard.current_interval_s == INTERVAL_S and guard.shedding


def test_idle_guard_ticks_at_the_idle_interval(run: Run[None]) -> None:
    """On a real loop: after one CPU window of idling the guard's wake-ups are IDLE_INTERVAL_S
    apart, and a loop kept busy brings back the fast ones within a window."""

    async def scenario() -> None:
        guard = LoopLagGuard(20.0, cpu_busy=None, window_s=0.2)
        guard.start()
        try:

            async def slow() -> bool:
                return guard.current_interval_s == IDLE_INTERVAL_S

            await until(slow, what="the idle guard's slow wake-ups", within_s=SETTLE_S)
            end = time.perf_counter() + 30.0
            while guard.current_interval_s != INTERVAL_S and time.perf_counter() < end:
                spin = time.thread_time() + 0.02
                while time.thread_time() < spin:  # the loop's own thread busy: its CPU share
                    pass
                await asyncio.sleep(0)
            assert guard.current_interval_s == INTERVAL_S, guard.busy
        finally:
            await guard.close()

    run(scenario())


def test_busy_loop_sheds_copies(run: Run[None]) -> None:
    """A loop kept busy without lagging (a saturated core) sheds copies through the CPU signal."""

    async def scenario() -> None:
        sink = InMemorySink()
        ep = Endpoint(name="a", url="http://127.0.0.1:9", sample_rate=1.0)
        # A low CPU limit: on a saturated shared host this thread may get a small share of a
        # core however hard it spins, and the test is about the signal, not the threshold.
        mirror = make_mirror([ep], sink, cpu_busy=0.05)
        mirror.guard.cpu_window_s = 0.05
        await mirror.start()
        try:
            async with asyncio.timeout(30):
                while mirror.guard.frac_cpu < 0.2:
                    end = time.thread_time() + 0.005
                    while time.thread_time() < end:  # short bursts: busy, but never 20 ms late
                        pass
                    await asyncio.sleep(0)
            assert mirror.guard.max_lag_s < 2.0
            shed = sum(send(mirror, chat(f"busy{i}"), f"r{i}") is None for i in range(100))
            assert shed > 0
            reasons = mirror.guard.reasons
            shed_total = reasons["cpu"] + reasons["lag"]
            assert mirror.counters()["a"]["shed_overload"] == shed == shed_total
            assert reasons["cpu"] > 0
        finally:
            await mirror.close()

    run(scenario())
