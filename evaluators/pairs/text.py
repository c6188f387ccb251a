"""Comparisons of two outputs: similarity, first divergence, JSON validity, tool-call equality.

Pure string functions, each bounded in time by the length of its (capped) inputs.

Text similarity is the F1 (Dice) overlap of the multisets of word unigrams and bigrams, the
token-F1 of extractive QA evaluation extended with bigrams so word order counts locally. It is
chosen because it is linear in the text length (a Counter per text), symmetric, in [0, 1], 1 only
for texts with the same words in the same local order, and insensitive to whitespace and line
wrapping. difflib's ratio was rejected (quadratic worst case, asymmetric "junk" heuristics);
embedding similarity was rejected (it needs a model, and the gateway must not).
"""

from __future__ import annotations

from collections import Counter
from contextlib import suppress
from itertools import pairwise
from typing import Any

import msgspec

_decode = msgspec.json.decode


def similarity(a: str, b: str, max_chars: int = 4000) -> float:
    """Unigram+bigram F1 of two texts (first `max_chars` characters of each)."""
    if a == b:
        return 1.0
    ta = a[:max_chars].split()
    tb = b[:max_chars].split()
    if not ta and not tb:
        return 1.0
    if not ta or not tb:
        return 0.0
    ca: Counter[str | tuple[str, str]] = Counter(ta)
    ca.update(pairwise(ta))
    cb: Counter[str | tuple[str, str]] = Counter(tb)
    cb.update(pairwise(tb))
    # Multiset intersection, looping only over the shared n-grams (Counter.__and__ is slower).
    common = sum(min(ca[g], cb[g]) for g in ca.keys() & cb.keys())
    total = (2 * len(ta) - 1) + (2 * len(tb) - 1)
    return 2.0 * common / total


def first_divergence(a: str, b: str) -> int:
    """Length of the common prefix of a and b (binary search on C-speed slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def json_valid(text: str) -> bool:
    """Whether the text is one JSON document (what `response_format` JSON asked for)."""
    try:
        _decode(text)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return False
    return True


def _parsed_calls(raw: str | None) -> list[tuple[str, Any]] | None:
    if raw is None:
        return []
    try:
        calls = _decode(raw)
    except msgspec.DecodeError:
        return None
    if not isinstance(calls, list):
        return None
    out: list[tuple[str, Any]] = []
    for call in calls:
        if not isinstance(call, dict):
            return None
        args = call.get("arguments")
        if isinstance(args, str):
            # Unparseable arguments stay a raw string, which must then match exactly.
            with suppress(msgspec.DecodeError):
                args = _decode(args)
        out.append((str(call.get("name")), args))
    return out


def tool_calls_equal(a: str | None, b: str | None) -> bool | None:
    """Same tool calls, in order, with the same names and equal parsed arguments.

    None when either side's stored tool calls cannot be read at all.
    """
    pa, pb = _parsed_calls(a), _parsed_calls(b)
    if pa is None or pb is None:
        return None
    return pa == pb
