"""A rollback decided on one replica reaches the other's routing by PostgreSQL's push: two
`canary serve` replicas on one database behind the shipped nginx, the registry poll set to 30 s
so that only LISTEN/NOTIFY can explain a reach within seconds (bench/rollout_fleet.py times it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._shared.rollout_fleet import rollout_fleet, trial
from tests.deploy.test_balancers import nginx_binary
from tests.process.test_fleet import PG_ONLY

pytestmark = pytest.mark.slow

POLL_S = 30.0


@PG_ONLY
async def test_rollback_on_a_reaches_b_routing_before_any_poll(db_url: str, tmp_path: Path) -> None:
    """Three rollouts opened through A, each rolled back by A (two operator aborts, one guard
    trip on five failing candidate requests): B sends fresh candidate-bound sessions to
    production well within the 30 s registry poll, each time."""
    nginx_binary()  # skips (or fails, under CANARY_REQUIRE_NGINX=1) before anything starts
    async with rollout_fleet(tmp_path, db_url, poll_s=POLL_S) as fleet:
        reaches = [
            await trial(fleet, n, kind, timeout_s=POLL_S)
            for n, kind in enumerate(("abort", "guard", "abort"))
        ]
    for reach in reaches:
        assert reach.reach_s < POLL_S / 3, reach
