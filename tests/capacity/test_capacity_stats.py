"""The pure statistics of a capacity run: SLO parsing, goodput as `vllm bench serve` defines
it, the capacity walk with its bootstrap interval, the ratio and the cost at capacity."""

from __future__ import annotations

import math

import pytest

from domain.errors import UsageError
from evaluators.capacity.estimate import ArmInput, StepData, estimate
from evaluators.capacity.goodput import Sample, step_stats
from evaluators.capacity.render import render_html, render_text, to_json
from evaluators.capacity.slo import Slo, parse_slo
from gateway.capacity.scrape import hit_rate, parse_counters


def test_slo_parsing_units_and_errors() -> None:
    """`ttft=0.5s`, `tpot=50ms`, `e2e=10` (seconds) and comma lists parse; a bad key, a bad
    value, a repeated key or nothing at all raise a message naming the input."""
    assert parse_slo(["ttft=0.5s", "tpot=50ms,e2e=10"]) == Slo(ttft_s=0.5, tpot_s=0.05, e2e_s=10.0)
    assert parse_slo(["TTFT:200ms"]).ttft_s == pytest.approx(0.2)
    for bad, match in (
        (["latency=1s"], "'latency=1s'"),
        (["ttft=fast"], "'ttft=fast'"),
        (["ttft=0s"], "positive"),
        (["ttft=1s", "ttft=2s"], "twice"),
        ([], "at least one"),
    ):
        with pytest.raises(UsageError, match=match):
            parse_slo(bad)


def test_goodput_follows_vllm_bench_serve() -> None:
    """A request is good when it succeeded and meets every bound; a one-token answer's TPOT
    counts as 0; goodput and output tokens/s divide by the step's duration; errors are misses."""
    slo = Slo(ttft_s=0.1, tpot_s=0.02)
    samples = [
        Sample(session=0, ok=True, ttft_s=0.05, tpot_s=0.01, e2e_s=0.5, output_tokens=40),
        Sample(session=0, ok=True, ttft_s=0.2, tpot_s=0.01, e2e_s=0.6, output_tokens=40),
        Sample(session=1, ok=True, ttft_s=0.05, tpot_s=0.03, e2e_s=1.3, output_tokens=40),
        Sample(session=1, ok=True, ttft_s=0.05, tpot_s=None, e2e_s=0.05, output_tokens=1),
        Sample(session=2, ok=False, error_kind="http_5xx"),
    ]
    s = step_stats(samples, load=2, duration_s=2.0, slo=slo)
    assert (s.good, s.requests, s.errors, s.sessions) == (2, 5, 1, 3)
    assert s.goodput == 1.0 and s.attainment == pytest.approx(0.4)
    assert s.output_tokens_per_s == pytest.approx(121 / 2.0)
    assert s.errors_by_kind == {"http_5xx": 1}
    assert s.tpot_s["p50"] == pytest.approx(0.01)  # one-token answers have no TPOT


def _steps(good_share: dict[int, float], n_sessions: int = 20) -> list[StepData]:
    """Steps whose conversations (3 turns each) meet a TTFT SLO at the given share."""
    out = []
    for load, share in good_share.items():
        samples = []
        for i in range(n_sessions):
            good = i < round(share * n_sessions)
            for _ in range(3):
                ttft = 0.01 if good else 1.0
                samples.append(
                    Sample(
                        session=i, ok=True, ttft_s=ttft, tpot_s=0.01, e2e_s=0.5, output_tokens=50
                    )
                )
        out.append(StepData(load=load, duration_s=10.0, samples=samples))
    return out


def test_capacity_is_the_last_passing_step_with_an_interval() -> None:
    """Capacity is the goodput at the last passing load before the first failure; a later load
    passing again does not count; the interval covers the point; the ratio and $/1M follow."""
    slo = Slo(ttft_s=0.1)
    cand = _steps({1: 1.0, 2: 1.0, 4: 0.95, 8: 0.5, 16: 1.0})
    ref = _steps({1: 1.0, 2: 0.95, 4: 0.4})
    r = estimate(
        ArmInput(endpoint="c", url="http://c", steps=cand, usd_per_hour=4.0),
        ArmInput(endpoint="r", url="http://r", steps=ref, usd_per_hour=2.0),
        slo,
        attainment=0.9,
        n_boot=400,
    )
    c = r.candidate
    assert (c.capacity_load, c.broke_at) == (4, 8)
    assert c.capacity == pytest.approx(0.95 * 60 / 10.0)
    assert c.capacity_low is not None and c.capacity_high is not None
    assert c.capacity_low <= c.capacity <= c.capacity_high
    assert (r.reference.capacity_load, r.reference.broke_at) == (2, 4)
    assert r.ratio == pytest.approx(1.0)
    assert r.ratio_low is not None and r.ratio_high is not None
    assert r.ratio_low <= 1.0 <= r.ratio_high
    tps = 60 * 50 / 10.0  # every request succeeded: 60 requests of 50 tokens in 10 s
    assert c.output_tokens_per_s == pytest.approx(tps)
    assert c.usd_per_1m_tokens == pytest.approx(4.0 / 3600 / tps * 1e6)
    assert r.notes == []


def test_lower_bound_and_broken_at_first_load_are_said() -> None:
    """An arm that never breaks has a capacity that is a lower bound; one that breaks at the
    first load has none; both say so in the notes and in every rendering."""
    slo = Slo(ttft_s=0.1)
    r = estimate(
        ArmInput(endpoint="c", url="http://c", steps=_steps({1: 1.0, 2: 1.0})),
        ArmInput(endpoint="r", url="http://r", steps=_steps({1: 0.2})),
        slo,
        n_boot=100,
    )
    assert r.candidate.broke_at is None and r.candidate.capacity_load == 2
    assert r.reference.capacity_load is None and r.reference.capacity == 0.0
    assert r.ratio is None
    assert any("lower bound" in n for n in r.notes)
    assert any("lowest load" in n for n in r.notes)
    text = render_text(r)
    assert "≥ " in text and "below the lowest load" in text
    assert '"broke_at": null' in to_json(r)
    html = render_html(r)
    assert html.count("<svg") == 5 and "lower bound" in html


def test_prefix_cache_counters_from_prometheus_text() -> None:
    """vLLM's prefix-cache counters are summed over label sets; the hit rate is the ratio of
    their differences; an engine without them gives None."""
    text = (
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0\n'
        'vllm:prefix_cache_hits_created{engine="0"} 1.7e9\n'
    )
    before = parse_counters(text)
    after = parse_counters(text.replace("1000.0", "3000.0").replace("250.0", "1250.0"))
    assert before == (1000.0, 250.0)
    assert hit_rate(before, after) == pytest.approx(0.5)
    assert parse_counters("canary_requests_total 3\n") is None
    assert hit_rate(None, after) is None and hit_rate(before, before) is None
    assert not math.isnan(after[0] if after else 0.0)
