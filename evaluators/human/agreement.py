"""Agreement: the grader's verdicts against people's labels (a confusion matrix with ties and
Cohen's κ), and people against each other (the double-labelled share). Pure numpy."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

__all__ = ["CATEGORIES", "cohen_kappa", "confusion", "to_category"]

F = NDArray[np.float64]
# Rows and columns of a confusion matrix: the candidate preferred, a tie, the reference.
CATEGORIES = ("candidate", "tie", "reference")


def to_category(score: F) -> NDArray[np.int64]:
    """A score on the grader's scale to its category index: > 0 candidate, 0 tie, < 0
    reference (a pair graded both ways that split averages to 0: a tie)."""
    return np.where(score > 0, 0, np.where(score < 0, 2, 1)).astype(np.int64)


def confusion(a: F, b: F) -> NDArray[np.int64]:
    """3x3 counts: rows a's category, columns b's (NaN in either drops the pair)."""
    ok = np.isfinite(a) & np.isfinite(b)
    i, j = to_category(a[ok]), to_category(b[ok])
    return np.bincount(i * 3 + j, minlength=9).reshape(3, 3).astype(np.int64)


def cohen_kappa(m: NDArray[np.int64]) -> tuple[float, float, int]:
    """(κ, observed agreement share, n) of a square confusion matrix; NaN without data or when
    chance agreement is total (both raters always said the same one category)."""
    n = int(m.sum())
    if n == 0:
        return math.nan, math.nan, 0
    p = m / n
    po = float(np.trace(p))
    pe = float(np.sum(p.sum(axis=1) * p.sum(axis=0)))
    kappa = (po - pe) / (1.0 - pe) if pe < 1.0 else math.nan
    return kappa, po, n
