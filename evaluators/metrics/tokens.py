"""Token counts: which pairs a token-derived metric may use, and how each arm was counted.

An SSE event is not a token (vLLM packs several tokens into one event when its engine runs
ahead of its API server's stream, depending on load), and an engine's `usage` counts generated
ids (EOS, text cut by a stop string) that the text does not show. So output length, TPOT,
decode speed and cost per token compare two arms only where both answers were counted from
their text by one method (`token_counter`, set in the mirror plane; `same_count`). A pair
without such counts is left out of those metrics; when too few answered pairs are left, the
metric does not gate and says why, as a metric without a control does (a selection by
countability is not random: texts cut at `store_text_max_chars` are the long ones).

Also here: the per-arm summary the report shows (how each arm was counted, the engine's usage
as information, tokens per SSE event) and the tokens-per-event figure the inter-event latency
metrics carry.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

from evaluators.judge.metric import Detail, MetricResult, ungate
from evaluators.pairs.types import ArmColumns, PairSet, counter_code, same_count

B = NDArray[np.bool_]

# A token metric gates only when at least this share of the pairs it would use (both arms
# answered) were counted one way: below it, the counted pairs are a selection (the long texts
# cut at store_text_max_chars, tool calls) that can bias a ratio either way.
MIN_COUNTED_SHARE: Final = 0.9
# The metrics whose per-pair values derive from a token count.
TOKEN_METRICS: Final = ("tpot", "output_length", "decode_speed", "cost")


def counted(cand: ArmColumns, ref: ArmColumns, ok: B) -> B:
    """The pairs of `ok` whose two arms were counted by one method."""
    return ok & same_count(cand.counter, ref.counter)


def gate_on_counts(res: MetricResult, ok: B, use: B) -> MetricResult:
    """Keep `res` gating only when the counted pairs are most of the answered ones."""
    n_ok, n_counted = int(np.count_nonzero(ok)), int(np.count_nonzero(use))
    res.detail["pairs_counted"] = n_counted
    res.detail["pairs_answered"] = n_ok
    if n_ok and n_counted < MIN_COUNTED_SHARE * n_ok:
        why = (
            f"tokens counted one way in {n_counted} of {n_ok} answered pairs "
            f"(< {MIN_COUNTED_SHARE:.0%}): texts not stored or cut at store_text_max_chars, "
            "tool calls, or no tokenizer reachable (see the token counting table)"
        )
        if res.status == "ungated":  # already (no control): both reasons stand
            res.ungated = f"{res.ungated}; and {why}"
            return res
        return ungate(res, why, blocks=res.role == "goal")
    return res


def tokens_per_event(arm: ArmColumns, mask: B) -> float | None:
    """Mean counted tokens per token-carrying SSE event over `mask` (streamed answers)."""
    tokens, events = arm.output_tokens[mask], arm.token_events[mask]
    use = np.isfinite(tokens) & np.isfinite(events) & (events > 0) & (arm.counter[mask] != 0)
    if not np.any(use):
        return None
    return float(np.sum(tokens[use], dtype=np.float64) / np.sum(events[use], dtype=np.float64))


def methods_of(endpoints: list[str]) -> dict[int, str]:
    """Counter codes of the methods the report can name (each endpoint's /tokenize)."""
    return {counter_code(f"tokenize:{name}"): f"tokenize:{name}" for name in endpoints}


def arm_counts(pairs: PairSet, name: str, methods: dict[int, str]) -> Detail:
    """How one arm's answers were counted: by which method (`methods_of`), how many not, the
    engine's usage (information) and tokens per SSE event."""
    arm = pairs.arm(name)
    ok = arm.ok
    n_ok = int(np.count_nonzero(ok))
    codes = arm.counter[ok]
    by_method: dict[str, int] = {}
    for code, n in zip(*np.unique(codes[codes != 0], return_counts=True), strict=True):
        label = methods.get(int(code), "another tokenizer")
        by_method[label] = int(n)
    counted_n = sum(by_method.values())
    usage = arm.usage_tokens[ok]
    both = ok & np.isfinite(arm.usage_tokens) & (arm.counter != 0)
    return {
        "answered": n_ok,
        "counted": counted_n,
        "not_counted": n_ok - counted_n,
        # "tokenize:control" (one method), or each method with its answers when they differ.
        "counted_by": (
            next(iter(by_method))
            if len(by_method) == 1
            else ", ".join(f"{k} ({v})" for k, v in sorted(by_method.items())) or None
        ),
        "usage_reported": int(np.count_nonzero(np.isfinite(usage))),
        # Engine-reported minus counted tokens, where both are known (EOS, stop strings).
        "usage_minus_counted": (
            float(np.mean(arm.usage_tokens[both] - arm.output_tokens[both], dtype=np.float64))
            if np.any(both)
            else None
        ),
        "tokens_per_event": tokens_per_event(arm, ok),
    }


def gating_summary(results: list[MetricResult]) -> dict[str, str]:
    """Each token metric's gating state: "gating", or why it does not gate."""
    out: dict[str, str] = {}
    for r in results:
        if r.name in TOKEN_METRICS:
            if not r.gating:
                out[r.name] = "diagnostic"
            elif r.status == "ungated":
                out[r.name] = f"not gating: {r.ungated}"
            elif r.status == "n/a":
                out[r.name] = f"not gating: {r.reason or 'no data'}"
            else:
                out[r.name] = "gating"
    return out
