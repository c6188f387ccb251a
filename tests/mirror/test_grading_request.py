"""The grader's request and answer (gateway.mirror.grading.request): deterministic nested
sampling and order, a blind prompt with both answers, the JSON-schema response_format, and a
parse that never guesses."""

from __future__ import annotations

import json

import pytest

from domain.endpoint import GraderSpec
from gateway.mirror.grading import request as r

SPEC = GraderSpec(url="http://127.0.0.1:9", model="judge")
IDS = [f"{i:032x}" for i in range(20_000)]


def test_rate_is_deterministic_and_nested() -> None:
    """A pair graded at rate 0.1 is graded at 0.3, and about the rate's share is graded."""
    low = {i for i in IDS if r.is_graded(i, 0.1)}
    high = {i for i in IDS if r.is_graded(i, 0.3)}
    assert low <= high
    assert abs(len(low) / len(IDS) - 0.1) < 0.01 and abs(len(high) / len(IDS) - 0.3) < 0.015
    assert all(r.is_graded(i, 1.0) for i in IDS[:100])


def test_order_is_half_each_way_and_independent_of_the_rate() -> None:
    """The candidate is shown first for about half the pairs, graded or not, and a swapped pair
    is graded in both orders."""
    first = [r.candidate_first(i) for i in IDS]
    assert abs(sum(first) / len(IDS) - 0.5) < 0.01
    graded = [i for i in IDS if r.is_graded(i, 0.2)]
    assert abs(sum(r.candidate_first(i) for i in graded) / len(graded) - 0.5) < 0.03
    swapped = [i for i in IDS if r.is_swapped(i, 0.25)]
    assert abs(len(swapped) / len(IDS) - 0.25) < 0.01
    for i in swapped[:50]:
        (a, sa), (b, sb) = r.orders(i, 0.25)
        assert a != b and not sa and sb
    assert len(r.orders(next(i for i in IDS if not r.is_swapped(i, 0.25)), 0.25)) == 1


def test_body_is_blind_with_both_answers_in_order_and_a_json_schema() -> None:
    """The grader sees the conversation and both answers labelled A and B in the order asked,
    never the arms' names, at temperature 0 with the verdict's JSON schema."""
    conv = r.conversation_text({"messages": [{"role": "user", "content": "2+2?"}]}, 1000)
    body = json.loads(r.grader_body(SPEC, conv, "four", "4", candidate_shown_first=False))
    text = body["messages"][0]["content"]
    assert text.index("[Answer A]\n4") < text.index("[Answer B]\nfour")
    assert "user: 2+2?" in text and "candidate" not in text and "production" not in text
    assert body["model"] == "judge" and body["temperature"] == 0
    schema = body["response_format"]["json_schema"]["schema"]
    assert body["response_format"]["type"] == "json_schema"
    assert schema["properties"]["winner"]["enum"] == ["A", "B", "tie"]


def test_custom_template_fills_placeholders_and_keeps_other_braces() -> None:
    """A custom prompt's placeholders are filled once (an answer containing {answer_b} is not a
    template) and other braces, such as quoted JSON, are kept."""
    spec = GraderSpec(
        url="http://127.0.0.1:9",
        model="judge",
        prompt='Q: {conversation}\nA: {answer_a}\nB: {answer_b}\nsay {"winner": "A"}',
    )
    body = json.loads(r.grader_body(spec, "hi", "x {answer_b}", "y", candidate_shown_first=True))
    assert body["messages"][0]["content"] == 'Q: hi\nA: x {answer_b}\nB: y\nsay {"winner": "A"}'


def _completion(content: object, usage: bool = True) -> bytes:
    body: dict[str, object] = {"choices": [{"message": {"role": "assistant", "content": content}}]}
    if usage:
        body["usage"] = {"prompt_tokens": 120, "completion_tokens": 7}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("content", "label"),
    [
        ('{"winner": "A"}', "A"),
        (' {"winner":"tie"}\n', "tie"),
        ('{"winner": "B"}', "B"),
        ('{"winner": "C"}', None),
        ('{"winner": "A", "why": "better"}', None),
        ("A is better", None),
        ('```json\n{"winner": "A"}\n```', None),
        ("", None),
        (None, None),
    ],
)
def test_parse_never_guesses(content: object, label: str | None) -> None:
    """Exactly the schema's object is a verdict; prose, fences, extra keys or another label are
    unparseable, with the tokens still counted."""
    got = r.parse_answer(_completion(content))
    assert got.label == label
    assert (got.prompt_tokens, got.completion_tokens) == (120, 7)


def test_parse_of_a_body_that_is_not_a_completion() -> None:
    """Garbage, an error object or no choices are unparseable with no tokens counted."""
    for body in (b"<html>", b'{"error": {"message": "x"}}', b'{"choices": []}'):
        assert r.parse_answer(body).label is None


def test_winner_maps_labels_back_to_arms() -> None:
    """A means the candidate when it was shown first, production otherwise; tie is tie."""
    assert r.winner_of("A", True) == "candidate" and r.winner_of("A", False) == "reference"
    assert r.winner_of("B", True) == "reference" and r.winner_of("B", False) == "candidate"
    assert r.winner_of("tie", True) == "tie"
