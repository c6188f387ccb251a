"""The evaluators' input types: one pair as Structs, and many pairs as compact columns.

`Pair` / `ArmObs` are the readable row form (tests, simulations, small tools). `PairSet` is what
every evaluator reads: numpy columns in arrival order, about 200 bytes per pair, so a million
pairs fit in memory without a million Python objects. Text never reaches a PairSet: the
text-derived features (exact match, first divergence, similarity, JSON validity, tool-call
equality) are computed while loading, by `evaluators.pairs.columns`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar

import msgspec
import numpy as np
import xxhash
from numpy.typing import NDArray

from domain.observation import PER_PAIR, Measured
from domain.outcomes import ERROR_KINDS, NOT_THE_ENDPOINT, ErrorKind

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]
I8 = NDArray[np.int8]
I16 = NDArray[np.int16]
I64 = NDArray[np.int64]
B = NDArray[np.bool_]

# Given how many rows (or exchanges) a load will go through, returns a callback for each part read
# (or None) and a function that closes the display: the CLI's progress bar plugs in here.
ProgressFactory = Callable[[int], tuple[Callable[[int], None] | None, Callable[[], None]]]

# Failure classes, coded in ArmColumns.error (0 = answered OK).
TIMEOUT = ERROR_KINDS.index(ErrorKind.TIMEOUT)
# The gateway shut down or the client went away mid-request: not the endpoint failing.
NOT_ENDPOINT_CODES = tuple(sorted(ERROR_KINDS.index(k) for k in NOT_THE_ENDPOINT))
# Tri-state features (match, JSON validity, tool-call equality): -1 = not applicable / unknown.
UNKNOWN = -1


class Releasable(Protocol):
    def release(self) -> None: ...


class ArmObs(Measured, kw_only=True):
    """One arm's answer to one exchange: the measured fields (`domain.observation.Measured`)
    and what the evaluators read besides them. Defaults: an answered request."""

    status: int = 200  # the default here is an answered request (the declaration's is 0)
    started_at: float = 0.0
    output_text: str | None = None
    tool_calls: str | None = None  # JSON: [{"name": ..., "arguments": ...}]

    @property
    def ok(self) -> bool:
        return self.error_kind is None and 200 <= self.status < 300


class Pair(msgspec.Struct, kw_only=True):
    """One mirrored exchange: production's answer, the candidate's and the control's."""

    exchange_id: str
    received_at: float
    production: ArmObs
    candidate: ArmObs | None = None
    control: ArmObs | None = None
    session_key: str | None = None
    turn_index: int = 0
    temperature: float | None = None
    stream: bool = True
    json_requested: bool = False
    tools_requested: bool = False
    model: str | None = None
    replica: str = ""  # the gateway replica (host's mirror process) that stored the exchange


@functools.lru_cache(maxsize=256)  # a few distinct methods, read once per stored row
def counter_code(token_counter: str | None) -> int:
    """A stable code for how an arm's tokens were counted (0: not counted); the same string
    gives the same code in every load, so stored segments keep their meaning."""
    if not token_counter:
        return 0
    return int.from_bytes(xxhash.xxh3_64_digest(token_counter.encode()), "big", signed=True) or 1


def same_count(a: I64, b: I64) -> B:
    """Pairs whose two arms were counted, and by one method (their token values compare)."""
    out: B = (a != 0) & (a == b)
    return out


def _zeros(n: int, dtype: type[np.generic] | type[bool]) -> NDArray[Any]:
    # np.full, not np.zeros: calloc'd pages would be committed only as rows arrive, so memory
    # would creep up while loading; filled now, it is all taken up front and stays flat.
    return np.full(n, 0, dtype=dtype)


def _f32(n: int) -> F32:
    return np.full(n, np.nan, dtype=np.float32)


def _i8(n: int, fill: int = UNKNOWN) -> I8:
    return np.full(n, fill, dtype=np.int8)


