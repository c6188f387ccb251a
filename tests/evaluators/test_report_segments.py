"""Reports read from stored segments equal the full computation (SQLite and PostgreSQL).

A report reads a candidate's closed spans of arrival time from `report_segments` and builds only
what changed (evaluators.pairs.segments). Here the data come from the independent world
(tests/evaluators/world.py: sessions over minutes, clustered failures, heavy tails,
nondeterministic answers), written into the store over two rounds the way a fleet writes them:

- round 1 leaves out copies that will answer late (the candidate's and the control's
  observations of some old exchanges), the later turns of sessions still under way, and
  exchanges a lagging replica stores late; sessions are spread over two replicas, some split;
- round 2 writes all of those into spans that were already stored as segments, and the
  exchange rows of some old answers that were stored first (a fast copy's observation can reach
  the store before its exchange).

The recheck window below the watermark is narrowed to a few ids (the data here are far fewer
than its default), so each of the two checks, exchanges counted and observations counted, has
to catch its own kind of late row.

After each round the segmented report must equal, column for column and interval for interval,
the report built from the rows in one pass; after round 2 the untouched spans must have been
reused and the touched ones rebuilt.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from bench._shared import world
from domain.records import ObservationRecord
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs import segments
from evaluators.pairs.load import load_pairs
from evaluators.pairs.spill import Spill
from evaluators.pairs.types import Pair
from evaluators.report.build import evaluate
from storage.models import ExchangeRow, ObservationRow, ReportSegmentRow
from storage.reports import segments as seg_store
from storage.textguard import observation_row
from tests.evaluators.test_eval_pairs import assert_same, pair_exchange, register

SPAN_S = 900.0  # the traffic spans ~14 grid cells
WORLD = world.World(
    candidate=world.Engine(ttft_later=0.8, nondeterminism=0.05, bad_sessions=0.03),
    control=world.Engine(nondeterminism=0.05),
    sessions_per_s=0.2,
    think_s=20.0,
)


def _traffic(now: float) -> list[Pair]:
    """World sessions ending a little before `now`, each handled by replica-a or replica-b
    (a tenth of the sessions split between both, as a balancer not keyed on the session)."""
    rng = np.random.default_rng(20261201)
    pairs = world.draw(WORLD, 180, rng)
    shift = now - 30.0 - max(p.received_at for p in pairs)
    out = []
    for p in pairs:
        session = int(p.session_key[1:]) if p.session_key else 0
        replica = "replica-a" if session % 2 else "replica-b"
        if session % 10 == 3 and p.turn_index % 2:
            replica = "replica-a" if replica == "replica-b" else "replica-b"
        out.append(
            msgspec.structs.replace(
                p,
                received_at=p.received_at + shift,
                replica=replica,
                model="m-large" if session % 7 == 0 else "m",
                json_requested=session % 11 == 0,
            )
        )
    return out


def _observation(p: Pair, endpoint: str) -> dict[str, Any] | None:
    obs = {"live": p.production, "cand": p.candidate, "ctrl": p.control}[endpoint]
    if obs is None:
        return None
    record = ObservationRecord(
        exchange_id=p.exchange_id,
        endpoint=endpoint,
        arm="production" if endpoint == "live" else "candidate",
        **msgspec.structs.asdict(obs),
    )
    return observation_row(record, store_text=True, max_chars=4096)


async def _write(
    engine: AsyncEngine, exchanges: list[Pair], observations: list[tuple[Pair, str]]
) -> None:
    rows = [r for p, ep in observations if (r := _observation(p, ep)) is not None]
    async with engine.begin() as conn:
        if exchanges:
            await conn.execute(insert(ExchangeRow), [pair_exchange(p) for p in exchanges])
        if rows:
            await conn.execute(insert(ObservationRow), rows)


def _comparable(report: Any) -> Any:
    out = msgspec.to_builtins(report)
    out.pop("generated_at")
    return out


async def _both(engine: AsyncEngine, until: float, spill: Spill) -> tuple[Any, Any]:
    """(segmented, full) reports of `cand` at `until`, and their PairSets equal; the segmented
    one assembled on the heap and in a spill file (`spill`) gives the same pairs and report."""
    # A similarity sample smaller than the window (the spans' own samples are larger).
    settings = VerdictSettings().with_overrides(
        {"session_idle_s": 60.0, "similarity_max_pairs": 300}
    )
    kw: dict[str, Any] = {"since": 0.0, "until": until, "similarity_max_pairs": 300}
    fast = await load_pairs(engine, "cand", **kw)
    slow = await load_pairs(engine, "cand", **kw, segmented=False)
    assert 0 < fast.similarity_fraction < 1
    spilled = await load_pairs(engine, "cand", **kw, spill=spill)
    assert fast.backing is None and spilled.backing is not None  # the file holds its columns
    for ps in (slow, spilled):
        assert_same(fast, ps)
        assert (fast.pending, fast.replicas, fast.similarity_fraction) == (
            ps.pending,
            ps.replicas,
            ps.similarity_fraction,
        )
    del spilled
    seg = await evaluate(engine, "cand", since=0.0, until=until, settings=settings)
    full = await evaluate(
        engine, "cand", since=0.0, until=until, settings=settings, segmented=False
    )
    on_file = await evaluate(engine, "cand", since=0.0, until=until, settings=settings, spill=spill)
    assert _comparable(on_file) == _comparable(seg)
    return seg, full


async def _segments(engine: AsyncEngine) -> dict[tuple[float, float], float]:
    s = ReportSegmentRow.__table__.c
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(s.starts_at, s.ends_at, s.computed_at).where(s.candidate == "cand")
        )
        return {(a, b): at for a, b, at in rows}


async def test_segmented_reports_equal_the_full_computation(
    db_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(seg_store, "RECHECK_IDS", 3)
    await register(db_engine)
    now = time.time()
    pairs = _traffic(now)
    rng = np.random.default_rng(7)
    old = [p for p in pairs if p.received_at < now - 400]
    # Each kind of late row lands in spans of its own (by grid cell, in turn), and a quarter of
    # the old spans get none: each check must catch its own kind, and untouched spans are kept.
    kind = {p.exchange_id: segments.cell_of(p.received_at) % 4 for p in old}
    picked = {x for x in kind if rng.random() < 0.15}
    # Copies that answer late: the candidate's and the control's answers to old exchanges.
    late_copy = {x for x in picked if kind[x] == 0}
    # A lagging replica: old exchanges (and their answers) reach the store late.
    late_exchange = {x for x in picked if kind[x] == 1}
    # Answers stored before their exchange: the exchange row alone comes in round 2.
    row_after = {x for x in picked if kind[x] == 2}
    assert late_copy and late_exchange and row_after
    # Sessions still under way: the turns after 150 s before now come in round 2.
    cut = now - 150
    first = [p for p in pairs if p.received_at < cut and p.exchange_id not in late_exchange]
    arms = ("live", "cand", "ctrl")
    await _write(
        db_engine,
        [p for p in first if p.exchange_id not in row_after],
        [
            (p, ep)
            for p in first
            for ep in arms
            if not (ep != "live" and p.exchange_id in late_copy)
        ],
    )
    # Every window spills (1 byte allowed on the heap) in the spill variant.
    (tmp_path / "spill").mkdir()
    spill = Spill(str(tmp_path / "spill"), over_bytes=1)
    seg1, full1 = await _both(db_engine, until=cut, spill=spill)
    assert seg1.pairs.lost + seg1.pairs.pending >= len(late_copy) > 0  # not answered yet
    assert _comparable(seg1) == _comparable(full1)
    stored1 = await _segments(db_engine)
    assert len(stored1) >= 8, stored1  # the window's closed spans were stored

    # Round 2: the late copies, the late exchanges, the rest of the sessions.
    second = [p for p in pairs if p.received_at >= cut or p.exchange_id in late_exchange]
    late = [p for p in pairs if p.exchange_id in late_copy]
    await _write(
        db_engine,
        second + [p for p in pairs if p.exchange_id in row_after],
        [(p, ep) for p in second for ep in arms] + [(p, ep) for p in late for ep in arms[1:]],
    )
    until = now + 1
    seg2, full2 = await _both(db_engine, until=until, spill=spill)
    assert _comparable(seg2) == _comparable(full2)
    assert seg2.pairs.n == len(pairs) - sum(p.candidate is None for p in pairs)
    assert seg2.pairs.split_sessions > 0 and seg2.pairs.lost < seg1.pairs.lost

    # The spans nothing was added to were reused as stored; every touched span was rebuilt.
    stored2 = await _segments(db_engine)
    touched = {
        segments.cell_of(p.received_at)
        for p in pairs
        if p.exchange_id in late_copy | late_exchange | row_after or p.received_at >= cut
    }
    kept = [span for span in stored1 if stored2.get(span) == stored1[span]]
    rebuilt = [span for span in stored1 if stored2.get(span) != stored1[span]]
    assert kept and rebuilt
    assert {segments.cell_of(a) for a, _ in rebuilt} == touched & {
        segments.cell_of(a) for a, _ in stored1
    }


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_read_only_role_still_gets_the_report(db_url: str, tmp_path: Path) -> None:
    """A report read with a role that may only SELECT (an auditor's `canary report`) cannot
    store segments: it builds its spans from the rows and says nothing different."""
    import asyncpg

    from storage.engine import make_engine, upgrade

    await upgrade(db_url)
    engine = make_engine(db_url)
    role = f"canary_ro_{uuid.uuid4().hex[:12]}"
    dsn = db_url.replace("postgresql+asyncpg://", "postgresql://")
    admin = await asyncpg.connect(dsn)
    try:
        await register(engine)
        now = time.time()
        pairs = _traffic(now)
        await _write(engine, pairs, [(p, ep) for p in pairs for ep in ("live", "cand", "ctrl")])
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        user, _ = db_url.split("://", 1)[1].split("@", 1)
        reader = make_engine(db_url.replace(f"://{user}@", f"://{role}@"))
        try:
            seg, full = await _both(reader, until=now, spill=Spill(str(tmp_path), 1))
        finally:
            await reader.dispose()
        assert _comparable(seg) == _comparable(full)
        assert await _segments(engine) == {}  # nothing stored, nothing half-written
    finally:
        await engine.dispose()
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def test_max_pairs_bounds_the_window_at_its_exact_count(db_engine: AsyncEngine) -> None:
    """`max_pairs` (the report process's `report_max_pairs`): a window of exactly that many
    pairs loads, one more is refused on the counts, whichever path reads it."""
    from domain.errors import ReportTooLarge

    await register(db_engine)
    now = time.time()
    pairs = _traffic(now)
    await _write(db_engine, pairs, [(p, ep) for p in pairs for ep in ("live", "cand", "ctrl")])
    kw: dict[str, Any] = {"since": 0.0, "until": now}
    n = (await load_pairs(db_engine, "cand", **kw, segmented=False)).n
    assert n > 100
    for segmented in (True, False):
        ps = await load_pairs(db_engine, "cand", **kw, segmented=segmented, max_pairs=n)
        assert ps.n == n
        with pytest.raises(ReportTooLarge, match=f"holds {n:,} pairs"):
            await load_pairs(db_engine, "cand", **kw, segmented=segmented, max_pairs=n - 1)
