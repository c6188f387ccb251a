"""Each metric evaluator on small hand-built pairs: which pairs it uses, its reference arm,
its estimate, and when it is not applicable."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from domain.endpoint import Endpoint
from evaluators.judge.metric import EvalContext, MetricResult
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics import cost, errors, latency, quality, throughput
from evaluators.metrics.catalog import EVALUATORS, run_all
from evaluators.pairs.columns import pairset_from_pairs
from evaluators.pairs.types import ArmObs, Pair

S = VerdictSettings()
CAND = Endpoint(name="c", url="http://c", kind="bi-kv", price_per_hour_usd=1.0)
LIVE = Endpoint(name="l", url="http://l", role="live", price_per_hour_usd=4.0)


def arm(ttft: float = 0.2, tpot: float = 0.02, tokens: int = 50, **kw: object) -> ArmObs:
    fields: dict[str, object] = {
        "status": 200,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": ttft + tpot * (tokens - 1),
        "output_tokens": tokens,
        "token_counter": "tokenize:control",
        "finish_reason": "stop",
        "output_text": "same text",
        "output_hash": "h",
        "inter_event_p50_s": tpot,
        "inter_event_p99_s": 2 * tpot,
    }
    fields.update(kw)
    return ArmObs(**fields)  # type: ignore[arg-type]


def ctx(pairs: list[Pair], candidate: Endpoint = CAND, planned: bool = False) -> EvalContext:
    return EvalContext(
        pairs=pairset_from_pairs(pairs),
        settings=S,
        candidate=candidate,
        live=LIVE,
        planned_look=planned,
    )


def mk(
    n: int, prod: ArmObs, cand: ArmObs | None, ctrl: ArmObs | None = None, **kw: object
) -> list[Pair]:
    return [
        Pair(
            exchange_id=f"e{i}",
            received_at=float(i),
            production=prod,
            candidate=cand,
            control=ctrl,
            **kw,  # type: ignore[arg-type]
        )
        for i in range(n)
    ]


def one(results: list[MetricResult]) -> MetricResult:
    (res,) = results
    return res


def jitter(base: float, i: int) -> float:
    return base * math.exp(0.05 * math.sin(i))


def test_latency_uses_the_control_and_only_pairs_both_answered() -> None:
    """TTFT is the geometric-mean ratio candidate / control over pairs where both answered;
    production's own latency plays no part when a control exists."""
    pairs = []
    for i in range(100):
        ctrl = arm(ttft=jitter(0.2, i))
        cand = arm(ttft=0.8 * jitter(0.2, i + 1)) if i % 10 else arm(status=500)
        pairs += mk(1, arm(ttft=5.0), cand, ctrl)
    res = one(latency.ttft(ctx(pairs, planned=True)))
    c = np.array([0.8 * jitter(0.2, i + 1) for i in range(100) if i % 10])
    r = np.array([jitter(0.2, i) for i in range(100) if i % 10])
    assert res.n == 90 and res.reference == "control"
    expected = math.exp(np.mean(np.log(c / r)))
    assert res.estimate is not None and math.isclose(res.estimate, expected, rel_tol=1e-6)
    assert res.ci_low is not None and res.ci_high is not None
    assert res.ci_low < res.estimate < res.ci_high
    assert 0.7 < float(res.detail["hl_ratio"]) < 0.9  # type: ignore[arg-type]


def test_latency_without_control_uses_production() -> None:
    """Without a control, production is the latency reference (the report's caveats say the
    loads differ)."""
    pairs = [mk(1, arm(ttft=jitter(0.2, i)), arm(ttft=jitter(0.2, i + 3)))[0] for i in range(60)]
    res = one(latency.ttft(ctx(pairs)))
    assert res.reference == "production" and res.n == 60


def test_later_turns_is_the_goal_of_bi_kv_only() -> None:
    """TTFT on turns >= 2 is a goal for bi-kv and a diagnostic otherwise; turn 1 is excluded."""
    first = mk(40, arm(), arm(ttft=0.2), turn_index=0)
    later = [
        mk(1, arm(ttft=jitter(0.2, i)), arm(ttft=jitter(0.1, i + 1)), turn_index=2)[0]
        for i in range(40)
    ]
    res = one(latency.ttft_later_turns(ctx(first + later)))
    assert res.role == "goal" and res.n == 40 and res.goal == 1.0
    assert res.estimate is not None and res.estimate < 0.6
    other = Endpoint(name="q", url="http://q", kind="quantized")
    assert one(latency.ttft_later_turns(ctx(first + later, other))).role == "diagnostic"
    table = latency.ttft_by_turn(ctx(first + later))
    assert [row["n"] for row in table] == [40, 0, 40, 0, 0]