@dataclass(slots=True)
class ArmColumns:
    """One arm's observations as columns; NaN (floats) or -1 (tri-states) where absent.

    Each per-pair quantity of `domain.observation.PER_PAIR` is a float32 column read by its own
    name (`arm.ttft_s`, `arm.output_tokens`), kept in `quantities`.
    """

    present: B
    ok: B
    status: I16
    error: I8
    # How `output_tokens` was counted, as a code (`counter_code` of `token_counter`; 0: not
    # counted). Two arms' token-derived values compare only where their codes are equal.
    counter: I64
    finish: I8
    json_valid: I8
    # The mirror's verdict on the answer's tool calls: its index in `domain.outcomes.TOOL_CHECKS`
    # (-1: not applicable or never checked).
    tool_check: I8
    quantities: dict[str, F32]

    @classmethod
    def empty(cls, n: int) -> ArmColumns:
        return cls(
            present=_zeros(n, bool),
            ok=_zeros(n, bool),
            status=_zeros(n, np.int16),
            error=_i8(n, 0),
            counter=_zeros(n, np.int64),
            finish=_i8(n, 0),
            json_valid=_i8(n),
            tool_check=_i8(n),
            quantities={name: _f32(n) for name in PER_PAIR},
        )

    def __getattr__(self, name: str) -> F32:
        """A per-pair quantity's column, by the name it is declared with."""
        try:
            return self.quantities[name]
        except KeyError:
            raise AttributeError(name) from None

    def resized(self, n: int) -> ArmColumns:
        """A copy with every column cut or grown (with absent values) to length n."""
        return _resized(self, n)

    def head(self, n: int) -> ArmColumns:
        """The first n rows, as views of these columns."""
        return _head(self, n)


@dataclass(slots=True)
class Comparison:
    """Text-derived agreement of one arm with production, per pair."""

    match: I8  # exact match of the output (by hash, else text)
    divergence: F32  # first differing character / production length, when they differ
    similarity: F32  # n-gram F1 on the similarity sample, NaN elsewhere
    tool_equal: I8  # tool calls equal (names and parsed arguments)

    @classmethod
    def empty(cls, n: int) -> Comparison:
        return cls(match=_i8(n), divergence=_f32(n), similarity=_f32(n), tool_equal=_i8(n))

    def resized(self, n: int) -> Comparison:
        """A copy with every column cut or grown (with absent values) to length n."""
        return _resized(self, n)

    def head(self, n: int) -> Comparison:
        """The first n rows, as views of these columns."""
        return _head(self, n)


