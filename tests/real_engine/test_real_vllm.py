"""End to end on real vLLM (CPU build): the gateway forwards production untouched, mirrors what
it sampled, measures what the client got, and the verdicts are the ones the engines deserve."""

from __future__ import annotations

import re
from typing import Any

import pytest

from domain.timing import tpot_state
from tests.real_engine import engines as eng
from tests.real_engine.conftest import KINDS, SESSIONS, RealRun

# The run (engine start, a few hundred conversations, the drain, four reports) happens in the
# setup of the first test here: minutes on two shared cores, not the suite's 120 s per test.
pytestmark = pytest.mark.timeout(1800)

QUALITY = {"exact_match", "similarity", "finish_reason", "output_length"}


def _reasons(report: dict[str, Any]) -> str:
    return "\n".join(f"{r['metric']}: {r['status']}: {r['reason']}" for r in report["reasons"])


def test_every_turn_through_the_gateway_answered(real_run: RealRun) -> None:
    """Every streamed turn of every conversation got a complete answer through the gateway."""
    failed = [(t.session, t.turn, t.error) for t in real_run.turns if t.error]
    assert not failed, failed[:5]
    assert all(t.finish_reason in ("stop", "length") for t in real_run.turns)
    assert len({t.session for t in real_run.turns}) == SESSIONS


def test_production_answers_identical_to_the_live_engine_direct(real_run: RealRun) -> None:
    """Each answer through the gateway is word for word what the live engine says directly."""
    differ = [
        (g.session, g.turn)
        for g, d in zip(real_run.turns, real_run.direct, strict=True)
        if (g.text, g.finish_reason, g.completion_tokens)
        != (d.text, d.finish_reason, d.completion_tokens)
        or d.error
    ]
    assert not differ, f"{len(differ)} of {len(real_run.turns)} differ, e.g. {differ[:5]}"


def test_sdk_closing_after_done_is_never_a_production_failure(real_run: RealRun) -> None:
    """No production answer the SDK read to its end is stored as a failure of any kind."""
    rows = real_run.rows(
        "SELECT error_kind, COUNT(*) AS n FROM observations WHERE arm = 'production' "
        "GROUP BY error_kind"
    )
    kinds = {r["error_kind"]: r["n"] for r in rows}
    (exchanges,) = real_run.rows("SELECT COUNT(*) AS n FROM exchanges")
    assert exchanges["n"] > 0
    assert kinds == {None: exchanges["n"]}, kinds
    cut = re.search(
        r'upstream_errors_total\{kind="client_disconnect"\} (\S+)', real_run.gateway_metrics
    )
    assert cut is None or float(cut.group(1)) == 0, cut


def test_engine_counts_agree_with_the_gateway(real_run: RealRun) -> None:
    """Each engine finished exactly the requests the gateway saw it answer, the engine-reported
    output tokens the gateway kept (`usage_tokens`, information) agree with the engine's own
    counter, and the cached prompt tokens the gateway metered match its prefix-cache hits."""
    turns = real_run.turns
    live_before, live_after = real_run.engine_before["live"], real_run.engine_after["live"]
    assert eng.delta(live_after, live_before, "vllm:request_success_total") == len(turns)
    assert eng.delta(live_after, live_before, "vllm:generation_tokens_total") == sum(
        t.completion_tokens or 0 for t in turns
    )
    for name in KINDS:
        before, after = real_run.engine_before[name], real_run.engine_after[name]
        # A copy the engine reset (a failure the gateway stored as one) is no engine success.
        (row,) = real_run.rows(
            "SELECT COUNT(*) AS n, SUM(COALESCE(cached_tokens, 0)) AS cached,"
            " SUM(usage_tokens) AS out FROM observations WHERE endpoint = ? AND arm = ?"
            " AND error_kind IS NULL",
            name,
            "candidate",
        )
        # Plus one request (one generated token) per scoring copy (test_real_scoring.py).
        scored = real_run.counters[name].get("score_ok", 0)
        assert eng.delta(after, before, "vllm:request_success_total") == row["n"] + scored, name
        out = row["out"] + scored
        assert eng.delta(after, before, "vllm:generation_tokens_total") == out, name
        hits = eng.delta(after, before, "vllm:prefix_cache_hits_total")
        assert hits == row["cached"], f"{name}: engine {hits} cached tokens, gateway {row}"
    (bikv,) = real_run.rows(
        "SELECT SUM(cached_tokens) AS c FROM observations WHERE endpoint = 'bi-kv'"
    )
    assert bikv["c"] > 0, "the prefix-caching engine reported no cached tokens"


def test_timing_is_measured_or_says_it_is_unresolved(real_run: RealRun) -> None:
    """No stored TPOT or inter-event latency is 0: every multi-token answer has a TPOT or is
    marked unresolved."""
    rows = real_run.rows(
        "SELECT endpoint, ttft_s, tpot_s, output_tokens, inter_event_mean_s FROM observations"
    )
    assert rows
    assert not [r for r in rows if r["tpot_s"] is not None and r["tpot_s"] <= 0]
    gaps = [r for r in rows if r["inter_event_mean_s"] is not None]
    assert not [r for r in gaps if r["inter_event_mean_s"] <= 0]
    states = [tpot_state(r["ttft_s"], r["tpot_s"], r["output_tokens"]) for r in rows]
    measured = states.count("measured")
    assert measured >= 0.5 * len(rows), f"{measured} of {len(rows)} answers have a TPOT"


