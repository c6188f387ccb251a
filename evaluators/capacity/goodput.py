"""One step of a load sweep, for one arm: what its requests measured and the step's statistics.

Definitions follow `vllm bench serve`: goodput = requests that succeeded and met every SLO per
second of the step; output throughput = output tokens of successful requests per second;
TPOT = (E2E - TTFT) / (output tokens - 1), with each arm's engine-reported usage (the replay
asks every arm for it alike). The step's duration runs from its first request to its last
answer. The inter-event latency is each request's mean gap between token-carrying SSE events
(the meter keeps per-request summaries, not every gap), summarised across requests; an event
may carry several tokens, so it is not a per-token figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from evaluators.capacity.slo import Slo

PERCENTILES = (50, 90, 99)


class Sample(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One replayed request as the replay driver measured it."""

    session: int  # index of the conversation within the step
    ok: bool
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    inter_event_mean_s: float | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    error_kind: str | None = None


class StepStats(msgspec.Struct, frozen=True, kw_only=True):
    """The statistics of one (arm, offered load) step."""

    load: int
    duration_s: float
    requests: int
    errors: int
    good: int
    sessions: int
    attainment: float  # share of requests meeting every SLO (errors count as misses)
    goodput: float  # good requests per second
    request_rate: float
    output_tokens_per_s: float
    ttft_s: dict[str, float | None]
    tpot_s: dict[str, float | None]
    # Runs stored before the inter-event name have no such key: empty, not an error.
    inter_event_s: dict[str, float | None] = msgspec.field(default_factory=dict)
    e2e_s: dict[str, float | None]
    prefix_cache_hit_rate: float | None  # from the engine's /metrics, None when not reported
    cached_prompt_share: float | None  # cached / prompt tokens from usage, when reported
    errors_by_kind: dict[str, int]


def _percentiles(values: Sequence[float | None]) -> dict[str, float | None]:
    xs = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    out: dict[str, float | None] = {f"p{p}": None for p in PERCENTILES}
    out["mean"] = None
    if xs.size == 0:
        return out
    out.update({f"p{p}": float(np.percentile(xs, p)) for p in PERCENTILES})
    out["mean"] = float(xs.mean())
    return out


def step_stats(
    samples: Sequence[Sample],
    *,
    load: int,
    duration_s: float,
    slo: Slo,
    prefix_cache_hit_rate: float | None = None,
) -> StepStats:
    duration = max(duration_s, 1e-9)
    ok = [s for s in samples if s.ok]
    good = sum(1 for s in ok if slo.meets(s.ttft_s, s.tpot_s, s.e2e_s))
    errors: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            errors[s.error_kind or "error"] = errors.get(s.error_kind or "error", 0) + 1
    prompt = sum(s.prompt_tokens or 0 for s in ok if s.cached_tokens is not None)
    cached = sum(s.cached_tokens or 0 for s in ok if s.cached_tokens is not None)
    return StepStats(
        load=load,
        duration_s=duration_s,
        requests=len(samples),
        errors=len(samples) - len(ok),
        good=good,
        sessions=len({s.session for s in samples}),
        attainment=good / len(samples) if samples else 0.0,
        goodput=good / duration,
        request_rate=len(ok) / duration,
        output_tokens_per_s=sum(s.output_tokens for s in ok) / duration,
        ttft_s=_percentiles([s.ttft_s for s in ok]),
        tpot_s=_percentiles([s.tpot_s for s in ok if s.output_tokens > 1]),
        inter_event_s=_percentiles([s.inter_event_mean_s for s in ok]),
        e2e_s=_percentiles([s.e2e_s for s in ok]),
        prefix_cache_hit_rate=prefix_cache_hit_rate,
        cached_prompt_share=cached / prompt if prompt else None,
        errors_by_kind=errors,
    )


def session_table(samples: Sequence[Sample], slo: Slo) -> tuple[np.ndarray, np.ndarray]:
    """Per conversation of a step: (requests, good requests), the units a bootstrap resamples."""
    sessions = sorted({s.session for s in samples})
    index = {k: i for i, k in enumerate(sessions)}
    n = np.zeros(len(sessions), dtype=np.int64)
    g = np.zeros(len(sessions), dtype=np.int64)
    for s in samples:
        i = index[s.session]
        n[i] += 1
        if s.ok and slo.meets(s.ttft_s, s.tpot_s, s.e2e_s):
            g[i] += 1
    return n, g
