"""Loading pairs from storage (SQLite and PostgreSQL): alignment of the three arms, lost and
pending copies, batching, the control and the copy accounting."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields

import msgspec
import numpy as np
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from domain.errors import EndpointNotFound
from domain.records import ObservationRecord
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs import synthetic
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.pairs.load import (
    count_pairs,
    load_accounting,
    load_endpoints,
    load_pairs,
)
from evaluators.pairs.types import ArmColumns, Comparison, Pair, PairSet
from evaluators.report.build import evaluate
from storage import queries
from storage.models import ExchangeRow, ObservationRow
from storage.textguard import exchange_row, observation_row
from tests.stored_pairs import exchange_record

SCENARIO = synthetic.Scenario(
    candidate=synthetic.Arm(divergence=0.2, error_rate=0.02, invalid_json=0.1),
    missing_candidate=0.05,
    json_fraction=0.2,
    tools_fraction=0.1,
)


async def register(engine: AsyncEngine) -> None:
    """The live endpoint, the candidate `cand`, a control `ctrl` and an unrelated `other`."""
    await queries.create_endpoint(engine, Endpoint(name="live", url="http://l", role="live"))
    for name, kind in (("cand", "quantized"), ("ctrl", "control"), ("other", "")):
        await queries.create_endpoint(engine, Endpoint(name=name, url="http://c", kind=kind))


def _obs(
    obs: synthetic.ArmObs | None, pair: Pair, endpoint: str, arm: str
) -> list[dict[str, object]]:
    if obs is None:
        return []
    record = ObservationRecord(
        exchange_id=pair.exchange_id,
        endpoint=endpoint,
        arm="production" if arm == "production" else "candidate",
        **msgspec.structs.asdict(obs),
    )
    return [observation_row(record, store_text=True, max_chars=4096)]


def pair_exchange(p: Pair, targets: tuple[str, ...] = ("cand", "ctrl")) -> dict[str, object]:
    """The `exchanges` row the gateway writes for a pair's production request."""
    record = exchange_record(p, targets)
    return exchange_row(record)


async def store(
    engine: AsyncEngine, pairs: list[Pair], targets: tuple[str, ...] = ("cand", "ctrl")
) -> None:
    """Write the pairs as the gateway would: exchanges with their targets, observations."""
    exchanges, observations = [], []
    for p in pairs:
        exchanges.append(pair_exchange(p, targets))
        observations += _obs(p.production, p, "live", "production")
        observations += _obs(p.candidate, p, "cand", "candidate")
        observations += _obs(p.control, p, "ctrl", "candidate")
    async with engine.begin() as conn:
        await conn.execute(insert(ExchangeRow), exchanges)
        await conn.execute(insert(ObservationRow), observations)


def assert_same(a: PairSet, b: PairSet) -> None:
    """Every column of two PairSets is equal (NaN equal to NaN)."""
    assert (a.n, a.lost, a.has_control, a.models) == (b.n, b.lost, b.has_control, b.models)
    for f in fields(PairSet):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if isinstance(va, ArmColumns | Comparison):
            for g in fields(va):
                ga, gb = getattr(va, g.name), getattr(vb, g.name)
                if isinstance(ga, dict):  # ArmColumns.quantities: one column per name
                    assert ga.keys() == gb.keys()
                    for name in ga:
                        np.testing.assert_array_equal(ga[name], gb[name], name)
                else:
                    np.testing.assert_array_equal(ga, gb, g.name)
        elif isinstance(va, np.ndarray):
            np.testing.assert_array_equal(va, vb, f.name)


async def test_stored_pairs_load_like_the_same_pairs_in_memory(db_engine: AsyncEngine) -> None:
    """Pairs written to storage load into exactly the PairSet built from them in memory:
    the same arms aligned, the same text features, the same lost count."""
    await register(db_engine)
    pairs = synthetic.pairs(SCENARIO, 300, seed=3, start=time.time() - 3600)
    await store(db_engine, pairs)
    loaded = await load_pairs(db_engine, "cand", since=0.0)
    expected = pairset_from_pairs(pairs)
    assert loaded.lost == sum(p.candidate is None for p in pairs) > 0
    assert np.count_nonzero(loaded.vs_candidate.match == 0) > 0
    assert np.count_nonzero(loaded.candidate.json_valid == 0) > 0
    assert_same(loaded, expected)


