"""A fleet: two `canary serve` replicas on one PostgreSQL behind a real nginx running the shipped
deploy/nginx/nginx.conf, simulated engines (`canary sim`) as live, control and bi-kv candidate.

Keyed on X-Session-ID (`hash ... consistent`), no session is split, both replicas serve, and
bi-kv's later-turn TTFT effect is measured. Behind nginx's round-robin, sessions are split: the
report counts them with their share of pairs and leaves them out of the by-turn analysis, and
each replica's /metrics counts the split sessions it took part in."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy import func, select

from bench._shared.fleet import TOKEN as TOKEN
from bench._shared.fleet import child_env as _env
from bench._shared.fleet import cli as _cli
from bench._shared.fleet import processes as _processes
from bench._shared.fleet import replicas as _replicas
from bench._shared.nginx import nginx_front as _nginx
from evaluators.judge.settings import VerdictSettings
from evaluators.report.build import evaluate
from evaluators.report.model import Report
from gateway.sim.workload import WorkloadSpec, run_workload
from storage.engine import make_engine
from storage.models import ExchangeRow
from tests.deploy.test_balancers import nginx_binary
from tests.upstreams import free_port

pytestmark = pytest.mark.slow

TIME_SCALE = 0.5
SPLIT_METRIC = "canary_mirror_split_sessions_total"
PG_ONLY = pytest.mark.parametrize(
    "db_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)


@asynccontextmanager
async def _sims(*profiles: str) -> AsyncIterator[list[str]]:
    """`canary sim` engines of these profiles, by URL."""
    ports = [free_port() for _ in profiles]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    children = [
        (
            _cli("sim", "--profile", profile, "--port", str(port), "--time-scale", str(TIME_SCALE)),
            url + "/health",
            _env(),
        )
        for profile, port, url in zip(profiles, ports, urls, strict=True)
    ]
    async with _processes(*children):
        yield urls


def _config(tmp: Path, live: str, bikv: str, control: str) -> Path:
    """Both replicas read one file, as a fleet does (deploy/k8s mounts one ConfigMap)."""
    conf = tmp / "gateway.toml"
    conf.write_text(
        f"""
live_url = "{live}"
registry_poll_interval_s = 0.5
counters_flush_interval_s = 0.5
# The engines, nginx and the client share two cores with the replicas: this test is about
# sessions and verdicts, not the mirror's priority or overload guard.
mirror_priority = "normal"
mirror_shed_loop_lag_ms = 500.0
mirror_shed_cpu_busy = 0.0

[verdict]
session_idle_s = 1.0

[[candidates]]
name = "bi-kv"
url = "{bikv}"
kind = "bi-kv"
sample_rate = 1.0
sampling = "session"
concurrency = 8

[[candidates]]
name = "control"
url = "{control}"
kind = "control"
sample_rate = 1.0
sampling = "session"
concurrency = 8
"""
    )
    return conf


async def _split_counters(replicas: list[str]) -> dict[str, int]:
    """Each replica's split-session counter, by its replica label."""
    out: dict[str, int] = {}
    async with aiohttp.ClientSession() as http:
        for url in replicas:
            async with http.get(url + "/metrics") as resp:
                text = await resp.text()
            for label, value in re.findall(
                rf'^{SPLIT_METRIC}{{replica="([^"]+)"}} (\d+)', text, re.M
            ):
                out[label] = int(value)
    return out


async def _run_fleet(
    db_url: str, tmp: Path, *, affinity: bool, spec: WorkloadSpec
) -> tuple[Report, dict[str, int], dict[str, int], int]:
    """The workload through nginx over two replicas; returns bi-kv's report (final look), the
    exchanges each replica stored, the replicas' split-session counters and the number of
    sessions whose exchanges the store holds from more than one host (counted here, apart from
    the product's own query)."""
    nginx_binary()  # skips (or fails, under CANARY_REQUIRE_NGINX=1) before anything starts
    async with _sims("baseline", "bi-kv", "control") as (live, bikv, control):
        conf = _config(tmp, live, bikv, control)
        async with (
            _replicas(conf, db_url, "replica-a", "replica-b") as (a, b),
            _nginx(tmp, [a, b], affinity=affinity) as front,
        ):
            summary = await run_workload(front, spec)
            assert (summary.requests, summary.errors) == (spec.sessions * spec.turns, 0)
            counters = await _settled_counters([a, b], expect_splits=not affinity)
        # Both replicas stopped: every copy drained and written.
    engine = make_engine(db_url)
    try:
        e = ExchangeRow.__table__
        async with engine.connect() as conn:
            rows = await conn.execute(select(e.c.replica, func.count()).group_by(e.c.replica))
            per_replica = {str(r): int(n) for r, n in rows}
            hosts: dict[str, set[str]] = {}
            for key, replica in await conn.execute(select(e.c.session_key, e.c.replica)):
                hosts.setdefault(str(key), set()).add(_host(str(replica)))
        settings = VerdictSettings().with_overrides({"session_idle_s": 1.0})
        report = await evaluate(engine, "bi-kv", settings=settings, planned_look=True)
    finally:
        await engine.dispose()
    split_truth = sum(1 for seen in hosts.values() if len(seen) > 1)
    return report, per_replica, counters, split_truth


