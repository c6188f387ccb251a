"""Scoring copies on real vLLM: the bfloat16 candidate scored beside the float32 control.

The run is the suite's one run (`real_run`, conftest.py), where the quantized candidate scores a
share (`SCORE_RATE`) of its pairs and the control scores the same pairs. What it shows: the
bfloat16 candidate is rejected on `logprob_divergence`; the control (float32, like live) is
never flagged; the scoring load shows in the candidate's own `/metrics` and stays within the
share asked. `scoring-summary.json` in the run's directory holds the numbers, with pairs to a
decision for the divergence against exact match on the same run.
"""

from __future__ import annotations

import json
import math
from typing import Any

from domain.accounting import identity_holds
from tests.real_engine import engines as eng
from tests.real_engine.conftest import SCORE_RATE, RealRun


def _reasons(report: dict[str, Any]) -> str:
    return "\n".join(
        f"{k}: {m['status']} {m.get('reason', '')}" for k, m in report["metrics"].items()
    )


def _first_beyond(metric: dict[str, Any]) -> float | None:
    """Pairs at the first look whose always-valid interval lies wholly beyond the margin."""
    for pairs, low, _high in metric.get("trajectory") or []:
        if low is not None and low > metric["margin"]:
            return float(pairs)
    return None


def _summary(run: RealRun) -> dict[str, Any]:
    report = run.reports["quantized"]
    div, exact = report["metrics"]["logprob_divergence"], report["metrics"]["exact_match"]
    first_div, first_exact = _first_beyond(div), _first_beyond(exact)
    out = {
        "score_rate": SCORE_RATE,
        "logprob_divergence": {
            k: div.get(k) for k in ("status", "n", "estimate", "ci_low", "ci_high", "margin")
        }
        | {"detail": div["detail"], "pairs_to_beyond_margin": first_div},
        "exact_match": {
            k: exact.get(k) for k in ("status", "n", "estimate", "ci_low", "ci_high", "margin")
        }
        | {"pairs_to_beyond_margin": first_exact},
        # Scored pairs are a SCORE_RATE share of the mirrored ones: in mirrored pairs, the
        # divergence decided after first_div / SCORE_RATE.
        "divergence_in_mirrored_pairs": None if first_div is None else first_div / SCORE_RATE,
    }
    (run.workdir / "scoring-summary.json").write_text(json.dumps(out, indent=2))
    return out


def test_bfloat16_is_rejected_on_logprob_divergence(real_run: RealRun) -> None:
    """The bfloat16 candidate picks production's (float32) tokens less often than the control
    does: wholly beyond the margin, critical for a quantized candidate, and the verdict rejects."""
    report = real_run.reports["quantized"]
    div = report["metrics"]["logprob_divergence"]
    summary = _summary(real_run)
    print(json.dumps(summary, indent=2))  # the note's numbers (pytest -s)
    assert div["role"] == "critical", div
    assert div["status"] in ("beyond", "critical"), (div, _reasons(report))
    assert div["ci_low"] > div["margin"], div
    assert div["detail"]["kl_per_token"] > 0, div["detail"]
    assert report["verdict"] == "reject", _reasons(report)


def test_control_is_never_flagged_by_scoring(real_run: RealRun) -> None:
    """The control (float32, configured like live) scores beside the candidate but is not judged
    on it (no control of its own), and no metric of its report is beyond a margin."""
    report = real_run.reports["control"]
    div = report["metrics"]["logprob_divergence"]
    assert div["status"] in ("n/a", "ungated") and not div["n"], div
    flagged = [
        m for m, body in report["metrics"].items() if body["status"] in ("beyond", "critical")
    ]
    assert not flagged, _reasons(report)
    assert report["verdict"] != "reject", _reasons(report)


def test_scoring_load_is_visible_and_bounded(real_run: RealRun) -> None:
    """Every scoring copy is accounted for; the share scored is the share asked; the candidate's
    own vLLM counters show exactly one prefill request per scoring copy, no more."""
    turns = len(real_run.turns)
    c = real_run.counters["quantized"]
    k = real_run.counters["control"]
    assert identity_holds(c) and identity_holds(k), (c, k)
    sampled = c["score_sampled"]
    sd = math.sqrt(turns * SCORE_RATE * (1 - SCORE_RATE))
    assert abs(sampled - turns * SCORE_RATE) < 5 * sd, (sampled, turns)
    # Past score_max_pending a pair is not scored (score_dropped): the bound, not a failure.
    assert c["score_ok"] >= 50 and c["score_unsupported"] == 0 and c["score_failed"] == 0, c
    assert k["score_sampled"] == sampled  # the control scored the same pairs
    url = real_run.engines["quantized"].url
    now = eng.settled_scrape(url, "vllm:request_success_total")
    before = real_run.engine_before["quantized"]
    requests = eng.delta(now, before, "vllm:request_success_total")
    # The latency copies (one per turn) plus one /v1/completions per scoring copy that reached
    # the engine; /tokenize runs no model.
    assert turns + c["score_ok"] <= requests <= turns + c["score_sent"], (requests, c)
    extra_tokens = eng.delta(now, before, "vllm:prompt_tokens_total") - eng.delta(
        real_run.engine_after["live"], real_run.engine_before["live"], "vllm:prompt_tokens_total"
    )
    scored = real_run.rows(
        "SELECT SUM(o.score_tokens) AS answer, SUM(e.prompt_tokens) AS prompt, COUNT(*) AS n "
        "FROM observations o JOIN exchanges e ON e.id = o.exchange_id "
        "WHERE o.endpoint = 'quantized' AND o.score_tokens > 0"
    )[0]
    assert scored["n"] == c["score_ok"]
    # Each scoring copy prefills the prompt and production's answer: about what live
    # prefilled for that turn plus the answer's tokens (templates may differ by a few tokens).
    expected = scored["prompt"] + scored["answer"]
    assert abs(extra_tokens - expected) <= 0.02 * expected + 8 * scored["n"], (
        extra_tokens,
        expected,
    )
