"""Plain records that cross the package boundaries: what the gateway hands to storage and what
storage hands back. msgspec Structs, no SQLAlchemy, no IO.

Times are epoch seconds (float) for wall-clock instants and seconds (float) for durations, so a
million rows load without datetime parsing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal

import msgspec
import xxhash

from domain.errors import UsageError
from domain.observation import Measured, Outcome, Quantity

Arm = Literal["production", "candidate"]


class ExchangeRecord(msgspec.Struct, kw_only=True):
    """One sampled production request (mirrored to at least one candidate)."""

    id: str
    received_at: float
    route: str
    model: str | None = None
    stream: bool = False
    temperature: float | None = None
    session_key: str | None = None  # hex hash of the session key, never the raw value
    turn_index: int = 0  # number of assistant messages in the request
    request_hash: str = ""  # hex xxh3_128 of the body
    json_requested: bool = False  # response_format asked for JSON
    tools_requested: bool = False
    replica: str = ""
    # Candidates whose ring accepted the copy: a pair is "lost" only for these.
    targets: tuple[str, ...] = ()
    prompt_tokens: int | None = None  # production's, when the engine reported usage
    cached_tokens: int | None = None


class ObservationRecord(Measured, kw_only=True):
    """One arm's answer to one exchange: who answered, and what the meter measured (the
    `Measured` fields, declared once in domain.observation). The table's columns are generated
    from this declaration (storage.models)."""

    exchange_id: Annotated[str, Quantity(length=36)]
    endpoint: Annotated[str, Quantity(length=63)]
    arm: Annotated[Arm, Quantity(length=16)]
    started_at: Annotated[float, Quantity("epoch s")]
    output_text: str | None = None  # domain.observation.kept_text; None when store_text=false
    tool_calls: str | None = None  # JSON: [{"name": ..., "arguments": ...}]


# --- the ramp's evidence: how one live request of an open rollout went ------------------------


class RolloutRequest(Outcome, kw_only=True):
    """What a worker hands the mirror process per request of an open rollout (a RAMP frame):
    the outcome, the rollout's `generation` (`gateway.rollout.arms.Split.generation`), the
    `arm` (0 production, 1 candidate), the `session` (the unsalted xxh3_64 of the session key
    as a signed int64) and `at`, the end (epoch s). Never a body."""

    generation: Annotated[int, Quantity(bits=64)]
    arm: Annotated[int, Quantity(bits=8)]
    session: Annotated[int, Quantity(bits=64)]
    at: Annotated[float, Quantity("epoch s")]


class RolloutRecord(RolloutRequest, kw_only=True):
    """One live request of an open rollout, as the ramp's evidence stores it: the worker's
    `RolloutRequest`, its 1-based `turn` among the session's requests of this rollout and the
    host's `replica` (both filled in by the mirror process)."""

    turn: int
    replica: Annotated[str, Quantity(length=64)] = ""


class PromotionRecord(msgspec.Struct, kw_only=True):
    """An audit row: a promotion or a rollback."""

    id: int
    action: Literal["promote", "rollback"]
    from_endpoint: str | None
    to_endpoint: str
    actor: str
    reason: str
    forced: bool
    verdict: str | None
    report_snapshot: str | None  # the JSON report at the time of the decision
    at: float


# --- the ramp: a rollout per candidate ----------------------------------------------------------

RolloutState = Literal["running", "paused", "completed", "rolled_back", "aborted"]
RolloutEventKind = Literal["start", "advance", "pause", "resume", "rollback", "abort", "complete"]
# A rollout in one of these is open: at most one per live endpoint (the database enforces it).
OPEN_STATES: Final[frozenset[RolloutState]] = frozenset({"running", "paused"})
# Percent of NEW sessions sent to the candidate at each step.
DEFAULT_STEPS: Final[tuple[float, ...]] = (1.0, 5.0, 25.0, 50.0, 100.0)
MAX_STEPS: Final = 20


