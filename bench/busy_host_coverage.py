"""Coverage on a busy host: the share of sampled copies observed at a light, steady rate.

The gateway (`running()`: a worker plus the host's mirror process at its default priority) in
front of a simulated live engine, one simulated candidate at 100 % in session mode, and an
open loop of multi-turn conversations (`X-Session-ID`) at `--rate` requests/s for `--seconds`.
Run it on a host that is busy with other work: that is the point. Prints the accounting and
the observed share (target: >= 98 % at 3 req/s).

Usage: `python bench/busy_host_coverage.py [--rate 3] [--seconds 60] [--priority idle]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def run(rate: float, seconds: float, priority: str) -> None:
    from gateway.config.load import load_config
    from gateway.process.runtime import running
    from gateway.sim.server import start_sim

    with tempfile.TemporaryDirectory() as tmp:
        async with await start_sim("baseline") as live, await start_sim("bi-kv") as cand:
            cfg = load_config(
                None,
                environ={},
                overrides={
                    "listen": "127.0.0.1:0",
                    "live_url": live.url,
                    "db_url": f"sqlite+aiosqlite:///{tmp}/cov.db",
                    "mirror_priority": priority,
                    "candidates": [
                        {"name": "c", "url": cand.url, "sample_rate": 1.0, "sampling": "session"}
                    ],
                },
            )
            async with running(cfg) as parts, aiohttp.ClientSession() as http:

                async def turn(i: int) -> None:
                    session, t = divmod(i, 6)
                    messages: list[dict[str, str]] = []
                    for k in range(t + 1):
                        if k:
                            messages.append({"role": "assistant", "content": f"a{k}"})
                        messages.append({"role": "user", "content": f"s{session} turn {k}"})
                    body = {"model": "sim-model", "messages": messages, "max_tokens": 16}
                    hdrs = {"X-Session-ID": f"s{session}"}
                    async with http.post(
                        parts.url + "/v1/chat/completions", json=body, headers=hdrs
                    ) as resp:
                        await resp.read()

                loop = asyncio.get_running_loop()
                start = loop.time()
                async with asyncio.TaskGroup() as tg:
                    for i in range(int(rate * seconds)):
                        await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
                        tg.create_task(turn(i))
                await parts.mirror.wait_idle()
                stats = await parts.mirror.wait_stats()
                assert stats is not None
                c = parts.mirror.host_counters()["c"]
    observed = c["observed_ok"] + c["observed_error"]
    print(f"accounting: {c}")
    print(f"mirror process priority: {stats.priority}")
    print(
        f"observed {observed} of {c['sampled']} sampled = "
        f"{100 * observed / max(c['sampled'], 1):.1f} % (shed {c['shed_overload']})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=3.0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--priority", default="idle")
    args = p.parse_args()
    print("load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
    asyncio.run(run(args.rate, args.seconds, args.priority))
    print("load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
