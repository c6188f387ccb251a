"""A candidate's gradings as columns: one row per verdict of its LLM grader, in arrival order of
the pairs they grade (docs/grading.md). Built from the rows `storage.reports.gradings` reads
(through `evaluators.pairs.load`) or directly by a test's world; and the accounting of every
complete pair of the window (`pair_accounting`): graded, or why not. Pure numpy: no IO.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from domain.records import GRADING_OUTCOMES
from evaluators.pairs.columns import session_id

__all__ = [
    "COLUMNS",
    "COMPLETE_PAIRS",
    "PAIR_OUTCOMES",
    "PAIR_OUTCOME_LABELS",
    "SCORES",
    "Gradings",
    "accounting_key",
    "pair_accounting",
]

# The columns a row holds, in order (storage.reports.gradings reads them so).
COLUMNS: Final = (
    "exchange_id",
    "received_at",
    "session_key",
    "candidate_first",
    "swapped",
    "outcome",
    "winner",
    "candidate_chars",
    "reference_chars",
    "prompt_tokens",
    "completion_tokens",
    "graded_at",
)
# A verdict's score for the candidate: +1 preferred, 0 tie, -1 the reference preferred.
SCORES: Final = {"candidate": 1.0, "tie": 0.0, "reference": -1.0}
_OUTCOME_CODE: Final[dict[str, int]] = {name: i for i, name in enumerate(GRADING_OUTCOMES)}

# What became of each complete pair (production's answer and the candidate's both stored), in the
# order the report lists them: graded (a verdict in at least one order), else the reason its
# first order's row gives; "unrecorded" is a pair with no row at all (its grader was added
# later, or its row was lost: the writer's queue full, a mirror process killed).
PAIR_OUTCOMES: Final = (
    "graded",
    "not_sampled",
    "queue_full",
    "no_answer",
    "over_cap",
    "failed",
    "unparseable",
    "stopped",
    "unrecorded",
)
PAIR_OUTCOME_LABELS: Final = {
    "graded": "graded",
    "not_sampled": "not sampled by the grader's rate",
    "queue_full": "queue full (grading_max_pending)",
    "no_answer": "an answer failed or missing",
    "over_cap": "over cap (max_per_minute or daily budget)",
    "failed": "grader failed",
    "unparseable": "grader's answer unparseable",
    "stopped": "mirror stopped before grading",
    "unrecorded": "no grading record",
}
COMPLETE_PAIRS: Final = "complete_pairs"


def accounting_key(outcome: str) -> str:
    """The report detail's key of the complete pairs with `outcome`."""
    return f"{COMPLETE_PAIRS}_{outcome}"


def pair_accounting(groups: Iterable[tuple[bool, str | None, str | None, int]]) -> dict[str, int]:
    """`complete_pairs` and `complete_pairs_<outcome>` for every PAIR_OUTCOMES from the groups
    `storage.reports.gradings.pair_outcomes` reads: they add up to the complete pairs."""
    counts = dict.fromkeys(PAIR_OUTCOMES, 0)
    for graded, first, any_row, n in groups:
        outcome = "graded" if graded else (first or any_row or "unrecorded")
        counts[outcome if outcome in counts else "unrecorded"] += n
    return {COMPLETE_PAIRS: sum(counts.values())} | {
        accounting_key(o): n for o, n in counts.items()
    }


I64 = NDArray[np.int64]
F64 = NDArray[np.float64]
B = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Gradings:
    """Per verdict (one grading of one pair in one order); pairs are dense codes 0..pairs-1
    numbered in arrival order, so a pair's verdicts share its code."""

    pair: I64
    received_at: F64  # the pair's exchange
    session: NDArray[np.uint64]  # 64-bit prefix of the session hash; 0 = none
    candidate_first: B
    swapped: B
    outcome: NDArray[np.int8]  # index into domain.records.GRADING_OUTCOMES
    score: F64  # SCORES of the winner; NaN unless graded
    candidate_chars: I64
    reference_chars: I64
    tokens: I64  # prompt + completion tokens the grading cost
    # Every complete pair of the window by outcome (`pair_accounting`); empty when not read.
    accounting: Mapping[str, int] = field(default_factory=dict)
    # When each verdict was stored (epoch s; NaN: unknown, taken as on time); None when not read.
    graded_at: F64 | None = None

    @property
    def n(self) -> int:
        return len(self.pair)

    @property
    def pairs(self) -> int:
        return int(self.pair.max()) + 1 if len(self.pair) else 0

    def count(self, outcome: str) -> int:
        return int(np.count_nonzero(self.outcome == _OUTCOME_CODE[outcome]))

    @property
    def graded(self) -> B:
        out: B = self.outcome == _OUTCOME_CODE["graded"]
        return out

    @classmethod
    def from_rows(
        cls, rows: Iterable[Sequence[Any]], accounting: Mapping[str, int] | None = None
    ) -> Gradings:
        """Columns from rows laid out as COLUMNS, ordered by the pair's arrival (a pair's
        verdicts adjacent); `accounting` as `pair_accounting` returns it. A row without its
        last column (`graded_at`) is a verdict taken as on time."""
        rows = list(rows)
        codes: dict[str, int] = {}
        pair = np.fromiter((codes.setdefault(r[0], len(codes)) for r in rows), np.int64, len(rows))
        return cls(
            pair=pair,
            received_at=np.array([r[1] for r in rows], dtype=np.float64),
            session=np.fromiter((session_id(r[2]) for r in rows), np.uint64, len(rows)),
            candidate_first=np.array([bool(r[3]) for r in rows], dtype=bool),
            swapped=np.array([bool(r[4]) for r in rows], dtype=bool),
            outcome=np.array([_OUTCOME_CODE[r[5]] for r in rows], dtype=np.int8),
            score=np.array(
                [SCORES[r[6]] if r[5] == "graded" and r[6] in SCORES else np.nan for r in rows],
                dtype=np.float64,
            ),
            candidate_chars=np.array([r[7] or 0 for r in rows], dtype=np.int64),
            reference_chars=np.array([r[8] or 0 for r in rows], dtype=np.int64),
            tokens=np.array([(r[9] or 0) + (r[10] or 0) for r in rows], dtype=np.int64),
            accounting=dict(accounting or {}),
            graded_at=np.array(
                [r[11] if len(r) > 11 and r[11] is not None else np.nan for r in rows],
                dtype=np.float64,
            ),
        )

    @classmethod
    def empty(cls) -> Gradings:
        return cls.from_rows(())
