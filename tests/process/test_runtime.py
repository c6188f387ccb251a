"""The assembled gateway: which live endpoint a restart uses, the admin/metrics wiring, and
the session-arm table's owner."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp

from gateway.config.load import load_config
from gateway.config.sections import GatewayConfig
from gateway.process.runtime import SIMULATOR_KIND, create_arms, running
from gateway.rollout.arms import tick
from gateway.server.app import ROLLOUT_ROUTE
from gateway.sim.server import start_sim


def _config(tmp: Path, **overrides: object) -> GatewayConfig:
    base: dict[str, object] = {
        "server.listen": "127.0.0.1:0",
        "storage.db_url": f"sqlite+aiosqlite:///{tmp / 'canary.db'}",
        "admin.insecure": True,
    }
    return load_config(None, environ={}, overrides={**base, **overrides})


async def test_simulator_placeholder_follows_each_restart(tmp_path: Path) -> None:
    """Zero-setup restarts point the stored simulator live endpoint at the new simulator."""
    async with running(_config(tmp_path)) as first:
        first_url = first.live.endpoint.url
        assert first.live.endpoint.kind == SIMULATOR_KIND
    async with running(_config(tmp_path)) as second:
        assert second.live.endpoint.url != first_url
        async with aiohttp.ClientSession() as http, http.get(second.url + "/v1/models") as resp:
            assert resp.status == 200


async def test_live_flag_replaces_a_simulator_placeholder(tmp_path: Path) -> None:
    """`--live URL` after a zero-setup run proxies to URL, not to the old simulator's port."""
    async with running(_config(tmp_path)):
        pass
    real = await start_sim("fast")
    try:
        async with running(_config(tmp_path, live_url=real.url)) as parts:
            assert parts.live.endpoint.url == real.url
            assert parts.live.endpoint.kind != SIMULATOR_KIND
            async with aiohttp.ClientSession() as http:
                async with http.get(parts.url + "/v1/models") as resp:
                    assert resp.status == 200
                async with http.get(parts.url + "/readyz") as resp:
                    assert resp.status == 200
    finally:
        await real.close()


async def test_stored_real_live_endpoint_wins_over_the_flag(tmp_path: Path) -> None:
    """Once a real live endpoint is stored, a different `--live` only seeds, it never replaces."""
    async with await start_sim("fast") as a, await start_sim("fast") as b:
        async with running(_config(tmp_path, live_url=a.url)):
            pass
        async with running(_config(tmp_path, live_url=b.url)) as parts:
            assert parts.live.endpoint.url == a.url


async def test_admin_and_metrics_are_wired(tmp_path: Path) -> None:
    """The assembled gateway serves the admin API and exports mirror and writer series."""
    async with await start_sim("fast") as cand:
        config = _config(
            tmp_path,
            candidates=[{"name": "c1", "url": cand.url, "sample_rate": 1.0}],
        )
        async with running(config) as parts, aiohttp.ClientSession() as http:
            async with http.get(parts.url + "/admin/candidates/c1") as resp:
                assert resp.status == 200
                assert (await resp.json())["name"] == "c1"
            async with http.get(parts.url + "/metrics") as resp:
                text = await resp.text()
            assert 'candidate="c1"' in text
            assert "canary_writer_" in text


async def test_single_process_creates_its_arm_table_and_removes_it(tmp_path: Path) -> None:
    """Alone, a gateway creates the session-arm table under rollout.arms_dir, routes through
    its router (the one the proxy uses) and removes the file when it stops."""
    arms = tmp_path / "arms"
    arms.mkdir()
    config = _config(tmp_path, **{"rollout.arms_dir": str(arms), "rollout.arms_slots": 4096})
    async with running(config) as parts, aiohttp.ClientSession() as http:
        [table] = arms.iterdir()
        assert parts.router is not None and parts.gateway is not None
        assert parts.gateway.app[ROLLOUT_ROUTE].router is parts.router
        async with http.get(parts.url + "/v1/models", headers={"X-Session-ID": "s"}) as resp:
            assert resp.status == 200
        assert parts.router.counters()["new_sessions"] == 1
    assert not table.exists()


async def test_worker_opens_the_supervisors_table_and_leaves_it(tmp_path: Path) -> None:
    """Given the supervisor's table, a worker maps that file (sessions land in it) and leaves
    it in place when it stops."""
    config = _config(tmp_path, **{"rollout.arms_dir": str(tmp_path), "rollout.arms_slots": 4096})
    with create_arms(config) as table:
        async with (
            running(config, arms_path=table.path) as parts,
            aiohttp.ClientSession() as http,
            http.get(parts.url + "/v1/models", headers={"X-Session-ID": "s"}) as resp,
        ):
            assert resp.status == 200
        assert await asyncio.to_thread(os.path.exists, table.path)
        assert table.live(tick()) == 1
    assert not await asyncio.to_thread(os.path.exists, table.path)
