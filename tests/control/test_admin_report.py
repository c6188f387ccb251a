"""Reports, the rollout gate and verdict-gated promotion, on real stored pairs: a candidate
that is better (promote), one that fails often (reject) and one without data yet (hold)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import aiohttp
import msgspec

from domain.records import ObservationRecord
from evaluators.pairs import synthetic
from evaluators.pairs.types import ArmObs
from storage import queries
from storage.writer import ObservationWriter
from tests.control.test_admin_harness import LIVE, AdminServer, admin_server, call
from tests.stored_pairs import exchange_record

# The default failure margin needs thousands of pairs to decide; 400 suffice with these.
FAST = {"error_delta": 0.05, "error_critical": 0.2}
GOOD = synthetic.Scenario(control=None, candidate=synthetic.Arm(ttft_ratio=0.7, tpot_ratio=0.8))
# Failing in 60 % of requests: decisive harm even with the ~85 finished sessions as the units.
BAD = synthetic.Scenario(control=None, candidate=synthetic.Arm(error_rate=0.6))
N_PAIRS = 400


def _obs(
    arm: ArmObs | None, exchange_id: str, endpoint: str, kind: Literal["production", "candidate"]
) -> list[ObservationRecord]:
    if arm is None:
        return []
    fields = msgspec.structs.asdict(arm)
    return [ObservationRecord(exchange_id=exchange_id, endpoint=endpoint, arm=kind, **fields)]


async def store_pairs(srv: AdminServer) -> None:
    """Write N_PAIRS exchanges, each observed by production, `good` and `bad`."""
    writer = ObservationWriter(
        srv.engine,
        batch_size=500,
        flush_interval_s=0.01,
        queue_max=10 * N_PAIRS,
        store_text=True,
        store_text_max_chars=4096,
    )
    await writer.start()
    start = time.time() + 1  # after the candidates were created: their reports start there
    good = synthetic.pairs(GOOD, N_PAIRS, seed=1, start=start)
    bad = synthetic.pairs(BAD, N_PAIRS, seed=1, start=start)
    for g, b in zip(good, bad, strict=True):
        writer.put_exchange(exchange_record(g, ("good", "bad")))
        for rec in (
            *_obs(g.production, g.exchange_id, LIVE.name, "production"),
            *_obs(g.candidate, g.exchange_id, "good", "candidate"),
            *_obs(b.candidate, g.exchange_id, "bad", "candidate"),
        ):
            writer.put_observation(rec)
    await writer.close()
    assert writer.stats()["observations_dropped"] == 0


async def setup(srv: AdminServer, http: aiohttp.ClientSession) -> None:
    for name in ("good", "bad"):
        body = {"name": name, "url": f"http://127.0.0.1:9/{name}", "verdict": FAST}
        assert (await call(http, "POST", srv.admin + "/candidates", json=body))[0] == 201
    await store_pairs(srv)
    # registered after the traffic: no pairs in its window yet
    fresh = {"name": "fresh", "url": "http://127.0.0.1:9/fresh", "verdict": FAST}
    assert (await call(http, "POST", srv.admin + "/candidates", json=fresh))[0] == 201


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'admin.db'}"


async def test_report_and_gate(tmp_path: Path) -> None:
    """The report is the evaluators' JSON; the gate answers 200 / 412 / 425 for promote /
    reject / hold with the report as body; unknown names are 404."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await setup(srv, http)
        status, report = await call(http, "GET", srv.admin + "/candidates/good/report")
        assert status == 200
        assert {"candidate", "verdict", "reasons", "pairs", "metrics"} <= set(report)
        assert report["candidate"] == "good" and report["verdict"] == "promote"
        assert report["pairs"]["n"] == N_PAIRS
        for name, expected, verdict in (
            ("good", 200, "promote"),
            ("bad", 412, "reject"),
            ("fresh", 425, "hold"),
        ):
            status, body = await call(http, "GET", f"{srv.admin}/candidates/{name}/gate")
            assert (status, body["verdict"], body["candidate"]) == (expected, verdict, name)
        for path in ("/candidates/ghost/report", "/candidates/ghost/gate"):
            status, body = await call(http, "GET", srv.admin + path)
            assert status == 404 and body["error"]["type"] == "not_found"


async def test_gate_as_a_webhook_and_at_the_final_look(tmp_path: Path) -> None:
    """The gate takes a webhook's POST (its body ignored) and `?final=true` marks the planned
    final look in the report; a malformed `final` is a 422 naming the parameter."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await setup(srv, http)
        webhook = {"name": "podinfo", "namespace": "test", "phase": "Progressing"}
        url = f"{srv.admin}/candidates/good/gate?final=true"
        status, body = await call(http, "POST", url, json=webhook)
        assert (status, body["verdict"]) == (200, "promote")
        assert body["pairs"]["planned_look"] is True
        status, body = await call(http, "GET", f"{srv.admin}/candidates/bad/report")
        assert body["pairs"]["planned_look"] is False
        for bad in ("maybe", "True", "TRUE", ""):  # exactly the documented values, no others
            status, body = await call(http, "GET", f"{srv.admin}/candidates/good/gate?final={bad}")
            assert status == 422 and body["error"]["field"] == "final", bad


async def test_promote_follows_the_verdict(tmp_path: Path) -> None:
    """Without force, reject and hold are refused with 409 naming the verdict and its reasons
    (nothing changes); promote is accepted and its report is kept in the audit row."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await setup(srv, http)
        for name, verdict in (("bad", "reject"), ("fresh", "hold")):
            status, err = await call(
                http, "POST", f"{srv.admin}/candidates/{name}/promote", json={"reason": "try"}
            )
            assert status == 409, err
            assert err["error"]["type"] == "promotion_refused"
            assert err["error"]["detail"]["verdict"] == verdict
            assert err["error"]["detail"]["reasons"]
            assert verdict in err["error"]["message"]
        assert srv.registry.snapshot.live.name == LIVE.name
        assert await queries.list_promotions(srv.engine, 10) == []

        status, res = await call(
            http, "POST", srv.admin + "/candidates/good/promote", json={"reason": "faster"}
        )
        assert status == 200
        assert res["promotion"]["verdict"] == "promote" and res["promotion"]["forced"] is False
        assert srv.registry.snapshot.live.name == "good"
        (row,) = await queries.list_promotions(srv.engine, 10)
        assert row.report_snapshot is not None
        snapshot = msgspec.json.decode(row.report_snapshot)
        assert snapshot["candidate"] == "good" and snapshot["verdict"] == "promote"


async def test_forced_promote_records_the_overridden_verdict(tmp_path: Path) -> None:
    """force=true promotes a rejected candidate; the audit row says forced, with the verdict."""
    async with admin_server(sqlite_url(tmp_path)) as srv, aiohttp.ClientSession() as http:
        await setup(srv, http)
        status, res = await call(
            http, "POST", srv.admin + "/candidates/bad/promote", json={"force": True}
        )
        assert status == 200
        assert res["promotion"]["forced"] is True and res["promotion"]["verdict"] == "reject"
        (row,) = await queries.list_promotions(srv.engine, 10)
        assert row.forced and row.verdict == "reject" and row.report_snapshot
