"""Output comparisons: n-gram similarity, first divergence, JSON validity, tool-call equality."""

from __future__ import annotations

import json

from evaluators.pairs.text import first_divergence, json_valid, similarity, tool_calls_equal


def test_similarity_bounds_and_symmetry() -> None:
    """1 for equal texts (whitespace aside), 0 for disjoint ones, symmetric, in between."""
    assert similarity("a b c", "a b c") == 1.0
    assert similarity("a  b\nc", "a b c") == 1.0
    assert similarity("a b c", "x y z") == 0.0
    assert similarity("", "") == 1.0 and similarity("a", "") == 0.0
    s = similarity("the cat sat on the mat", "the cat sat on a mat")
    assert 0.5 < s < 1.0 and s == similarity("the cat sat on a mat", "the cat sat on the mat")


def test_similarity_sees_word_order_and_respects_the_cap() -> None:
    """Bigrams make reordered words less similar than identical ones; text past the cap is
    ignored."""
    assert similarity("a b c d", "d c b a") < 1.0
    assert similarity("a b c d", "d c b a") == 4 / 7  # 4 unigrams of 4+3 n-grams shared
    assert similarity("same start" + " x" * 100, "same start" + " y" * 100, max_chars=10) == 1.0


def test_first_divergence() -> None:
    """The common prefix length, including when one text is a prefix of the other."""
    assert first_divergence("hello world", "hello there") == 6
    assert first_divergence("abc", "abc") == 3
    assert first_divergence("abc", "abcdef") == 3
    assert first_divergence("", "x") == 0
    long = "y" * 10_000
    assert first_divergence(long + "a", long + "b") == 10_000


def test_json_validity() -> None:
    """One JSON document is valid; truncated or fenced JSON is not."""
    assert json_valid('{"a": [1, 2]}') and json_valid("3")
    assert not json_valid('{"a": [1, 2]')
    assert not json_valid('```json\n{"a": 1}\n```')
    assert not json_valid("")


def _calls(*calls: tuple[str, object]) -> str:
    return json.dumps([{"name": n, "arguments": a} for n, a in calls])


def test_tool_calls_compare_names_and_parsed_arguments() -> None:
    """Arguments compare as parsed JSON (key order and spacing do not matter); names, count and
    order do; unreadable records compare as unknown."""
    a = _calls(("get", '{"city": "Oslo", "unit": "C"}'))
    assert tool_calls_equal(a, _calls(("get", '{ "unit":"C","city":"Oslo" }')))
    assert tool_calls_equal(a, _calls(("get", {"unit": "C", "city": "Oslo"})))
    assert not tool_calls_equal(a, _calls(("put", '{"city": "Oslo", "unit": "C"}')))
    assert not tool_calls_equal(a, _calls(("get", '{"city": "Bergen", "unit": "C"}')))
    assert not tool_calls_equal(a, None)
    assert tool_calls_equal(None, None)
    assert tool_calls_equal(_calls(("get", "xxh3:ab")), _calls(("get", "xxh3:ab")))
    assert tool_calls_equal(a, "not json") is None
