"""What a stored observation's timing columns mean when a number is missing, and TPOT from a
token count (pure: no IO).

TPOT is (E2E - TTFT) / (output tokens - 1) with tokens *counted* the same way on both arms of a
pair (the mirror plane's token counter), never SSE events: vLLM packs several tokens into one
event whenever its engine runs ahead of its API server's stream, and that depends on each
engine's load. The meter leaves TPOT None; `tpot` below is the one formula, used where a count
is known (the token counter; the capacity replay, with each arm's engine-reported usage).

A missing TPOT has three causes and no column of its own; this module is the one place that
reads them back from `tpot_s`, `output_tokens` and `ttft_s`, so the evaluators can say why a
pair has no TPOT instead of dropping it unnoticed. It must never import anything of ours but
`domain`.
"""

from __future__ import annotations

from typing import Final, Literal

MEASURED: Final = "measured"  # TPOT is a number
UNRESOLVED: Final = "unresolved"  # several counted tokens, but all at one instant: not timed
UNCOUNTED: Final = "uncounted"  # tokens arrived, but the text could not be counted
NOT_APPLICABLE: Final = "not_applicable"  # at most one output token, or no token at all

TimingState = Literal["measured", "unresolved", "uncounted", "not_applicable"]


def tpot(
    ttft_s: float | None, e2e_s: float | None, tokens: int | None, resolution_s: float
) -> float | None:
    """(e2e - ttft) / (tokens - 1) for tokens > 1; None when it does not apply or when the span
    is within the clock's resolution (every token in one read: unknown, never 0)."""
    if tokens is None or tokens <= 1 or ttft_s is None or e2e_s is None:
        return None
    span = e2e_s - ttft_s
    return span / (tokens - 1) if span > resolution_s else None


def tpot_state(
    ttft_s: float | None, tpot_s: float | None, output_tokens: int | None
) -> TimingState:
    """Whether an observation's TPOT was measured, could not be resolved or counted, or does
    not apply."""
    if tpot_s is not None:
        return MEASURED
    if ttft_s is None:
        return NOT_APPLICABLE
    if output_tokens is None:
        return UNCOUNTED
    return UNRESOLVED if output_tokens > 1 else NOT_APPLICABLE