def test_identical_texts_are_counted_alike(real_run: RealRun) -> None:
    """Every pair whose two answers are byte-identical and were both counted has identical
    token counts by one tokenizer (100 %), although the engines packed those tokens into
    different numbers of SSE events; no answer is counted from events, and the engine's usage is
    kept beside the count. An answer left uncounted (its /tokenize call failed or was late on a
    busy host) is not a count: such answers are rare (at most 1 %) and every one is reported
    in `canary_mirror_token_counts_total` under an outcome other than `counted`."""
    rows = real_run.rows(
        "SELECT p.output_tokens AS pt, c.output_tokens AS ct, p.token_counter AS pm,"
        " c.token_counter AS cm, p.token_events AS pe, c.token_events AS ce,"
        " c.usage_tokens AS cu"
        " FROM observations p JOIN observations c ON c.exchange_id = p.exchange_id"
        " WHERE p.arm = 'production' AND c.arm = 'candidate' AND p.error_kind IS NULL"
        " AND c.error_kind IS NULL AND p.output_hash = c.output_hash"
        " AND p.text_truncated = 0 AND c.text_truncated = 0"
    )
    assert len(rows) >= 100, len(rows)
    uncounted = sum((r["pm"] is None) + (r["cm"] is None) for r in rows)
    reported = sum(
        float(line.rsplit(" ", 1)[1])
        for line in real_run.gateway_metrics.splitlines()
        if line.startswith("canary_mirror_token_counts_total{") and 'outcome="counted"' not in line
    )
    assert uncounted <= reported, f"{uncounted} answers uncounted, {reported:g} reported"
    assert uncounted <= 0.01 * len(rows), f"{uncounted} of {len(rows)} pairs not counted"
    rows = [r for r in rows if r["pm"] is not None and r["cm"] is not None]
    unequal = [r for r in rows if r["pt"] != r["ct"] or r["pm"] != r["cm"]]
    assert not unequal, f"{len(unequal)} of {len(rows)} identical pairs counted differently"
    assert all(r["pm"] == "tokenize:control" and r["pt"] is not None for r in rows)
    # The engine's usage is kept beside the count as information: it counts generated ids,
    # which re-tokenized text need not reproduce one for one (EOS; merges across pieces).
    assert all(r["cu"] is not None for r in rows), "the copies asked include_usage"
    packed = sum(1 for r in rows if r["pe"] != r["ce"])
    gaps = [r["cu"] - r["ct"] for r in rows]
    print(
        f"identical pairs {len(rows)}, event counts differing in {packed}; usage - counted: "
        f"mean {sum(gaps) / len(gaps):+.2f}, range [{min(gaps)}, {max(gaps)}]"
    )


def test_at_least_98_percent_of_copies_observed(real_run: RealRun) -> None:
    """Each candidate observed at least 98 % of its sampled copies, and the accounting adds up."""
    low = {}
    for name, c in real_run.counters.items():
        accounted = (
            c["deduplicated"] + c["dropped_overflow"] + c["dropped_oversize"]
            + c["shed_overload"] + c["sent"] + c["pending"]
        )  # fmt: skip
        assert c["sampled"] == accounted, (name, c)
        observed = c["observed_ok"] + c["observed_error"]
        if observed < 0.98 * c["sampled"]:
            low[name] = c
    assert not low, f"fewer than 98 % of sampled copies observed: {low}"


def test_bikv_is_promoted(real_run: RealRun) -> None:
    """The prefix-caching candidate, identical in answers and faster on later turns, promotes
    at the margins `canary plan` gives for this run's sessions at these engines' noise (turn-1
    TTFT, one pair per session at a log-ratio sd of ~1.1, sets the latency margin), widened by the
    run-level spread two identical engines show on shared cores (`HOST_SPREAD`): its goal shown,
    every guardrail inside its margin, every quality metric inside."""
    report = real_run.reports["bi-kv"]
    assert report["metrics"]["ttft_later_turns"]["status"] == "improved", _reasons(report)
    for metric in QUALITY & set(report["metrics"]):
        assert report["metrics"][metric]["status"] in ("inside", "n/a", "info"), _reasons(report)
    assert report["verdict"] == "promote", _reasons(report)


def test_quantized_is_rejected_on_quality(real_run: RealRun) -> None:
    """The bfloat16 candidate, whose greedy answers differ, is rejected on a quality metric."""
    report = real_run.reports["quantized"]
    beyond = {
        m
        for m, body in report["metrics"].items()
        if m in QUALITY and body["status"] in ("beyond", "critical")
    }
    assert beyond, _reasons(report)
    assert report["verdict"] == "reject", _reasons(report)


def test_control_is_never_rejected(real_run: RealRun) -> None:
    """A control identical to live is never rejected, and matches production answer for answer."""
    report = real_run.reports["control"]
    assert report["verdict"] != "reject", _reasons(report)
    # The control has no control of its own, so agreement does not gate its verdict (status
    # `ungated`); its interval against production must still lie wholly inside the margin.
    exact = report["metrics"]["exact_match"]
    assert exact["status"] in ("inside", "ungated"), _reasons(report)
    assert exact["ci_high"] <= exact["margin"] and exact["ci_low"] >= -exact["margin"], exact
    # Counted, not events: output length and TPOT of a control are never beyond their margin.
    for name in ("output_length", "tpot"):
        assert report["metrics"][name]["status"] not in ("beyond", "critical"), _reasons(report)


def test_reports_cover_every_candidate(real_run: RealRun) -> None:
    """Every registered candidate has a report over the run's pairs, with its kind."""
    for name, kind in KINDS.items():
        report = real_run.reports[name]
        assert report["kind"] == kind
        c = real_run.counters[name]
        assert report["pairs"]["n"] == c["observed_ok"] + c["observed_error"], report["pairs"]
        assert report["pairs"]["lost"] == 0, report["pairs"]
    assert re.search(r"canary_proxy_requests_total\{[^}]*\"200\"", real_run.gateway_metrics)