def test_slo_exceedance_counts_each_arm() -> None:
    """SLO metrics report each arm's exceedance rate and judge their paired difference."""
    pairs = mk(50, arm(), arm(ttft=3.0)) + mk(50, arm(), arm(ttft=0.1))
    ttft_slo, e2e_slo = latency.slo_exceedance(ctx(pairs))
    assert ttft_slo.detail["rate_candidate"] == 0.5 and ttft_slo.detail["rate_reference"] == 0.0
    assert ttft_slo.estimate == 0.5 and e2e_slo.estimate == 0.0


def test_tail_quantiles_only_at_planned_looks() -> None:
    """p95/p99 ratios are bootstrapped at planned looks only, and p99 needs > 396 pairs."""
    pairs = [mk(1, arm(ttft=jitter(0.2, i)), arm(ttft=jitter(0.3, i + 1)))[0] for i in range(200)]
    unplanned = {r.name: r for r in latency.tail_quantiles(ctx(pairs))}
    assert unplanned["ttft_p95"].status == "n/a"
    planned = {r.name: r for r in latency.tail_quantiles(ctx(pairs, planned=True))}
    assert planned["ttft_p95"].status == "info"
    assert planned["ttft_p95"].estimate is not None and planned["ttft_p95"].estimate > 1.2
    assert planned["ttft_p99"].status == "insufficient" and "396" in planned["ttft_p99"].reason


def test_failures_leave_out_cancelled_pairs() -> None:
    """Failure asymmetry counts both arms' failures; gateway-cancelled pairs are left out."""
    pairs = (
        mk(80, arm(), arm())
        + mk(15, arm(), arm(status=0, error_kind="timeout"))
        + mk(5, arm(), arm(status=0, error_kind="cancelled"))
    )
    res = one(errors.failures(ctx(pairs)))
    assert res.n == 95 and res.detail["candidate_timeout"] == 15
    assert res.estimate is not None and math.isclose(res.estimate, 15 / 95)
    assert res.detail["discordant_worse"] == 15
    assert one(errors.timeouts(ctx(pairs))).detail["rate_candidate"] == 15 / 95


def test_lost_pairs_rate() -> None:
    """Pairs lost is the share of exchanges without a candidate observation."""
    res = one(errors.lost(ctx(mk(90, arm(), arm()) + mk(10, arm(), None))))
    assert res.estimate == 0.1 and res.n == 100 and res.detail["lost"] == 10


def test_exact_match_against_the_noise_floor() -> None:
    """At temperature 0 the candidate's disagreement rate minus the control's is judged; other
    temperatures are not used; without a control the floor is 0 and a note says so."""
    diff = arm(output_hash="x", output_text="other text")
    pairs = (
        mk(30, arm(), diff, arm(), temperature=0.0)
        + mk(10, arm(), arm(), diff, temperature=0.0)
        + mk(60, arm(), arm(), arm(), temperature=0.0)
        + mk(50, arm(), diff, arm(), temperature=0.7)
    )
    res = one(quality.exact_match(ctx(pairs)))
    assert res.n == 100 and res.reference == "control"
    assert res.estimate is not None and math.isclose(res.estimate, 0.30 - 0.10)
    solo = [msgspec.structs.replace(p, control=None) for p in pairs]
    res0 = one(quality.exact_match(ctx(solo)))
    assert res0.estimate is not None and math.isclose(res0.estimate, 0.30)
    assert quality.NO_CONTROL in res0.notes


def test_json_validity_only_where_json_was_asked() -> None:
    """Invalid JSON is counted only for requests that asked for JSON, per arm."""
    good, bad = (
        arm(output_text='{"a": 1}', output_hash="j"),
        arm(output_text='{"a":', output_hash="k"),
    )
    pairs = mk(20, good, bad, json_requested=True) + mk(80, good, good, json_requested=True)
    pairs += mk(50, arm(), bad)
    res = one(quality.json_validity(ctx(pairs)))
    assert res.n == 100 and res.estimate is not None and math.isclose(res.estimate, 0.2)
    assert one(quality.json_validity(ctx(mk(10, arm(), arm())))).status == "n/a"


