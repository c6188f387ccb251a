"""The Prometheus registry (gateway/server/prometheus.py), /metrics, /healthz and /readyz."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from gateway.server.prometheus import Exporter
from gateway.sim.server import start_sim
from tests.upstreams import free_port


def test_counter_gauge_and_labels_render() -> None:
    """Counters and gauges render HELP, TYPE and one line per label set, escaped."""
    reg = Exporter()
    c = reg.counter("reqs_total", "Requests.", ("route", "status"))
    c.labels("/a", "200").inc()
    c.labels("/a", "200").inc(2)
    c.labels('we"ird\\', "500").inc()
    g = reg.gauge("in_flight", "Now.")
    g.inc()
    g.inc()
    g.dec()
    text = reg.render()
    assert "# HELP reqs_total Requests.\n# TYPE reqs_total counter\n" in text
    assert 'reqs_total{route="/a",status="200"} 3\n' in text
    assert 'reqs_total{route="we\\"ird\\\\",status="500"} 1\n' in text
    assert "# TYPE in_flight gauge\nin_flight 1\n" in text
    assert text.endswith("\n")


def test_histogram_buckets_are_cumulative_and_inclusive() -> None:
    """Histogram buckets count values <= their bound, cumulated, with sum and count."""
    reg = Exporter()
    h = reg.histogram("lat_seconds", "Latency.", ("route",), buckets=(0.1, 1.0))
    s = h.labels("/x")
    for v in (0.05, 0.1, 0.5, 2.0):
        s.observe(v)
    text = reg.render()
    assert 'lat_seconds_bucket{route="/x",le="0.1"} 2' in text
    assert 'lat_seconds_bucket{route="/x",le="1"} 3' in text
    assert 'lat_seconds_bucket{route="/x",le="+Inf"} 4' in text
    assert 'lat_seconds_sum{route="/x"} 2.65' in text
    assert 'lat_seconds_count{route="/x"} 4' in text


def test_labels_are_cached_and_checked() -> None:
    """labels() returns the same series object each time and refuses a wrong label count."""
    reg = Exporter()
    c = reg.counter("x_total", "X.", ("a",))
    assert c.labels("1") is c.labels("1")
    with pytest.raises(ValueError, match="takes labels"):
        c.labels("1", "2")
    with pytest.raises(ValueError, match="already registered"):
        reg.counter("x_total", "again")


def test_collectors_add_lines_and_a_broken_one_is_contained() -> None:
    """Collector lines are appended; a collector that raises leaves a comment, not a failure."""
    reg = Exporter()
    reg.add_collector(lambda: ["# TYPE mirror_sent_total counter", "mirror_sent_total 7"])

    def broken() -> list[str]:
        raise RuntimeError("boom")

    reg.add_collector(broken)
    text = reg.render()
    assert "mirror_sent_total 7\n" in text
    assert "# collector broken failed" in text


async def test_gateway_endpoints_are_not_forwarded(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """/healthz, /readyz and /metrics are answered by the gateway; /metrics counts by route."""
    async with await start_sim("fast") as sim:
        gw = await gateway(sim.url)
        async with http.get(gw.url + "/healthz") as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "ok"
        async with http.get(gw.url + "/readyz") as resp:
            assert resp.status == 200 and (await resp.json())["checks"]["live"]["ok"]
        async with http.get(gw.url + "/v1/models") as resp:
            await resp.read()
        async with http.get(gw.url + "/metrics") as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await resp.text()
        async with http.get(sim.url + "/sim/stats") as resp:
            assert (await resp.json())["requests"] == 2  # /health (readyz) and /v1/models
    assert 'canary_proxy_requests_total{route="/v1/models",status="200"} 1' in text
    assert 'canary_proxy_e2e_seconds_count{route="/v1/models"} 1' in text
    assert 'canary_proxy_ttft_seconds_count{route="/v1/models"} 1' in text
    assert "canary_proxy_in_flight_requests 0" in text


async def test_readyz_fails_when_live_is_down(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """/readyz answers 503 naming the live check when the live endpoint is unreachable."""
    gw = await gateway(f"http://127.0.0.1:{free_port()}")
    async with http.get(gw.url + "/readyz") as resp:
        assert resp.status == 503
        body = await resp.json()
    assert body["checks"]["live"]["ok"] is False


async def test_a_fresh_gateway_exports_every_closed_label_set_at_zero(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """Before any request, /metrics has an upstream-error series at 0 for every declared kind
    (each live-exchange error kind, each timeout phase, the client's) and every body-refusal
    reason at 0, so dashboards and rate() alerts have a series from start."""
    from domain.outcomes import ErrorKind
    from gateway.server import upstream
    from gateway.server.proxy import UPSTREAM_ERROR_LABELS

    raised = {cls.kind for cls in (upstream.UpstreamConnectError, upstream.UpstreamResetError)}
    assert raised | {ErrorKind.CLIENT_DISCONNECT} <= set(UPSTREAM_ERROR_LABELS)
    assert {"timeout_ttfb", "timeout_idle", "timeout_total"} <= set(UPSTREAM_ERROR_LABELS)
    gw = await gateway(f"http://127.0.0.1:{free_port()}")
    async with http.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    for kind in UPSTREAM_ERROR_LABELS:
        assert f'canary_proxy_upstream_errors_total{{kind="{kind}"}} 0\n' in text, kind
    for reason in ("budget", "timeout"):
        assert f'canary_proxy_body_refused_total{{reason="{reason}"}} 0\n' in text, reason