class RolloutEvent(msgspec.Struct, kw_only=True):
    """One change of a rollout, as stored: who moved the weight from where to where, and on
    what evidence (a test's result, a tripped guard's reading)."""

    at: float
    kind: RolloutEventKind
    from_weight: float
    to_weight: float
    step: int
    actor: str
    reason: str
    evidence: dict[str, Any] | None = None


class Rollout(msgspec.Struct, kw_only=True):
    """A candidate ramped on live traffic: `weight` percent of new sessions go to it, `steps[step]`
    while running. `generation` grows by one on every change (and across rollouts), so a replica
    applies a state only if it is newer than the one it holds. `salt` (hex, random per rollout)
    salts the session hash that picks the arm, so each rollout draws its own sessions."""

    id: int
    candidate: str
    live: str  # the live endpoint's name when the rollout started
    state: RolloutState
    weight: float
    step: int
    steps: list[float]
    min_step_s: float
    salt: str
    generation: int
    started_at: float
    step_started_at: float
    updated_at: float
    events: list[RolloutEvent] = msgspec.field(default_factory=list)

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES


def check_steps(steps: Sequence[float]) -> None:
    """Raise UsageError naming the problem unless `steps` is a usable ramp: 1 to MAX_STEPS
    percents, each in (0, 100], strictly increasing, the last 100."""
    if not steps:
        raise UsageError("rollout steps: empty; give percents ending at 100, e.g. 1,5,25,50,100")
    if len(steps) > MAX_STEPS:
        raise UsageError(f"rollout steps: {len(steps)} steps, more than {MAX_STEPS}")
    for s in steps:
        if not (isinstance(s, int | float) and math.isfinite(s) and 0 < s <= 100):
            raise UsageError(f"rollout steps: {s!r} is outside (0, 100]")
    for a, b in itertools.pairwise(steps):
        if b <= a:
            raise UsageError(f"rollout steps: not strictly increasing ({a:g} then {b:g})")
    if steps[-1] != 100:
        raise UsageError(f"rollout steps: the last step is {steps[-1]:g}, not 100")


# --- the grader of a model upgrade: one verdict per row (docs/grading.md) -----------------------

# A grading's outcome (graded … over_cap: one row per order), or why a complete pair was not
# graded at all (not_sampled … stopped: one row per pair, attempts 0), so every complete pair
# is accounted for across replicas (docs/grading.md, "Every complete pair").
GradingOutcome = Literal[
    "graded",
    "unparseable",
    "failed",
    "over_cap",
    "not_sampled",  # outside the grader's rate
    "queue_full",  # grading_max_pending reached
    "no_answer",  # an answer failed, was empty, or did not arrive in time (error_kind says)
    "stopped",  # the mirror stopped before grading it
]
# What the grader preferred, mapped back from the labels A/B it saw.
GradingWinner = Literal["candidate", "reference", "tie"]
# The outcomes of a grading in one order (the statistics read these rows only).
GRADING_OUTCOMES: Final[tuple[GradingOutcome, ...]] = (
    "graded",
    "unparseable",
    "failed",
    "over_cap",
)
# The outcomes of a pair never sent to the grader.
NOT_GRADED_OUTCOMES: Final[tuple[GradingOutcome, ...]] = (
    "not_sampled",
    "queue_full",
    "no_answer",
    "stopped",
)


