"""What a stored observation's timing columns mean when a number is missing (pure: no IO).

The meter leaves TPOT and ITL None, never 0, when an answer's tokens all reached it within the
clock's resolution (one read: a fast engine, a busy host). Without a column of its own that
state is written as `tpot_s IS NULL` beside `output_tokens > 1` and a first token; this module
is the one place that reads it back, so the evaluators can say why a pair has no TPOT instead
of dropping it unnoticed. It must never import anything of ours but `domain`.
"""

from __future__ import annotations

from typing import Final, Literal

MEASURED: Final = "measured"  # TPOT (and ITL when streamed) are numbers
UNRESOLVED: Final = "unresolved"  # several tokens, but all at one instant: cannot be timed
NOT_APPLICABLE: Final = "not_applicable"  # at most one output token, or no token at all

TimingState = Literal["measured", "unresolved", "not_applicable"]


def tpot_state(
    ttft_s: float | None, tpot_s: float | None, output_tokens: int | None
) -> TimingState:
    """Whether an observation's TPOT was measured, could not be resolved, or does not apply."""
    if tpot_s is not None:
        return MEASURED
    if ttft_s is not None and output_tokens is not None and output_tokens > 1:
        return UNRESOLVED
    return NOT_APPLICABLE
