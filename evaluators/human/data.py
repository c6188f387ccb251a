"""People's labels as columns keyed by the gradings' pair codes (`evaluators.pairs.gradings`):
which graded pairs were kept for labelling, and every label of them. Built from the rows
`storage.labels.label_rows` reads, or directly by a test's world. Pure: no IO.

A pair's people's score is its **first** label by time (+1 the candidate preferred, 0 tie,
-1 the reference; a first label "skip" makes the pair skipped): later labels of the
double-labelled share give people's agreement with each other and never move the estimate,
so a second labeller's lag cannot change a unit already used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from domain.records import LabelRecord, label_score

__all__ = ["HumanLabels"]

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class HumanLabels:
    """Kept pairs and labels by pair code (-1: a pair outside the gradings loaded)."""

    rate: float  # the grader's label_rate: the chance a graded unit is kept for people
    kept: I64  # pair code of each pair kept for labelling
    pair: I64  # per label: pair code
    labeller: I64  # per label: dense labeller code
    score: F64  # per label: +1 / 0 / -1, NaN for a skip
    at: F64  # per label: when it was given (epoch s)

    @property
    def n(self) -> int:
        return len(self.pair)

    @classmethod
    def from_rows(
        cls,
        rate: float,
        pair_ids: Sequence[str],
        kept: Iterable[str],
        labels: Iterable[LabelRecord],
    ) -> HumanLabels:
        """`pair_ids`: the exchange id of each pair code in the gradings' order; `kept`: the
        exchange ids kept for labelling; `labels`: every label of the candidate."""
        code: Mapping[str, int] = {e: i for i, e in enumerate(pair_ids)}
        rows = sorted(labels, key=lambda r: r.labelled_at)
        names: dict[str, int] = {}
        return cls(
            rate=float(rate),
            kept=np.array([code.get(e, -1) for e in kept], dtype=np.int64),
            pair=np.array([code.get(r.exchange_id, -1) for r in rows], dtype=np.int64),
            labeller=np.array(
                [names.setdefault(r.labeller, len(names)) for r in rows], dtype=np.int64
            ),
            score=np.array(
                [np.nan if (s := label_score(r.choice)) is None else s for r in rows],
                dtype=np.float64,
            ),
            at=np.array([r.labelled_at for r in rows], dtype=np.float64),
        )

    def first(self, pairs: int) -> tuple[NDArray[np.bool_], NDArray[np.bool_], F64]:
        """Per pair code 0..pairs-1: (kept, has a first label, its score: NaN when skipped or
        unlabelled)."""
        kept = np.zeros(pairs, dtype=bool)
        ok = (self.kept >= 0) & (self.kept < pairs)
        kept[self.kept[ok]] = True
        done = np.zeros(pairs, dtype=bool)
        score = np.full(pairs, np.nan)
        order = np.argsort(self.at, kind="stable")
        for i in order[::-1]:  # the earliest label of a pair is written last
            p = int(self.pair[i])
            if 0 <= p < pairs:
                done[p] = True
                score[p] = self.score[i]
        return kept, done & kept, score

    def doubles(self, pairs: int) -> tuple[F64, F64]:
        """(first, second) non-skip label scores of the pairs two people labelled."""
        firsts: dict[int, float] = {}
        seconds: dict[int, float] = {}
        who: dict[int, int] = {}
        for i in np.argsort(self.at, kind="stable"):
            p, s = int(self.pair[i]), float(self.score[i])
            if not 0 <= p < pairs or np.isnan(s):
                continue
            if p not in firsts:
                firsts[p], who[p] = s, int(self.labeller[i])
            elif p not in seconds and who[p] != int(self.labeller[i]):
                seconds[p] = s
        both = sorted(seconds)
        return (
            np.array([firsts[p] for p in both], dtype=np.float64),
            np.array([seconds[p] for p in both], dtype=np.float64),
        )
