"""Building the compact PairSet: arm alignment, failure codes, text features, growth."""

from __future__ import annotations

import msgspec
import numpy as np

from domain.outcomes import ErrorKind
from evaluators.pairs.columns import PairSetBuilder, pair_row, pairset_from_pairs
from evaluators.pairs.types import ERROR_KINDS, TIMEOUT, UNKNOWN, ArmObs, Pair


def ok(text: str | None = "hello world", h: str | None = None, **kw: object) -> ArmObs:
    return ArmObs(
        status=200,
        ttft_s=0.1,
        tpot_s=0.01,
        e2e_s=1.0,
        output_tokens=10,
        output_text=text,
        output_hash=h,
        finish_reason="stop",
        **kw,  # type: ignore[arg-type]
    )


def pair(
    i: int, prod: ArmObs, cand: ArmObs | None, ctrl: ArmObs | None = None, **kw: object
) -> Pair:
    return Pair(
        exchange_id=f"e{i}",
        received_at=float(i),
        production=prod,
        candidate=cand,
        control=ctrl,
        **kw,  # type: ignore[arg-type]
    )


def test_failures_are_coded_and_lost_pairs_counted() -> None:
    """Error kinds and HTTP statuses become failure codes; a missing candidate is lost."""
    pairs = [
        pair(0, ok(), ArmObs(status=0, error_kind=ErrorKind.TIMEOUT)),
        pair(1, ok(), ArmObs(status=503)),
        pair(2, ok(), ArmObs(status=0, error_kind=ErrorKind.CANCELLED)),
        pair(3, ok(), ArmObs(status=0, error_kind="something-new")),
        pair(4, ok(), None),
        pair(5, ok(), ok()),
        pair(6, ok(), ArmObs(status=101, error_kind=ErrorKind.HTTP_OTHER)),
        pair(7, ok(), ArmObs(status=200, error_kind=ErrorKind.CLIENT_DISCONNECT)),
        pair(8, ok(), ArmObs(status=101)),
    ]
    ps = pairset_from_pairs(pairs)
    c = ps.candidate
    assert list(c.error) == [
        TIMEOUT,
        ERROR_KINDS.index(ErrorKind.HTTP_5XX),
        ERROR_KINDS.index(ErrorKind.CANCELLED),
        ERROR_KINDS.index(ErrorKind.OTHER),
        0,
        0,
        ERROR_KINDS.index(ErrorKind.HTTP_OTHER),
        ERROR_KINDS.index(ErrorKind.CLIENT_DISCONNECT),
        ERROR_KINDS.index(ErrorKind.HTTP_OTHER),
    ]
    assert list(c.ok) == [False, False, False, False, False, True, False, False, False]
    assert list(c.present) == [True] * 4 + [False] + [True] * 4
    assert ps.lost == 1 and ps.n == 9 and not ps.has_control


def test_exact_match_by_hash_then_text() -> None:
    """Hashes decide equality when both are stored; otherwise whole (untruncated) texts do;
    a truncated text without hashes leaves the match unknown."""
    pairs = [
        pair(0, ok("a", "h1"), ok("b", "h1")),  # hashes win over texts
        pair(1, ok("same", None), ok("same", None)),
        pair(2, ok("x y", None), ok("x z", None), temperature=0.0),
        pair(3, ok("cut", None, text_truncated=True), ok("cut", None)),
    ]
    m = pairset_from_pairs(pairs).vs_candidate
    assert list(m.match) == [1, 1, 0, UNKNOWN]
    assert np.isnan(m.divergence[0]) and np.isclose(m.divergence[2], 2 / 3)


def test_similarity_on_the_id_sample_only() -> None:
    """Similarity is computed on the exchanges whose id ends in a sampled suffix, matches
    included (so the sample is unbiased); the fraction sampled is recorded."""
    pairs = [pair(i, ok("a b c", "h"), ok("a b d", "h" if i % 2 else "g")) for i in range(40)]
    pairs = [msgspec.structs.replace(p, exchange_id=f"x{i:02x}") for i, p in enumerate(pairs)]
    ps = pairset_from_pairs(pairs, similarity_fraction=0.05)  # suffixes 00..0c: 13 of 256
    sim = ps.vs_candidate.similarity
    assert np.flatnonzero(np.isfinite(sim)).tolist() == list(range(13))
    assert sim[1] == 1.0 and sim[0] < 1.0
    assert ps.similarity_fraction == 13 / 256


def test_json_and_tool_features() -> None:
    """JSON validity only where JSON was asked; tool calls compared when asked or present."""
    calls = '[{"name": "f", "arguments": "{\\"a\\": 1}"}]'
    pairs = [
        pair(0, ok('{"a": 1}'), ok('{"a": '), json_requested=True),
        pair(1, ok("plain"), ok("plain")),
        pair(2, ok(tool_calls=calls), ok(tool_calls=calls), tools_requested=True),
        pair(3, ok(tool_calls=calls), ok()),
    ]
    ps = pairset_from_pairs(pairs)
    assert list(ps.production.json_valid) == [1, UNKNOWN, UNKNOWN, UNKNOWN]
    assert list(ps.candidate.json_valid) == [0, UNKNOWN, UNKNOWN, UNKNOWN]
    assert list(ps.vs_candidate.tool_equal) == [UNKNOWN, UNKNOWN, 1, 0]


def test_sessions_models_and_control() -> None:
    """Session keys become distinct non-zero ids (0 = none); models are coded; the control's
    comparison with production is filled when a control is present."""
    pairs = [
        pair(0, ok(), ok(), ok(), session_key="00" * 16, model="a"),
        pair(1, ok(), ok(), ok(), session_key="ab" * 16, model="b"),
        pair(2, ok(), ok(), ok(), session_key="not hex", model="a"),
        pair(3, ok(), ok(), None),
    ]
    ps = pairset_from_pairs(pairs)
    assert ps.has_control and ps.models == ["a", "b", ""]
    s = ps.session.tolist()
    assert s[3] == 0 and len({s[0], s[1], s[2]}) == 3 and 0 not in s[:3]
    assert list(ps.vs_control.match) == [1, 1, 1, UNKNOWN]


def test_builder_grows_past_its_capacity_and_trims() -> None:
    """Rows beyond the preallocated capacity grow the columns; finish() trims to n."""
    pairs = [pair(i, ok(), ok()) for i in range(100)]
    b = PairSetBuilder(16, has_control=False)
    for start in range(0, 100, 30):
        b.add([pair_row(p) for p in pairs[start : start + 30]])
    ps = b.finish()
    assert ps.n == 100 and len(ps.received_at) == 100
    assert ps.received_at.tolist() == [float(i) for i in range(100)]
    # Compact: ~280 bytes of columns per pair (3 arms x 16 float32 quantities, codes, the
    # token counter's int64), never a Python object per pair (~1 kB and more each).
    assert ps.nbytes < 300 * 100


def test_an_id_tail_that_is_not_two_hex_digits_is_unranked() -> None:
    """An exchange id ending in "-1" or "+f" is outside the similarity sample's order (int()
    would read them as hex numbers, and -1 overflows the rank column)."""
    from evaluators.pairs.columns import UNRANKED, suffix_rank

    assert [suffix_rank(t) for t in ("00", "ff", "A0")] == [0, 255, 160]
    assert {suffix_rank(t) for t in ("-1", "+f", " 1", "g0", "0", None)} == {UNRANKED}
