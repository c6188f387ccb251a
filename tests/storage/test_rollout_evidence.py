"""The ramp's evidence in storage, on real SQLite and PostgreSQL: revision 0009 up and down, the
writer's own bounded queue for ramp records (drops counted), and `rollout_requests` returning one
rollout's requests as the arrays `evaluators.rollout.arms.session_units` takes and summarizes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.records import RolloutRecord
from evaluators.rollout.arms import session_units
from storage.engine import downgrade, make_engine, upgrade
from storage.queries import count_rows
from storage.reports import rollout as rollout_sql
from storage.reports.rollout import ROLLOUT_COLUMNS, rollout_requests
from storage.writer import ObservationWriter


def rec(
    at: float,
    session: int,
    arm: int,
    turn: int = 1,
    *,
    generation: int = 6,
    error: str | None = None,
    ttft: float | None = 0.1,
    e2e: float | None = 1.0,
) -> RolloutRecord:
    status = 200 if error is None else 502
    return RolloutRecord(
        status=status, error_kind=error, ttft_s=ttft, e2e_s=e2e, finished=True,
        generation=generation, arm=arm, session=session, at=at, turn=turn, replica="h1",
    )  # fmt: skip


def writer(engine: AsyncEngine, **kw: int | float) -> ObservationWriter:
    opts: dict[str, int | float] = {"batch_size": 100, "flush_interval_s": 0.05}
    opts.update(kw)
    return ObservationWriter(
        engine,
        queue_max=1000,
        store_text=False,
        store_text_max_chars=100,
        **opts,  # type: ignore[arg-type]
    )


def _tables(conn: object) -> set[str]:
    return set(inspect(conn).get_table_names())


async def test_rollout_requests_revision_up_and_down(db_url: str) -> None:
    """0009 creates `rollout_requests` with its (generation, at) index, keeps rows across the
    upgrades after it (read at the latest revision: the reader selects every column declared
    now), and its downgrade drops the table and nothing else."""
    await upgrade(db_url, "0008")
    engine = make_engine(db_url)
    try:
        async with engine.connect() as conn:
            before = await conn.run_sync(_tables)
        assert "rollout_requests" not in before and "rollouts" in before
        await upgrade(db_url, "0009")
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO rollout_requests (generation, at, session, arm, turn, status, "
                    "error_kind, ttft_s, e2e_s, finished, replica) "
                    "VALUES (4, 1.5, -9, 1, 1, 200, NULL, NULL, 0.5, true, 'h')"
                )
            )
            indexes = await conn.run_sync(
                lambda c: [i["name"] for i in inspect(c).get_indexes("rollout_requests")]
            )
        assert indexes == ["ix_rollout_requests_generation_at"]
        await upgrade(db_url)
        got = await rollout_requests(engine, 4, None, None)
        assert got["session"].tolist() == [-9] and math.isnan(got["ttft_s"][0])
        await downgrade(db_url, "0008")
        async with engine.connect() as conn:
            assert await conn.run_sync(_tables) == before
        await upgrade(db_url)
        assert await count_rows(engine, "rollout_requests") == 0
    finally:
        await engine.dispose()


async def test_writer_stores_rollout_records_and_rollout_requests_reads_them(
    db_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records of one generation come back in arrival order, windowed on `at`, as typed arrays
    (NULL latencies as NaN, client disconnects marked, failures not ok), read in several
    batches, and `session_units` summarizes them per session with the right arm."""
    monkeypatch.setattr(rollout_sql, "_BATCH", 3)  # several fetches for eight rows
    big = -(2**63) + 5  # the full signed 64-bit range survives both dialects
    records = [
        rec(10.0, 1, 0, 1, ttft=0.2),
        rec(11.0, 2, 1, 1, ttft=0.4),
        rec(12.0, 1, 0, 2, ttft=0.1),
        rec(13.0, 2, 1, 2, error="http_5xx", ttft=None, e2e=None),
        rec(14.0, big, 1, 1, error="client_disconnect", ttft=None, e2e=0.3),
        rec(15.0, 2, 1, 3, ttft=0.3),
        rec(16.0, 3, 0, 1, ttft=0.5),
        rec(50.0, 3, 0, 2),  # after the window
        rec(12.5, 1, 1, 1, generation=7),  # another rollout
    ]
    w = writer(db_engine)
    await w.start()
    for r in reversed(records):  # stored out of order: the query orders by `at`
        w.put_rollout(r)
    await w.close(5.0)
    assert w.stats()["written_ramp"] == len(records) and w.stats()["ramp_dropped"] == 0

    got = await rollout_requests(db_engine, 6, 10.0, 50.0)
    assert {k: v.dtype for k, v in got.items()} == {
        k: np.dtype(t) for k, t in ROLLOUT_COLUMNS.items()
    }
    assert got["session"].tolist() == [1, 2, 1, 2, big, 2, 3]
    assert got["arm"].tolist() == [0, 1, 0, 1, 1, 1, 0]
    assert got["turn"].tolist() == [1, 1, 2, 2, 1, 3, 1]
    assert got["ok"].tolist() == [True, True, True, False, False, True, True]
    assert got["disconnected"].tolist() == [False, False, False, False, True, False, False]
    assert np.isnan(got["ttft_s"][[3, 4]]).all() and got["e2e_s"][4] == 0.3
    assert len((await rollout_requests(db_engine, 6, None, None))["session"]) == 8
    assert (await rollout_requests(db_engine, 8, None, None))["session"].shape == (0,)

    units = session_units(got, slo_ttft_s=0.25, slo_e2e_s=10.0)
    assert units.session.tolist() == [1, big, 2, 3]  # in closing order
    by = {int(s): i for i, s in enumerate(units.session)}
    assert units.candidate.tolist() == [False, True, True, False]
    assert all(math.isnan(v[by[big]]) for v in units.values.values())  # it only disconnected
    assert units.values["failure"][by[2]] == pytest.approx(1 / 3)
    assert units.values["ttft_first"][by[1]] == pytest.approx(math.log(0.2))
    assert units.values["ttft_later"][by[1]] == pytest.approx(math.log(0.1))
    assert units.values["ttft_later"][by[2]] == pytest.approx(math.log(0.3))
    assert units.values["ttft_slo"][[by[1], by[2], by[3]]].tolist() == [0.0, 1.0, 1.0]
    assert units.arm("failure", True).tolist() == pytest.approx([1 / 3])


async def test_rollout_queue_is_bounded_on_its_own_and_counts_drops(db_engine: AsyncEngine) -> None:
    """Ramp records beyond `evidence_queue_max` are dropped and counted while the mirror's own
    queue is untouched; what was queued is written on close."""
    w = writer(db_engine, flush_interval_s=30.0, evidence_queue_max=3)
    await w.start()
    for i in range(5):
        w.put_rollout(rec(float(i), i, i % 2))
    assert w.stats()["ramp_dropped"] == 2 and w.stats()["queue_depth"] == 3
    await w.close(5.0)
    assert w.stats()["written_ramp"] == 3
    assert await count_rows(db_engine, "rollout_requests") == 3
    w.put_rollout(rec(9.0, 9, 0))  # after close: dropped, counted
    assert w.stats()["ramp_dropped"] == 3
