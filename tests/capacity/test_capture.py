"""Capture: the sink's policy (whole conversations, bounds, redaction, counters) as pure code,
then through the real gateway into real SQLite and PostgreSQL, read back as replayable sessions."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest
import xxhash
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.errors import ConfigError
from domain.records import ExchangeRecord
from gateway.config.load import load_config
from gateway.mirror.capture import (
    CAPTURE_SALT,
    REDACTED,
    CaptureSink,
    redact_body,
    session_captured,
)
from gateway.process.runtime import running
from gateway.sim.profiles import get_profile
from gateway.sim.server import start_sim
from gateway.sim.workload import WorkloadSpec, run_workload
from storage.capacity.captures import capture_stats, load_sessions
from storage.engine import make_engine

SECRET = "sk-capture-test-secret"


def _exchange(session: str, turn: int, targets: tuple[str, ...] = ("a",)) -> ExchangeRecord:
    return ExchangeRecord(
        id=f"{session}-{turn}",
        received_at=1000.0 + turn,
        route="/v1/chat/completions",
        session_key=session,
        turn_index=turn,
        targets=targets,
    )


def _body(user: str = "alice") -> bytes:
    return msgspec.json.encode(
        {
            "model": "m",
            "user": user,
            "metadata": {"email": "a@b.c", "team": "x"},
            "messages": [{"role": "user", "content": "hi", "name": "alice"}],
        }
    )


def _sink(**kw: object) -> CaptureSink:
    args: dict[str, object] = {
        "share": 1.0,
        "max_bytes": 1 << 20,
        "max_body_bytes": 1 << 16,
        "queue_max": 100,
    }
    args.update(kw)
    return CaptureSink(**args)  # type: ignore[arg-type]


def test_share_decision_matches_the_documented_formula() -> None:
    """A conversation is captured iff xxh3_64(CAPTURE_SALT + key) / 2**64 < share, so about
    `share` of conversations are, and every turn of one conversation gets the same decision."""
    keys = [f"{i:032x}" for i in range(4000)]
    for key in keys[:200]:
        expected = xxhash.xxh3_64_intdigest(CAPTURE_SALT + key.encode()) / 2**64 < 0.25
        assert session_captured(key, 0.25) is expected
    share = sum(session_captured(k, 0.25) for k in keys) / len(keys)
    assert 0.22 < share < 0.28
    sink = _sink(share=0.25)
    for key in keys[:100]:
        for turn in range(3):
            sink.offer(_exchange(key, turn), _body(), {})
    taken = sink.take(1000)
    by_session: dict[str, list[int]] = {}
    for rec in taken:
        by_session.setdefault(rec.session_key, []).append(rec.turn_index)
    assert by_session and all(turns == [0, 1, 2] for turns in by_session.values())
    assert sink.counts["captured"] + sink.counts["not_sampled"] == 300


def test_bounds_refuse_and_count() -> None:
    """The per-body limit, the byte budget and the queue bound each refuse and count; the
    candidate filter counts what it skips; nothing is queued past a bound."""
    body = _body()
    sink = _sink(max_body_bytes=len(body) - 1)
    sink.offer(_exchange("s", 0), body, {})
    assert sink.counts["refused_oversize"] == 1 and sink.depth == 0
    sink = _sink(max_bytes=len(body) * 2)
    for turn in range(3):
        sink.offer(_exchange("s", turn), body, {})
    assert sink.counts["captured"] == 2 and sink.counts["refused_budget"] == 1
    sink.take(10)
    assert sink.stored_bytes == 2 * len(body) and sink.queued_bytes == 0
    sink.set_stored_bytes(0)  # the purge freed the room
    sink.offer(_exchange("s", 3), body, {})
    assert sink.counts["captured"] == 3
    sink = _sink(queue_max=2)
    for turn in range(3):
        sink.offer(_exchange("s", turn), body, {})
    assert sink.depth == 2 and sink.counts["refused_queue_full"] == 1
    sink = _sink(candidates=["b"])
    sink.offer(_exchange("s", 0, targets=("a",)), body, {})
    sink.offer(_exchange("s", 1, targets=("a", "b")), body, {})
    assert sink.counts["not_targeted"] == 1 and sink.counts["captured"] == 1


def test_redaction_of_fields_and_headers() -> None:
    """Configured JSON paths (with `*`) and secret headers are stored as "[redacted]";
    Authorization is redacted even when not configured; bodies that are not JSON objects are
    dropped, counted."""
    out = msgspec.json.decode(
        redact_body(_body(), [("user",), ("metadata", "*"), ("messages", "*", "name")]) or ""
    )
    assert out["user"] == REDACTED
    assert out["metadata"] == {"email": REDACTED, "team": REDACTED}
    assert out["messages"][0] == {"role": "user", "content": "hi", "name": REDACTED}
    assert redact_body(b"[1, 2]", []) is None and redact_body(b"\xff{", []) is None
    sink = _sink(redact_fields=["user"], redact_headers=["x-api-key"])
    headers = {"Authorization": f"Bearer {SECRET}", "X-Api-Key": SECRET, "X-Session-ID": "s1"}
    sink.offer(_exchange("s", 0), _body(), headers)
    sink.offer(_exchange("s", 1), b"not json", headers)
    (rec,) = sink.take(10)
    assert SECRET not in rec.headers and SECRET not in rec.body
    assert msgspec.json.decode(rec.headers) == {
        "authorization": REDACTED,
        "x-api-key": REDACTED,
        "x-session-id": "s1",
    }
    assert sink.counts["refused_unparseable"] == 1


def test_capture_is_off_by_default_and_store_text_false_keeps_it_off() -> None:
    """Defaults capture nothing; `[capture] enabled` with `[storage] store_text = false` is
    refused with a message naming the override, and accepted with it."""
    assert load_config(None, environ={}).capture.enabled is False
    with pytest.raises(ConfigError, match=r"capture\.despite_store_text_off"):
        load_config(None, environ={}, overrides={"capture": True, "store_text": False})
    cfg = load_config(
        None,
        environ={},
        overrides={"capture": True, "store_text": False, "capture_despite_store_text_off": True},
    )
    assert cfg.capture.enabled


async def test_gateway_captures_whole_conversations(migrated_db_url: str) -> None:
    """Conversations through a real gateway with capture on are stored whole, in turn order,
    with think times, secrets redacted, and read back as sessions to replay; with capture off
    nothing is stored."""
    url = migrated_db_url
    live = await start_sim(get_profile("baseline", time_scale=0.02))
    shadow = await start_sim(get_profile("baseline", time_scale=0.02))
    try:
        for capture in (False, True):
            config = load_config(
                None,
                environ={},
                overrides={
                    "listen": "127.0.0.1:0",
                    "live_url": live.url,
                    "db_url": url,
                    "mirror_shed_loop_lag_ms": 500.0,
                    "mirror_shed_cpu_busy": 0.0,
                    "capture": capture,
                    "capture_share": 1.0,
                    "candidates": [
                        {
                            "name": "shadow",
                            "url": shadow.url,
                            "sample_rate": 1.0,
                            "sampling": "session",
                        }
                    ],
                },
            )
            async with running(config) as parts:
                spec = WorkloadSpec(sessions=6, turns=3, concurrency=3, seed=3, tools_every=0)
                await run_workload(parts.url, spec, headers={"Authorization": f"Bearer {SECRET}"})
                await parts.mirror.wait_idle()
            engine = make_engine(url)
            try:
                turns, sessions, stored = await capture_stats(engine)
                pool = await load_sessions(engine, candidate="shadow")
                async with engine.connect() as conn:
                    leaked = await conn.scalar(
                        text("SELECT count(*) FROM captures WHERE headers LIKE :s"),
                        {"s": f"%{SECRET}%"},
                    )
            finally:
                await engine.dispose()
            if not capture:
                assert (turns, sessions, stored) == (0, 0, 0)
                continue
            assert (turns, sessions) == (18, 6) and stored > 0 and leaked == 0
            assert len(pool) == 6 and all(len(s.turns) == 3 for s in pool)
            for session in pool:
                assert session.turns[0].think_s == 0.0
                assert all(t.think_s >= 0.0 for t in session.turns)
                bodies = [msgspec.json.decode(t.body) for t in session.turns]
                # turn k carries k assistant answers: the history production saw
                assert [sum(m["role"] == "assistant" for m in b["messages"]) for b in bodies] == [
                    0,
                    1,
                    2,
                ]
    finally:
        await asyncio.gather(live.close(), shadow.close())


async def test_retention_purge_and_turn_gaps(db_engine: AsyncEngine) -> None:
    """The purge deletes captures past the retention age and reports the bytes left (what the
    byte budget counts); a conversation is cut at its first missing turn, and a retried turn
    stored twice is replayed once."""
    from domain.capture import CaptureRecord
    from storage.capacity.captures import insert_captures, purge_captures

    def rec(session: str, turn: int, at: float, suffix: str = "") -> CaptureRecord:
        return CaptureRecord(
            exchange_id=f"{session}-{turn}{suffix}",
            session_key=session,
            turn_index=turn,
            received_at=at,
            answered_at=at + 0.5,
            route="/v1/chat/completions",
            model="m",
            targets=("a",),
            body='{"messages": []}',
            headers="{}",
            body_bytes=100,
        )

    now = time.time()
    await insert_captures(
        db_engine,
        [
            rec("old", 0, now - 1000),
            rec("gap", 0, now),
            rec("gap", 2, now + 2),
            rec("dup", 0, now),
            rec("dup", 1, now + 1.5),
            rec("dup", 1, now + 3, "-retry"),
        ],
    )
    deleted, stored = await purge_captures(db_engine, now - 500)
    assert (deleted, stored) == (1, 500)
    pool = {s.session_key: s for s in await load_sessions(db_engine)}
    assert set(pool) == {"gap", "dup"}
    assert len(pool["gap"].turns) == 1
    assert [t.think_s for t in pool["dup"].turns] == [0.0, pytest.approx(1.0)]
