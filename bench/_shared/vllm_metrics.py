"""An engine's Prometheus `/metrics` read as numbers: what a benchmark and a test compare before
and after traffic (requests, tokens, prefix-cache hits). Plain HTTP and the standard library;
it must never start or stop an engine (tests/real_engine/engines.py does).
"""

from __future__ import annotations

import re
import time
import urllib.request

_SAMPLE = re.compile(r"^(vllm:[a-zA-Z0-9_:]+)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN|\+Inf)$")


def scrape(url: str) -> dict[str, float]:
    """The engine's `/metrics` samples named `vllm:*`, each summed over its labels
    (histograms keep `_sum`, `_count` and `_bucket|le=X`)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name.endswith("_bucket"):
            le = re.search(r'le="([^"]+)"', labels)
            name = f"{name}|le={le.group(1) if le else ''}"
        out[name] = out.get(name, 0.0) + value
    return out


def settled_scrape(
    url: str,
    key: str = "vllm:request_success_total",
    *,
    reach: float | None = None,
    quiet_s: float = 2.0,
    within_s: float = 30.0,
) -> dict[str, float]:
    """`scrape` once `key` has reached `reach`, or has stopped moving for `quiet_s`: the engine
    counts a request a little after its last byte was sent, so a scrape right after the streams
    end can miss the last few."""
    deadline = time.monotonic() + within_s
    last = scrape(url)
    while time.monotonic() < deadline:
        if reach is not None and last.get(key, 0.0) >= reach:
            return last
        time.sleep(quiet_s)
        now = scrape(url)
        if reach is None and now.get(key) == last.get(key):
            return now
        last = now
    return last


def delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    """How much `key` moved between two scrapes (0 where a scrape lacks it)."""
    return after.get(key, 0.0) - before.get(key, 0.0)