async def test_batches_do_not_change_the_result(db_engine: AsyncEngine) -> None:
    """Reading the rows in batches of 7 gives the same PairSet as reading stored segments, and
    progress is told the total first, then counts every row."""
    await register(db_engine)
    pairs = synthetic.pairs(SCENARIO, 100, seed=4, start=time.time() - 3600)
    await store(db_engine, pairs)
    seen: list[int] = []
    totals: list[int] = []

    def progress(total: int) -> tuple[Callable[[int], None], Callable[[], None]]:
        totals.append(total)
        return seen.append, lambda: None

    small = await load_pairs(
        db_engine, "cand", since=0.0, batch_size=7, progress=progress, segmented=False
    )
    assert_same(small, await load_pairs(db_engine, "cand", since=0.0))
    assert totals == [100] and sum(seen) == 100 and max(seen) == 7
    assert await count_pairs(db_engine, "cand", since=0.0) == 100


async def test_only_targeted_exchanges_are_pairs(db_engine: AsyncEngine) -> None:
    """Exchanges mirrored only to another candidate are neither pairs nor lost for this one;
    a targeted copy without an observation is lost, or pending while within the timeout."""
    await register(db_engine)
    now = time.time()
    old = synthetic.pairs(synthetic.Scenario(missing_candidate=1.0), 10, seed=5, start=now - 900)
    await store(db_engine, old, targets=("cand",))
    fresh = synthetic.pairs(synthetic.Scenario(missing_candidate=1.0), 4, seed=6, start=now - 1)
    fresh = [msgspec.structs.replace(p, exchange_id="f" + p.exchange_id) for p in fresh]
    await store(db_engine, fresh, targets=("cand",))
    other = synthetic.pairs(synthetic.Scenario(), 6, seed=7, start=now - 800)
    other = [
        msgspec.structs.replace(p, exchange_id="o" + p.exchange_id, candidate=None) for p in other
    ]
    await store(db_engine, other, targets=("other",))
    ps = await load_pairs(db_engine, "cand", since=0.0)
    # the candidate's timeout is 300 s: the 4 fresh copies may still be answered
    assert (ps.n, ps.lost, ps.pending) == (14, 10, 4)


async def test_control_is_found_by_kind(db_engine: AsyncEngine) -> None:
    """The control is the candidate of kind "control"; a control's own report has none."""
    await register(db_engine)
    cand, live, control = await load_endpoints(db_engine, "cand")
    assert (cand.name, live and live.name, control and control.name) == ("cand", "live", "ctrl")
    _, _, none = await load_endpoints(db_engine, "ctrl")
    assert none is None
    with pytest.raises(EndpointNotFound):
        await load_endpoints(db_engine, "ghost")


async def test_accounting_sums_every_replica(db_engine: AsyncEngine) -> None:
    """Copy accounting is each counter summed over the replicas' snapshots, zero when absent."""
    await queries.upsert_counters(db_engine, "r1", {"cand": {"sampled": 10, "dropped_overflow": 2}})
    await queries.upsert_counters(db_engine, "r2", {"cand": {"sampled": 5}, "x": {"sampled": 9}})
    acc = await load_accounting(db_engine, "cand")
    assert acc["sampled"] == 15 and acc["dropped_overflow"] == 2 and acc["timed_out"] == 0


async def test_evaluate_reports_from_storage(db_engine: AsyncEngine) -> None:
    """evaluate() loads pairs, control and accounting and builds the candidate's report."""
    await register(db_engine)
    pairs = synthetic.pairs(SCENARIO, 200, seed=8, start=time.time() - 3600)
    await store(db_engine, pairs)
    await queries.upsert_counters(db_engine, "r1", {"cand": {"sampled": 200, "observed_ok": 190}})
    report = await evaluate(db_engine, "cand", since=0.0, settings=VerdictSettings())
    assert report.candidate == "cand" and report.kind == "quantized"
    assert report.pairs.control == "ctrl" and report.pairs.reference == "control"
    assert report.accounting["sampled"] == 200
    assert report.pairs.n == sum(p.candidate is not None for p in pairs)
    with pytest.raises(EndpointNotFound):
        await evaluate(db_engine, "ghost", settings=VerdictSettings())
