"""Tool-call validity: the share of answers whose calls break their request's declared tools.

Whether a call is valid is absolute (the function was declared, its arguments parse as a JSON
object that satisfies the tool's JSON Schema, `tool_choice` and `parallel_tool_calls` were
honoured, every call has its own id), so it needs no control and no noise floor, and it gates for
every kind of candidate, a model upgrade included. The mirror process checks every arm's answer
(`gateway.mirror.toolcalls`) and stores the verdict with the observation (`tool_check`); here,
per pair, 1{candidate invalid} - 1{production invalid}, by session units, on the betting sequence
the other rates use (STATISTICS.md, "Tool-call validity"). Production's own invalid share is the
reference, not zero: engines emit invalid calls too, and only the difference is the candidate's.

A pair is used where both arms answered and both verdicts are known: an answer whose declared
schema could not be checked safely (`uncheckable`) and rows stored before the check existed are
left out, and the report says how many. Pure: no IO.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from domain.outcomes import TOOL_CHECKS, TOOL_INVALID, ToolCheck
from evaluators.judge.metric import (
    Detail,
    EvalContext,
    MetricResult,
    MetricSpec,
    empty_result,
    indicator_difference,
    judge_bounded,
)
from evaluators.judge.settings import VerdictSettings

NAME = "tool_validity"

_INVALID_CODES = np.array(sorted(TOOL_CHECKS.index(c) for c in TOOL_INVALID), dtype=np.int8)
_UNCHECKABLE = TOOL_CHECKS.index(ToolCheck.UNCHECKABLE)

I8 = NDArray[np.int8]


def spec(s: VerdictSettings) -> MetricSpec:
    """Invalid-call share, candidate minus production: critical, for every kind."""
    return MetricSpec(
        name=NAME,
        label="invalid tool calls",
        role="critical",
        harm="higher",
        scale="difference",
        delta=s.tool_validity_delta,
        critical=s.tool_validity_critical,
        unit="rate",
    )


def _by_reason(codes: I8) -> dict[str, int]:
    """How many answers got each verdict (those that got any), in declaration order."""
    counts = np.bincount(codes[codes >= 0].astype(np.int64), minlength=len(TOOL_CHECKS))
    return {str(TOOL_CHECKS[i]): int(c) for i, c in enumerate(counts) if c}


def _reasons_line(arm: str, counts: dict[str, int]) -> str:
    invalid = {k: v for k, v in counts.items() if k in TOOL_INVALID}
    said = ", ".join(f"{k} {v:,}" for k, v in invalid.items()) or "none"
    return f"{arm}: {sum(counts.values()):,} answers checked; invalid by reason: {said}"


def tool_validity(ctx: EvalContext) -> list[MetricResult]:
    """Answers with an invalid tool call: candidate minus production, by session unit."""
    ps = ctx.pairs
    sp = spec(ctx.settings)
    prod, cand = ps.production, ps.candidate
    p_code, c_code = prod.tool_check, cand.tool_check
    answered = prod.ok & cand.ok
    checked = answered & ((p_code >= 0) | (c_code >= 0))
    known = checked & (p_code >= 0) & (c_code >= 0)
    use = known & (p_code != _UNCHECKABLE) & (c_code != _UNCHECKABLE)
    reasons = {
        "candidate": _by_reason(c_code[answered]),
        "production": _by_reason(p_code[answered]),
    }
    detail: Detail = {
        "checked_pairs": int(np.count_nonzero(checked)),
        "unchecked_pairs": int(np.count_nonzero(checked & ~known)),
        "uncheckable_pairs": int(np.count_nonzero(known & ~use)),
    }
    for arm, counts in reasons.items():  # flat keys: `invalid_candidate_schema`, ...
        detail.update({f"invalid_{arm}_{k}": v for k, v in counts.items() if k in TOOL_INVALID})
    if not np.any(use):
        res = empty_result(sp, "production", "not applicable: no pair with tool calls checked")
        res.detail = detail
        return [res]
    bad_c = np.isin(c_code[use], _INVALID_CODES)
    bad_p = np.isin(p_code[use], _INVALID_CODES)
    detail["rate_candidate"] = float(bad_c.mean())
    detail["rate_production"] = float(bad_p.mean())
    d = indicator_difference(bad_c, bad_p)
    res = judge_bounded(sp, d, ctx, use=use, reference="production", detail=detail)
    res.notes += [_reasons_line(arm, counts) for arm, counts in reasons.items()]
    if detail["uncheckable_pairs"]:
        res.notes.append(
            f"{detail['uncheckable_pairs']} pairs left out: a declared schema could not be "
            "checked safely (too big, too deep, a remote $ref or an unsafe pattern)"
        )
    if detail["unchecked_pairs"]:
        res.notes.append(
            f"{detail['unchecked_pairs']} pairs left out: one arm's answer was never checked"
        )
    return [res]


def name_first_errors(results: list[MetricResult], errors: list[tuple[str, int]]) -> None:
    """Add the candidate's most frequent first problems (`tool_error`: the call, the JSON
    pointer into its arguments and the failing keyword, never a value) to the metric's notes."""
    for r in results:
        if r.name == NAME:
            said = "; ".join(f"{text} ×{n:,}" for text, n in errors)
            r.notes.append(f"most frequent first problems (candidate): {said}")
