"""A rollback decided on one replica reaches the other's routing by PostgreSQL's push: two
`canary serve` replicas on one database behind the shipped nginx, the registry poll set to 30 s
so that only LISTEN/NOTIFY can explain a reach within seconds (bench/ramp_fleet.py times it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.process.test_fleet import PG_ONLY
from tests.ramp_fleet import ramp_fleet, trial

pytestmark = pytest.mark.slow

POLL_S = 30.0


@PG_ONLY
async def test_rollback_on_a_reaches_b_routing_before_any_poll(db_url: str, tmp_path: Path) -> None:
    """Three rollouts opened through A, each rolled back by A (two operator aborts, one guard
    trip on five failing candidate requests): B sends fresh candidate-bound sessions to
    production well within the 30 s registry poll, each time."""
    async with ramp_fleet(tmp_path, db_url, poll_s=POLL_S) as fleet:
        reaches = [
            await trial(fleet, n, kind, timeout_s=POLL_S)
            for n, kind in enumerate(("abort", "guard", "abort"))
        ]
    for reach in reaches:
        assert reach.reach_s < POLL_S / 3, reach
