"""The observation, declared once: what one arm's answer measured, field by field.

`Measured` holds every quantity the gateway measures about one response (the meter fills all
but `queue_wait_s`, which the mirror lane adds). Each field says its unit, whether the
evaluators keep it as a per-pair column (`per_pair`), and for strings the column length. The
rest of the code reads this declaration instead of typing the fields again:

- `gateway.server.meter.MeterResult` and `domain.records.ObservationRecord` subclass it, so
  the meter's result becomes a record by one conversion (`gateway.mirror.replay.observe`'s
  builder, generated from `MEASURED`);
- `storage.models.ObservationRow`'s columns are generated from `ObservationRecord`
  (`describe`), and the migrations' schema is compared with them by a test;
- the evaluators' row layout (`evaluators.pairs.columns.ARM_FIELDS`), their `ArmObs` and the
  float columns of `ArmColumns` come from `PER_PAIR`.

The names are the same everywhere (`ttft_s` in the meter, the table, the evaluators' columns).
Output text is cut to the stored length here and nowhere else (`kept_text`).

Adding a measured per-pair quantity: a field here, the meter (or lane) code that measures it,
the metric that reads it, and an Alembic revision adding the column (docs/add-a-metric.md).
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Final, Literal, Union

import msgspec

__all__ = [
    "PER_PAIR",
    "Field",
    "Measured",
    "Outcome",
    "Quantity",
    "describe",
    "kept_text",
]


class Quantity(msgspec.Struct, frozen=True):
    """What a field of an observation is, besides its Python type."""

    unit: str = ""  # "s", "tokens", ... ("" for codes and text)
    per_pair: bool = False  # an evaluator column (float32, NaN where absent)
    length: int = 0  # strings: the column's length (0: unbounded text)
    # Integers: their width in bits where it is not the default 32 (64: BIGINT; 8 or 16: an
    # unsigned byte or short where packed, domain.records.RolloutRequest).
    bits: int = 0


_S: Final = Quantity("s")
_S_PAIR: Final = Quantity("s", per_pair=True)
_TOKENS_PAIR: Final = Quantity("tokens", per_pair=True)
_NATS_PAIR: Final = Quantity("nats/token", per_pair=True)


class Outcome(msgspec.Struct, kw_only=True):
    """How one request went, declared once for the mirror's observation (`Measured` extends
    it) and the ramp's evidence (`domain.records.RolloutRequest` extends it): the status, the error
    kind, TTFT, E2E and whether the answer was delivered whole. Units and the missing-value rule
    are the observation's: None when absent, NULL in a table; NaN only where None cannot be
    (inside a packed RAMP frame, in the evaluators' and the ramp step's numpy arrays).

    From this one declaration the ramp derives the RAMP frame's packed layout
    (`gateway.mirror.channel.frames`), the `rollout_requests` columns
    (`storage.models.RolloutRequestRow`), the writer's row (`storage.writer`) and the step's
    per-request float arrays (`storage.reports.rollout.ROLLOUT_COLUMNS`); the mirror derives the
    `observations` columns and the evaluators' per-pair columns. tests/test_rollout_evidence.py
    fails when one of these fields is declared a second time, and walks adding a quantity (one
    field here, the code that fills it, an Alembic revision).
    """

    status: Annotated[int, Quantity(bits=16)] = 0  # the HTTP status; 0: no response arrived
    # None when ok; one of domain.outcomes.ERROR_KINDS (an unknown one travels as `other`).
    error_kind: Annotated[str | None, Quantity(length=32)] = None
    # First chunk carrying a token (content, text or tool call), from the request sent upstream.
    ttft_s: Annotated[float | None, _S_PAIR] = None
    # Last token-carrying chunk (SSE) or last byte (plain JSON).
    e2e_s: Annotated[float | None, _S_PAIR] = None
    finished: bool = False  # the stream's final event (or a whole plain answer) was delivered


class Measured(Outcome, kw_only=True):
    """The measured quantities of one response, by vLLM `bench serve` conventions (docs/metrics.md).

    Durations are seconds from the moment the request was sent upstream.
    """

    # Time the copy spent in the candidate's ring buffer (the mirror lane's; None from the meter).
    queue_wait_s: Annotated[float | None, _S_PAIR] = None
    # (e2e - ttft) / (output_tokens - 1) with the *counted* tokens, output_tokens > 1: set by
    # the mirror plane's token counter (gateway/mirror/replay/tokens.py), never by the meter,
    # since an SSE event is not a token. None when not counted (`output_tokens` None) or when
    # the span was below the clock's resolution (domain.timing says which).
    tpot_s: Annotated[float | None, _S_PAIR] = None
    # Inter-event latency: the gaps between SSE events that carried tokens (token events - 1; a
    # read's gap spread over the events it carried). A per-token figure only where every event
    # carried one token: vLLM packs several tokens into one event when its engine runs ahead of
    # its API server's stream (see `tokens_per_event` in the report).
    inter_event_count: Annotated[int, Quantity("gaps")] = 0
    inter_event_mean_s: Annotated[float | None, _S] = None
    inter_event_p50_s: Annotated[float | None, _S_PAIR] = None
    inter_event_p99_s: Annotated[float | None, _S_PAIR] = None
    inter_event_max_s: Annotated[float | None, _S] = None
    # Output tokens *counted* from the answer by one tokenizer for every arm (`token_counter`
    # names it): its text's plus each tool call's name and arguments; None when it could not be
    # counted (not stored, cut at store_text_max_chars, no tokenizer reachable). The only count
    # that gates.
    output_tokens: Annotated[int | None, _TOKENS_PAIR] = None
    # How `output_tokens` was counted: "tokenize:<endpoint>" (that engine's /tokenize) or
    # "local:<sha256 prefix of the tokenizer.json>"; None: not counted. Two arms' counts are
    # compared only when this is equal on both.
    token_counter: Annotated[str | None, Quantity(length=128)] = None
    # What the engine reported (`usage.completion_tokens`): information, never a stand-in for
    # the other arm's count (it counts generated ids such as EOS that the text does not show).
    usage_tokens: Annotated[int | None, _TOKENS_PAIR] = None
    # SSE events that carried tokens (streamed answers only; None for a plain JSON answer).
    token_events: Annotated[int | None, Quantity("events", per_pair=True)] = None
    prompt_tokens: Annotated[int | None, _TOKENS_PAIR] = None
    cached_tokens: Annotated[int | None, _TOKENS_PAIR] = None
    finish_reason: Annotated[str | None, Quantity(length=32)] = None
    # Hex xxh3_128 of the full output text (all of it, whatever was kept).
    output_hash: Annotated[str | None, Quantity(length=32)] = None
    text_truncated: bool = False  # the kept text is shorter than the output
    # Scoring (gateway/mirror/scoring/forced.py): this arm's engine scored production's answer on
    # the
    # same conversation (teacher forcing with prompt logprobs). None: not scored. Production is
    # never scored. `score_tokens` = 0 with no scores: the engine refused the parameters
    # (scoring unsupported). `score_logprob`: mean log-likelihood of production's tokens;
    # `score_top1`: share of positions whose top-1 token is production's; `score_kl`: top-k
    # estimate of KL(control || this arm) per token, on a candidate scored beside a control.
    score_tokens: Annotated[int | None, _TOKENS_PAIR] = None
    score_logprob: Annotated[float | None, _NATS_PAIR] = None
    score_top1: Annotated[float | None, Quantity("share", per_pair=True)] = None
    score_kl: Annotated[float | None, _NATS_PAIR] = None
    # Tool-call validity (gateway/mirror/toolcalls), set by the mirror process for every arm
    # against the request's declared `tools`, `tool_choice` and `parallel_tool_calls`, never by
    # the meter: None when it does not apply (no tool declared and no call made, or the answer
    # failed); else a `domain.outcomes.ToolCheck` value ("valid", or the first problem found).
    tool_check: Annotated[str | None, Quantity(length=24)] = None
    # The first problem, value-free ("call 0 get_weather: /unit: enum"): never an argument's
    # value, which may hold a user's data. None when valid or not applicable.
    tool_error: Annotated[str | None, Quantity(length=160)] = None


class Field(msgspec.Struct, frozen=True):
    """One field of a declared Struct: its name, base type, whether it may be None, and what."""

    name: str
    type: type[Any]  # float, int, bool or str (a Literal of strings is str)
    nullable: bool
    quantity: Quantity


def _field(name: str, hint: Any) -> Field:
    quantity = Quantity()
    if typing.get_origin(hint) is Annotated:
        found = [m for m in hint.__metadata__ if isinstance(m, Quantity)]
        quantity = found[0] if found else quantity
        hint = hint.__origin__
    args: tuple[Any, ...] = (hint,)
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = typing.get_args(hint)
    nullable = type(None) in args
    args = tuple(a for a in args if a is not type(None))
    if len(args) != 1:
        raise TypeError(f"{name}: one type besides None expected, got {args}")
    base = args[0]
    if typing.get_origin(base) is Literal:
        base = str
    if base not in (float, int, bool, str):
        raise TypeError(f"{name}: {base!r} is not float, int, bool or str")
    return Field(name=name, type=base, nullable=nullable, quantity=quantity)


def describe(struct: type[msgspec.Struct]) -> tuple[Field, ...]:
    """The declared fields of `struct`, in order (base class fields first)."""
    hints = typing.get_type_hints(struct, include_extras=True)
    return tuple(_field(f.name, hints[f.name]) for f in msgspec.structs.fields(struct))


MEASURED: Final = tuple(f.name for f in describe(Measured))
# The per-pair quantities: the float columns of each arm in the evaluators' PairSet.
PER_PAIR: Final = tuple(f.name for f in describe(Measured) if f.quantity.per_pair)


def kept_text(
    text: str | None, truncated: bool, *, store_text: bool, max_chars: int
) -> tuple[str | None, bool]:
    """(the output text as stored, whether it is cut): None when text is not stored, at most
    `max_chars` characters otherwise. The only place stored text is cut."""
    if not store_text or text is None:
        return None, truncated
    if len(text) > max_chars:
        return text[:max_chars], True
    return text, truncated