async def _settled_counters(replicas: list[str], *, expect_splits: bool) -> dict[str, int]:
    """The counters once the replicas have checked the store after the last turn: a few check
    intervals with no change (and, when splits are expected, some counted)."""
    last: dict[str, int] | None = None
    stable = 0
    for _ in range(300):  # up to 30 s
        await asyncio.sleep(0.1)
        now = await _split_counters(replicas)
        stable = stable + 1 if now == last else 0
        last = now
        if stable >= 20 and len(now) == len(replicas) and (sum(now.values()) or not expect_splits):
            return now
    raise AssertionError(f"split counters never settled: {last}")


def _host(replica: str) -> str:
    return replica.split("-mirror-")[0]


@PG_ONLY
async def test_sessions_keyed_by_header_are_never_split(db_url: str, tmp_path: Path) -> None:
    """nginx `hash $http_x_session_id consistent` over two replicas: both serve, no session is
    split (report and counters say 0), and bi-kv's later-turn TTFT is measured lower."""
    from storage.engine import upgrade

    await upgrade(db_url)
    spec = WorkloadSpec(
        sessions=24, turns=4, concurrency=8, seed=21, max_tokens=16, system_prompt_words=2500
    )
    report, per_replica, counters, truth = await _run_fleet(
        db_url, tmp_path, affinity=True, spec=spec
    )
    assert truth == 0
    assert {_host(r) for r in per_replica} == {"replica-a", "replica-b"}, per_replica
    assert min(per_replica.values()) >= spec.turns * 4  # the hash spread sessions over both
    assert report.pairs.sessions == spec.sessions
    assert report.pairs.split_sessions == 0 and report.pairs.split_pairs == 0
    assert set(counters.values()) == {0}, counters
    goal = report.metrics["ttft_later_turns"]
    assert goal.n == report.pairs.later_turns and not goal.notes  # every later turn, none left out
    assert goal.estimate is not None and goal.estimate < 1.0, goal
    assert goal.ci_high is not None and goal.ci_high < 1.0, goal
    later = [row for row in report.ttft_by_turn if row["turn"] != "1" and row["n"]]
    assert all(float(row["cached_fraction_candidate"] or 0) > 0.5 for row in later), later
    turns = {row["turn"]: row for row in report.ttft_by_turn}
    assert sum(int(row["n"] or 0) for row in turns.values()) == report.pairs.used_latency


@PG_ONLY
async def test_round_robin_splits_are_reported_and_excluded(db_url: str, tmp_path: Path) -> None:
    """nginx round-robin over two replicas: sessions are split; the report counts them with
    their share of pairs, leaves them out of TTFT by turn and the turn metrics (saying why),
    and the replicas' counters count them."""
    from storage.engine import upgrade

    await upgrade(db_url)
    # An odd number of sessions in flight: with an even one, round-robin can hand each session
    # the same replica turn after turn (session i gets requests i, i+4, i+8, ...), splitting few.
    spec = WorkloadSpec(sessions=16, turns=3, concurrency=3, seed=22, max_tokens=16)
    report, per_replica, counters, truth = await _run_fleet(
        db_url, tmp_path, affinity=False, spec=spec
    )
    assert {_host(r) for r in per_replica} == {"replica-a", "replica-b"}, per_replica
    pairs = report.pairs
    assert truth > 0, "round-robin split no session"
    assert pairs.split_sessions == truth, (pairs, truth)
    assert 0 < pairs.split_pairs <= pairs.n
    assert pairs.split_share == pytest.approx(pairs.split_pairs / pairs.n)
    by_turn = sum(int(row["n"] or 0) for row in report.ttft_by_turn)
    assert by_turn <= pairs.used_latency - pairs.split_pairs
    later = report.metrics["ttft_later_turns"]
    assert (later.units or 0) <= spec.sessions - pairs.split_sessions
    assert later.notes and "pairs of split sessions left out" in later.notes[0], later.notes
    assert any("more than one gateway replica" in c for c in report.caveats), report.caveats
    assert sum(counters.values()) >= pairs.split_sessions, counters
    assert all(counters[r] > 0 for r in counters), counters
