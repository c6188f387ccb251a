"""The report process's core (`LocalReports`): one computation per identical look, a bounded
queue that refuses past its bound (counted), unknown names and bad overrides told apart."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from domain.errors import EndpointNotFound, InvalidSettings
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs.segments import GRID_S
from gateway.control.reports import LocalReports, ReportsUnavailable
from storage import queries

GRID_MARGIN_S = 10.0  # far more than the refreshes take on a busy host (under 2 s)


async def _register(engine: AsyncEngine, *names: str) -> None:
    await queries.create_endpoint(engine, Endpoint(name="live", url="http://l", role="live"))
    for name in names:
        await queries.create_endpoint(engine, Endpoint(name=name, url=f"http://{name}"))


async def test_identical_looks_share_one_report_and_the_queue_is_bounded(
    db_engine: AsyncEngine,
) -> None:
    await _register(db_engine, "a", "b", "c")
    reports = LocalReports(db_engine, VerdictSettings(), concurrency=1, queue_max=1)
    results = await asyncio.gather(
        reports.report("a"),
        reports.report("a"),  # the same look, asked while the first is computed: shared
        reports.report("b"),  # waits for the one slot (queue_max 1)
        reports.report("c"),  # one computing, one waiting: refused
        return_exceptions=True,
    )
    first, again, b, c = results
    assert not isinstance(first, BaseException) and not isinstance(b, BaseException)
    assert again is first  # the very same document
    assert first.verdict == "hold" and b'"candidate":"a"' in first.body
    assert isinstance(c, ReportsUnavailable) and "reports.queue_max" in str(c)
    assert reports.stats["computed"] == 2 and reports.stats["shared"] == 1
    assert reports.stats["refused"] == 1
    # Once the queue drained, the next look is computed afresh.
    assert (await reports.report("c")).verdict == "hold"
    assert reports.stats["computed"] == 3


async def test_unknown_candidate_and_bad_override(db_engine: AsyncEngine) -> None:
    await _register(db_engine)
    await queries.create_endpoint(
        db_engine, Endpoint(name="odd", url="http://o", verdict={"nonsense": 1.0})
    )
    reports = LocalReports(db_engine, VerdictSettings())
    with pytest.raises(EndpointNotFound):
        await reports.report("ghost")
    with pytest.raises(InvalidSettings, match="nonsense"):
        await reports.report("odd")
    assert reports.stats["failed"] == 0  # an operator's mistake is not a failure of the process


async def test_background_refresh_keeps_segments_current(db_engine: AsyncEngine) -> None:
    """The report process's refresh builds each active candidate's closed spans once, builds
    nothing when nothing changed, rebuilds the span a late copy lands in, and skips a paused
    candidate."""
    from sqlalchemy import func, insert, select, update

    from storage.models import EndpointRow, ObservationRow, ReportSegmentRow
    from tests.evaluators.test_eval_pairs import register
    from tests.evaluators.test_report_segments import _observation, _traffic, _write

    await register(db_engine)  # live, cand, ctrl (control), other
    await queries.update_endpoint(db_engine, "other", {"state": "paused"})
    # The refreshes below count spans, so they must not straddle a grid line: one passing
    # between them closes the cell the newest traffic is in, and the next refresh builds it
    # (rightly). Start with at least GRID_MARGIN_S left in the current cell.
    left = GRID_S - time.time() % GRID_S
    if left < GRID_MARGIN_S:
        await asyncio.sleep(left + 0.1)
    now = time.time()
    async with db_engine.begin() as conn:  # registered an hour ago, before the traffic
        await conn.execute(update(EndpointRow).values(created_at=now - 3600))
    pairs = _traffic(now)
    late = pairs[len(pairs) // 3]
    await _write(
        db_engine,
        pairs,
        [
            (p, ep)
            for p in pairs
            for ep in ("live", "cand", "ctrl")
            if p is not late or ep == "live"
        ],
    )
    reports = LocalReports(db_engine, VerdictSettings())
    await reports.refresh()
    first = reports.stats["segments_built"]
    seg = ReportSegmentRow.__table__.c
    async with db_engine.connect() as conn:
        rows = await conn.execute(select(seg.candidate, func.count()).group_by(seg.candidate))
        per_candidate = dict(rows.all())
    assert set(per_candidate) == {"cand", "ctrl"} and first == sum(per_candidate.values()) > 8
    await reports.refresh()
    assert reports.stats["segments_built"] == first  # nothing changed, nothing built
    row = _observation(late, "cand")
    assert row is not None
    async with db_engine.begin() as conn:
        await conn.execute(insert(ObservationRow), [row])
    await reports.refresh()
    assert reports.stats["segments_built"] == first + 1  # cand's span of the late copy
    assert reports.stats["refreshes"] == 3 and reports.stats["refresh_failed"] == 0
