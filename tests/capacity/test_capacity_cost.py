"""Cost in the verdict: a recent capacity result replaces the mirrored-load cost estimate (and
the report says so); without one, or with an old one, the estimate and its caveat stay."""

from __future__ import annotations

import json
import time

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.capture import CAPACITY_MAX_AGE_S, CapacitySummary
from domain.endpoint import Endpoint
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics.cost import CAVEAT
from evaluators.pairs import synthetic
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.pairs.load import load_capacity
from evaluators.report.build import build_report
from evaluators.report.model import Report
from storage import queries
from storage.capacity.runs import save_capacity

LIVE = Endpoint(name="live", url="http://l", role="live", price_per_hour_usd=2.0)
QUANT = Endpoint(name="int8", url="http://q", kind="quantized", price_per_hour_usd=2.0)


def _values(ratio: tuple[float, float, float], *, age_s: float = 0.0) -> dict[str, object]:
    run = {
        "candidate": {"usd_per_hour": 2.0, "usd_per_1m_tokens": 1.1, "steps": [{"requests": 400}]},
        "reference": {"usd_per_hour": 2.0, "usd_per_1m_tokens": 1.7, "steps": [{"requests": 300}]},
    }
    return {
        "endpoint": "int8",
        "reference": "ctl",
        "created_at": time.time() - age_s,
        "load_unit": "sessions",
        "slo": "ttft<=0.5s",
        "capacity": 8.0,
        "capacity_low": 7.0,
        "capacity_high": 9.0,
        "reference_capacity": 8.0 / ratio[0],
        "reference_low": 4.0,
        "reference_high": 6.0,
        "ratio": ratio[0],
        "ratio_low": ratio[1],
        "ratio_high": ratio[2],
        "usd_per_1m_tokens": 1.1,
        "reference_usd_per_1m_tokens": 1.7,
        "result_json": json.dumps(run),
    }


def _report(capacity: CapacitySummary | None) -> Report:
    pairs = pairset_from_pairs(synthetic.pairs(synthetic.Scenario(), 300, seed=3))
    return build_report(
        pairs,
        candidate=QUANT,
        live=LIVE,
        control=None,
        accounting={},
        settings=VerdictSettings(),
        capacity=capacity,
    )


def test_capacity_result_decides_a_quantized_goal() -> None:
    """With a capacity ratio of 1.6 [1.3, 1.9] at equal prices the cost ratio is 1/1.6 with
    the interval inverted, the goal of a quantized candidate is shown, and the report names the
    run in the metric and in its caveats; an interval crossing 1 does not show it."""
    summary = msgspec.convert({**_values((1.6, 1.3, 1.9)), "id": 7}, CapacitySummary)
    r = _report(summary)
    m = r.metrics["cost"]
    assert m.detail["source"] == "capacity" and m.detail["capacity_run"] == 7
    assert m.reference == "capacity:ctl" and m.n == 400
    assert abs((m.estimate or 0) - 1 / 1.6) < 1e-9
    assert abs((m.ci_low or 0) - 1 / 1.9) < 1e-9 and abs((m.ci_high or 0) - 1 / 1.3) < 1e-9
    assert m.status == "improved"
    assert any("capacity run #7" in c for c in r.caveats) and CAVEAT not in r.caveats
    weak = _report(msgspec.convert({**_values((1.2, 0.9, 1.5)), "id": 8}, CapacitySummary))
    assert weak.metrics["cost"].detail["source"] == "capacity"
    assert weak.metrics["cost"].status != "improved"


def test_without_capacity_the_estimate_and_its_caveat_stay() -> None:
    """No capacity result: the TPOT-based estimate on mirrored pairs, with today's caveat."""
    r = _report(None)
    assert r.metrics["cost"].detail.get("source") != "capacity"
    assert r.metrics["cost"].reference in ("production", "control")
    assert CAVEAT in r.caveats


async def test_the_loader_reads_only_a_recent_result(db_engine: AsyncEngine) -> None:
    """A stored run is what the report loads; one older than CAPACITY_MAX_AGE_S is not, and the
    newest of several wins."""
    await queries.seed(db_engine, Endpoint(name="live", url="http://l", role="live"), [QUANT])
    assert await load_capacity(db_engine, "int8") is None
    await save_capacity(db_engine, _values((1.6, 1.3, 1.9), age_s=CAPACITY_MAX_AGE_S + 60))
    assert await load_capacity(db_engine, "int8") is None
    await save_capacity(db_engine, _values((1.4, 1.2, 1.6), age_s=60))
    newest = await save_capacity(db_engine, _values((1.5, 1.3, 1.7)))
    got = await load_capacity(db_engine, "int8")
    assert got is not None and got.id == newest and got.ratio == 1.5