@dataclass(slots=True)
class PairSet:
    """Aligned observations of production, one candidate and (optionally) the control.

    Rows are exchanges in arrival order (the order the sequential statistics consume them).
    A row whose candidate observation is missing is kept (`candidate.present` is False) and,
    unless it is younger than the candidate's timeout, counted in `lost`.
    """

    n: int
    received_at: F64
    turn: I16  # turn_index: 0 = first turn of a conversation
    temperature: F32  # NaN when the request did not say
    stream: B
    json_requested: B
    tools_requested: B
    session: NDArray[np.uint64]  # 64-bit prefix of the session hash; 0 = no session
    # The pair's session had turns handled by more than one gateway replica (a split session):
    # left out of the by-turn analysis (evaluators.pairs.load marks them).
    split: B
    model: I16  # index into `models`
    replica: I16  # index into `replicas`: the replica that stored the exchange
    # The exchange id's tail as a rank 0-255 (256: not hex): the pair is in the text-similarity
    # sample when its rank is below the sample's size (evaluators.pairs.columns.sample_size).
    sample_rank: NDArray[np.uint16]
    production: ArmColumns
    candidate: ArmColumns
    control: ArmColumns
    vs_candidate: Comparison
    vs_control: Comparison
    models: list[str] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)
    has_control: bool = False
    lost: int = 0
    pending: int = 0
    similarity_fraction: float = 1.0  # share of exchanges in the text-similarity sample
    # What the columns live in when they are not the heap's (evaluators.pairs.spill): its
    # `release()` drops the pages this process has touched.
    backing: Releasable | None = None

    @classmethod
    def empty(cls, n: int) -> PairSet:
        return cls(
            n=0,
            received_at=np.full(n, np.nan),
            turn=_zeros(n, np.int16),
            temperature=_f32(n),
            stream=_zeros(n, bool),
            json_requested=_zeros(n, bool),
            tools_requested=_zeros(n, bool),
            session=_zeros(n, np.uint64),
            split=_zeros(n, bool),
            model=_zeros(n, np.int16),
            replica=_zeros(n, np.int16),
            sample_rank=_zeros(n, np.uint16),
            production=ArmColumns.empty(n),
            candidate=ArmColumns.empty(n),
            control=ArmColumns.empty(n),
            vs_candidate=Comparison.empty(n),
            vs_control=Comparison.empty(n),
        )

    @property
    def capacity(self) -> int:
        return len(self.received_at)

    def resized(self, n: int) -> PairSet:
        """A copy whose columns hold exactly n rows (cuts spare capacity, or grows it)."""
        return _resized(self, n)

    def head(self, n: int) -> PairSet:
        """The first n rows (n ≤ capacity), as views of these columns: no copy."""
        return _head(self, n)

    def release(self) -> None:
        """Drop the resident pages of file-backed columns (a no-op on the heap's)."""
        if self.backing is not None:
            self.backing.release()

    def arm(self, name: str) -> ArmColumns:
        """The columns of "production", "candidate" or "control"."""
        arms = {"production": self.production, "candidate": self.candidate}
        arms["control"] = self.control
        return arms[name]

    @property
    def nbytes(self) -> int:
        """Memory held by the columns."""
        return _nbytes(self)


_Columns = TypeVar("_Columns", ArmColumns, Comparison, PairSet)


def _resized(obj: _Columns, n: int) -> _Columns:
    """Cut or grow every array column of a columns dataclass to n rows, in a fresh object."""
    fresh = type(obj).empty(n)
    for f in fields(obj):
        old = getattr(obj, f.name)
        if isinstance(old, np.ndarray):
            k = min(n, len(old))
            getattr(fresh, f.name)[:k] = old[:k]
        elif isinstance(old, dict):
            for name, column in old.items():
                k = min(n, len(column))
                getattr(fresh, f.name)[name][:k] = column[:k]
        elif isinstance(old, ArmColumns | Comparison):
            setattr(fresh, f.name, old.resized(n))
        elif isinstance(old, list):
            setattr(fresh, f.name, list(old))
        elif f.name == "backing":  # the copy is on the heap
            continue
        else:
            setattr(fresh, f.name, old)
    if isinstance(fresh, PairSet):
        fresh.n = min(fresh.n, n)
    return fresh


def _head(obj: _Columns, n: int) -> _Columns:
    """Views of every array column's first n rows, in a fresh object sharing the rest."""
    parts: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, np.ndarray):
            value = value[:n]
        elif isinstance(value, dict):
            value = {name: column[:n] for name, column in value.items()}
        elif isinstance(value, ArmColumns | Comparison):
            value = value.head(n)
        elif isinstance(value, list):
            value = list(value)
        parts[f.name] = value
    fresh = type(obj)(**parts)
    if isinstance(fresh, PairSet):
        fresh.n = min(fresh.n, n)
    return fresh


def _nbytes(obj: ArmColumns | Comparison | PairSet) -> int:
    total = 0
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, np.ndarray):
            total += value.nbytes
        elif isinstance(value, dict):
            total += sum(column.nbytes for column in value.values())
        elif isinstance(value, ArmColumns | Comparison):
            total += _nbytes(value)
    return total
