"""The engine's prefix-cache counters from its Prometheus `/metrics` (vLLM:
`vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total`, in tokens), so a step's
hit rate is the difference of two scrapes. An engine that does not report them gives None."""

from __future__ import annotations

import asyncio

import aiohttp

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"


def parse_counters(text: str) -> tuple[float, float] | None:
    """(queries, hits) summed over label sets, or None when the engine has no such counters."""
    totals = {QUERIES: 0.0, HITS: 0.0}
    seen = False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        if name in totals:
            value = rest.rsplit(" ", 1)[-1] if "{" in line else rest
            try:
                totals[name] += float(value)
                seen = True
            except ValueError:
                continue
    return (totals[QUERIES], totals[HITS]) if seen else None


async def scrape(http: aiohttp.ClientSession, url: str) -> tuple[float, float] | None:
    """The counters of the engine at `url`, or None (no /metrics, no counters, no answer)."""
    try:
        async with asyncio.timeout(5.0), http.get(url + "/metrics") as resp:
            if resp.status != 200:
                return None
            return parse_counters(await resp.text())
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None


def hit_rate(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    if before is None or after is None:
        return None
    queries = after[0] - before[0]
    return (after[1] - before[1]) / queries if queries > 0 else None