def test_finish_reason_and_tool_calls() -> None:
    """Finish reasons and tool calls that differ from production's are counted."""
    calls = '[{"name": "f", "arguments": "{}"}]'
    pairs = mk(
        25,
        arm(tool_calls=calls),
        arm(finish_reason="length", tool_calls=None),
        tools_requested=True,
    )
    pairs += mk(75, arm(tool_calls=calls), arm(tool_calls=calls), tools_requested=True)
    assert one(quality.finish_reason(ctx(pairs))).estimate == 0.25
    assert one(quality.tool_calls(ctx(pairs))).estimate == 0.25


def test_output_length_is_two_sided() -> None:
    """Output length is a two-sided ratio: 30 % shorter is harm beyond the margin too."""
    pairs = [mk(1, arm(tokens=100), arm(tokens=70 + (i % 3)))[0] for i in range(300)]
    res = one(quality.output_length(ctx(pairs)))
    assert res.harm == "both" and res.estimate is not None and 0.69 < res.estimate < 0.73
    assert res.p_beyond is not None and res.p_beyond < 1e-6


def test_token_metrics_use_only_pairs_counted_one_way() -> None:
    """Output length and TPOT compare two arms only where one tokenizer counted both: a pair
    whose arms were counted differently (or not at all) is left out, whatever its numbers."""
    same = [mk(1, arm(tokens=100), arm(tokens=100 + (i % 3)))[0] for i in range(300)]
    # Counted by another method on the candidate's side: 40 % shorter, yet not comparable.
    other = mk(20, arm(tokens=100), arm(tokens=60, tpot=0.5, token_counter="tokenize:other"))
    res = one(quality.output_length(ctx(same + other)))
    assert res.n == 300 and res.estimate is not None and 1.0 <= res.estimate < 1.02
    assert res.status != "ungated" and res.detail["pairs_counted"] == 300
    tp = one(latency.tpot(ctx(same + other)))
    assert tp.n == 300 and tp.detail["pairs_answered"] == 320


def test_token_metrics_with_too_few_counted_pairs_do_not_gate() -> None:
    """When most answered pairs have no count (texts cut, not stored), the token metrics are
    reported but do not gate, and say why; a selection by countability is not random."""
    counted = [mk(1, arm(tokens=100), arm(tokens=100 + (i % 3)))[0] for i in range(100)]
    cut = mk(200, arm(output_tokens=None, token_counter=None), arm(tokens=40))
    for evaluate in (quality.output_length, latency.tpot):
        res = one(evaluate(ctx(counted + cut)))
        assert res.status == "ungated" and "counted one way in 100 of 300" in res.ungated
        assert not res.ungated_blocks


def test_cost_is_price_times_tpot_ratio() -> None:
    """Cost per token = (candidate $/h ÷ live $/h) × (candidate TPOT ÷ reference TPOT)."""
    pairs = [mk(1, arm(tpot=jitter(0.02, i)), arm(tpot=jitter(0.01, i)))[0] for i in range(100)]
    q = Endpoint(name="q", url="http://q", kind="quantized", price_per_hour_usd=2.0, gpus=2)
    res = one(cost.cost(ctx(pairs, q)))
    assert res.role == "goal" and res.estimate is not None
    assert math.isclose(res.estimate, (4.0 / 4.0) * 0.5, rel_tol=1e-6)
    unpriced = Endpoint(name="u", url="http://u")
    assert one(cost.cost(ctx(pairs, unpriced))).status == "n/a"


def test_decode_speed_and_load() -> None:
    """Decode speed is 1/TPOT; the load table has one row per arm with its CDF percentiles."""
    pairs = [mk(1, arm(tpot=0.02), arm(tpot=jitter(0.01, i)), arm(tpot=0.02))[0] for i in range(50)]
    res = one(throughput.decode_speed(ctx(pairs)))
    assert res.estimate is not None and 1.9 < res.estimate < 2.1
    load = throughput.arms_load(ctx(pairs).pairs)
    assert set(load) == {"production", "candidate", "control"}
    assert load["candidate"]["requests"] == 50
    assert isinstance(load["candidate"]["ttft_cdf"], list)


@pytest.mark.parametrize("with_control", [True, False])
def test_registry_runs_every_evaluator(with_control: bool) -> None:
    """Every registered evaluator returns results; metric names are unique."""
    pairs = mk(40, arm(), arm(), arm() if with_control else None, temperature=0.0)
    results = run_all(ctx(pairs))
    names = [r.name for r in results]
    assert len(names) == len(set(names)) >= len(EVALUATORS)
