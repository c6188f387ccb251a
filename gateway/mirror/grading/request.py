"""The grader's request and answer, pure: which pairs are graded, in which order, what the grader
is shown, and what its answer says.

A pair is graded iff `xxh3_64(GRADE_SALT + exchange id) / 2**64 < rate` (nested: a pair graded at
rate r is graded at every rate above r), shown with the candidate's answer first iff one bit of
another hash is set (half each way), and graded in both orders iff a third hash falls below
`swap_rate`. The grader sees the user's conversation and two answers labelled A and B (their
text and their calls, as `prompt` writes them), never which arm gave which, and must answer
`{"winner": "A" | "B" | "tie"}` through `response_format` (`json_schema`, strict): anything else
is unparseable, never guessed. Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, NamedTuple

import msgspec
import xxhash

from domain.endpoint import GraderSpec
from domain.records import GradingWinner
from gateway.mirror.grading.prompt import conversation_text

__all__ = [
    "DEFAULT_PROMPT",
    "GRADE_SALT",
    "Answer",
    "Label",
    "candidate_first",
    "conversation_text",
    "grader_body",
    "is_graded",
    "is_swapped",
    "orders",
    "parse_answer",
    "winner_of",
]

Label = Literal["A", "B", "tie"]
# Salts of the three decisions: independent of the sampler's hash and of each other.
GRADE_SALT: Final = b"canary-grade\x00"
_ORDER_SALT: Final = b"canary-grade-order\x00"
_SWAP_SALT: Final = b"canary-grade-swap\x00"
_SCALE: Final = float(2**64)

# The default rubric (docs/grading.md quotes it): what the grader is asked to weigh, that length
# is not merit (graders prefer longer answers; arXiv 2404.04475), and what a better call is (an
# agent turn: the answer may be a call, shown as gateway.mirror.grading.prompt writes it).
DEFAULT_PROMPT: Final = (
    "You are comparing two assistant answers to the same conversation. Judge which answer "
    "serves the user better: it is helpful, it is correct, and it follows the user's "
    "instructions. Length is not merit: a longer answer is better only if what it adds is "
    "needed. An answer may call tools instead of, or besides, answering in text; each call is "
    "shown as [call] followed by the tool's name and its arguments. A better call uses the "
    "right tool with the right arguments, and calls a tool only when a call is needed; when "
    "no call is needed, an answer in text is better than a call. The order of the answers "
    "means nothing. If neither is better, answer tie.\n\n"
    "[Conversation]\n{conversation}\n\n[Answer A]\n{answer_a}\n\n[Answer B]\n{answer_b}\n\n"
    'Reply with a JSON object only: {{"winner": "A"}}, {{"winner": "B"}} or '
    '{{"winner": "tie"}}.'
)
# The JSON schema of the answer, sent as `response_format` (vLLM's structured outputs).
ANSWER_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"winner": {"type": "string", "enum": ["A", "B", "tie"]}},
    "required": ["winner"],
    "additionalProperties": False,
}
RESPONSE_FORMAT: Final[dict[str, Any]] = {
    "type": "json_schema",
    "json_schema": {"name": "pairwise_verdict", "schema": ANSWER_SCHEMA, "strict": True},
}
# Enough for the JSON object (about ten tokens) with room for a grader that pads it.
MAX_ANSWER_TOKENS: Final = 32
_encode = msgspec.json.Encoder().encode


class _Verdict(msgspec.Struct, forbid_unknown_fields=True):
    winner: Label


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Completion(msgspec.Struct):
    choices: list[_Choice]
    usage: _Usage | None = None


_completion = msgspec.json.Decoder(_Completion).decode
_verdict = msgspec.json.Decoder(_Verdict).decode


def _unit(salt: bytes, exchange_id: str) -> float:
    return xxhash.xxh3_64_intdigest(salt + exchange_id.encode()) / _SCALE


def is_graded(exchange_id: str, rate: float) -> bool:
    """Whether a complete pair is graded at `rate` (deterministic, nested in the rate)."""
    return _unit(GRADE_SALT, exchange_id) < rate


def candidate_first(exchange_id: str) -> bool:
    """Whether the candidate's answer is shown as A in the pair's first grading."""
    return _unit(_ORDER_SALT, exchange_id) < 0.5


def is_swapped(exchange_id: str, swap_rate: float) -> bool:
    """Whether the pair is graded in the other order too."""
    return _unit(_SWAP_SALT, exchange_id) < swap_rate


def grader_body(
    spec: GraderSpec,
    conversation: str,
    candidate_answer: str,
    reference_answer: str,
    *,
    candidate_shown_first: bool,
) -> bytes:
    """The chat completion request shown to the grader: the prompt template filled in with the
    two answers in the given order, temperature 0, the answer's JSON schema as
    `response_format`."""
    first, second = (
        (candidate_answer, reference_answer)
        if candidate_shown_first
        else (reference_answer, candidate_answer)
    )
    template = spec.prompt or DEFAULT_PROMPT
    prompt = _fill(template, conversation=conversation, answer_a=first, answer_b=second)
    return _encode(
        {
            "model": spec.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": MAX_ANSWER_TOKENS,
            "response_format": RESPONSE_FORMAT,
        }
    )


def _fill(template: str, **values: str) -> str:
    """`template` with {name} placeholders replaced and {{ }} unescaped; any other brace is
    kept as it is (a custom prompt may quote JSON), and a value is never read as a template."""
    out: list[str] = []
    i = 0
    while i < len(template):
        if template.startswith("{{", i) or template.startswith("}}", i):
            out.append(template[i])
            i += 2
            continue
        if template[i] == "{":
            end = template.find("}", i)
            name = template[i + 1 : end] if end > 0 else ""
            if name in values:
                out.append(values[name])
                i = end + 1
                continue
        out.append(template[i])
        i += 1
    return "".join(out)


class Answer(NamedTuple):
    """What one grader answer says: its label (None: unparseable) and the tokens it cost."""

    label: Label | None
    prompt_tokens: int
    completion_tokens: int


def parse_answer(body: bytes) -> Answer:
    """The grader's verdict from a chat completion body: exactly `{"winner": "A"|"B"|"tie"}` as
    the message content (surrounding whitespace allowed), else label None. Never guessed from
    prose; a body that is not a chat completion at all is unparseable too."""
    try:
        completion = _completion(body)
    except msgspec.DecodeError:
        return Answer(None, 0, 0)
    usage = completion.usage or _Usage()
    tokens = (max(usage.prompt_tokens, 0), max(usage.completion_tokens, 0))
    content = completion.choices[0].message.content if completion.choices else None
    if content is None:
        return Answer(None, *tokens)
    try:
        return Answer(_verdict(content.strip().encode()).winner, *tokens)
    except msgspec.DecodeError:
        return Answer(None, *tokens)


def winner_of(label: Label, candidate_shown_first: bool) -> GradingWinner:
    """The label mapped back to the arm it stood for."""
    if label == "tie":
        return "tie"
    return "candidate" if (label == "A") == candidate_shown_first else "reference"


def orders(exchange_id: str, swap_rate: float) -> Sequence[tuple[bool, bool]]:
    """(candidate shown first, swapped) of each grading of a graded pair: one, or both orders."""
    first = candidate_first(exchange_id)
    if is_swapped(exchange_id, swap_rate):
        return ((first, False), (not first, True))
    return ((first, False),)