class GradingRecord(msgspec.Struct, kw_only=True):
    """One grading of one pair in one order: the candidate's answer against the reference arm's
    (production's, or the control's for the grader's own A/A), shown to the grader as A and B.
    The `gradings` table's columns are generated from this declaration (storage.models)."""

    exchange_id: Annotated[str, Quantity(length=36)]
    endpoint: Annotated[str, Quantity(length=63)]  # the graded candidate (or the control)
    reference: Annotated[str, Quantity(length=63)]  # the arm it was compared with
    graded_at: Annotated[float, Quantity("epoch s")]
    candidate_first: bool  # the candidate's answer was shown as A
    swapped: bool  # this is the second order of a pair graded both ways
    outcome: Annotated[GradingOutcome, Quantity(length=16)]
    # None unless outcome is graded.
    winner: Annotated[GradingWinner | None, Quantity(length=16)] = None
    # Lengths of the two answers in characters: a grader's length bias is measured on them
    # (tokens of two different models are not comparable).
    candidate_chars: Annotated[int, Quantity("chars")] = 0
    reference_chars: Annotated[int, Quantity("chars")] = 0
    prompt_tokens: Annotated[int, Quantity("tokens")] = 0
    completion_tokens: Annotated[int, Quantity("tokens")] = 0
    latency_s: Annotated[float | None, Quantity("s")] = None
    attempts: int = 1  # calls made: 2 when an unparseable answer was retried once
    error_kind: Annotated[str | None, Quantity(length=32)] = None


# --- people's labels of graded pairs (docs/grading.md, "People check the grader") -----------
#
# People's labels of graded pairs: which pairs are offered to people, what is kept for them, and
# one person's label (docs/grading.md, "People check the grader").
#
# A graded pair is kept for labelling iff its **unit** (the session's key hash when sampling by
# session, else the exchange id) hashes below the grader's `label_rate`: chosen when the pair is
# graded, uniformly at random over units, never by the grader's verdict or by a labeller, so the
# labelled set is a random sample of the graded units at every look. What is kept is exactly what
# the grader was shown (the conversation and both answers, bounded by `grading_max_chars`), for
# `label_retention_s` at most. Plain records and pure functions: no IO.

# Independent of the sampler's, the grader's, the order's and the swap's hashes.
LABEL_SALT: Final = b"canary-label\x00"
_SCALE: Final = float(2**64)

# What a person answered, mapped back to the arms ("skip": seen and not judged; counted).
LabelChoice = Literal["candidate", "reference", "tie", "skip"]
LABEL_CHOICES: Final[tuple[LabelChoice, ...]] = ("candidate", "reference", "tie", "skip")


def is_labelled(unit: str, rate: float) -> bool:
    """True iff the unit's graded pairs are kept for people (nested: kept at every higher rate)."""
    if rate <= 0.0:
        return False
    return xxhash.xxh3_64_intdigest(LABEL_SALT + unit.encode()) / _SCALE < rate


def label_score(choice: LabelChoice) -> float | None:
    """A label on the grader's scale: +1 the candidate preferred, 0 tie, -1 the reference."""
    return {"candidate": 1.0, "reference": -1.0, "tie": 0.0}.get(choice)


class LabelItem(msgspec.Struct, kw_only=True):
    """One graded pair kept for people: the text the grader was shown (bounded by the mirror's
    `grading_max_chars`, which counts what it cut) and the unit it belongs to. The
    `label_items` table's columns are generated from this declaration (storage.models)."""

    exchange_id: Annotated[str, Quantity(length=36)]
    endpoint: Annotated[str, Quantity(length=63)]  # the graded candidate
    reference: Annotated[str, Quantity(length=63)]
    unit: Annotated[str, Quantity(length=64)]  # session key hash, or the exchange id
    graded_at: Annotated[float, Quantity("epoch s")]
    conversation: str
    candidate_answer: str
    reference_answer: str


class LabelRecord(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One person's label of one pair: who (the token's name), when, the order they were shown
    (`candidate_first`: the candidate's answer was A) and what they chose. The `labels` table's
    columns are generated from this declaration; one label per (pair, labeller). Also one line
    of the JSONL export."""

    exchange_id: Annotated[str, Quantity(length=36)]
    endpoint: Annotated[str, Quantity(length=63)]
    labeller: Annotated[str, Quantity(length=64)]
    labelled_at: Annotated[float, Quantity("epoch s")]
    candidate_first: bool
    choice: Annotated[LabelChoice, Quantity(length=16)]
