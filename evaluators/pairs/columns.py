"""Rows of (exchange, production, candidate, control) fields into a compact `PairSet`.

One builder serves both sources: `evaluators.pairs.load` feeds it database rows batch by batch, and
`pairset_from_pairs` feeds it `Pair` Structs (tests, simulations). Columns are preallocated and
grown by doubling; each batch costs a few vectorized conversions, and Python-level work only
for the few rows whose texts must be compared. Text is looked at here and nowhere else: it is
reduced to per-pair features and dropped.

Row layout: PAIR_FIELDS, then ARM_FIELDS for each of ARMS, then MATCH_FIELDS (whether the
candidate's / control's output hash equals production's: 1, 0, or None when unknown).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from domain.observation import PER_PAIR
from domain.outcomes import ERROR_KINDS, FINISH_REASONS, TOOL_CHECKS, ErrorKind
from evaluators.pairs import text as textfn
from evaluators.pairs.types import (
    ArmColumns,
    ArmObs,
    Comparison,
    Pair,
    PairSet,
    counter_code,
)

PAIR_FIELDS = (
    "received_at",
    "stream",
    "temperature",
    "session_key",
    "turn_index",
    "json_requested",
    "tools_requested",
    "model",
    "replica",  # the gateway host's mirror process that stored the exchange
    "id_suffix",  # the exchange id's last two hex digits: its place in the similarity sample
)
# The per-pair quantities (float columns, as declared in domain.observation), then the fields
# the loader turns into codes and text features.
ARM_FIELDS = (
    "status",
    "error_kind",
    *PER_PAIR,
    "token_counter",
    "finish_reason",
    "tool_check",
    "output_text",
    "text_truncated",
    "tool_calls",
)
ARMS = ("production", "candidate", "control")
MATCH_FIELDS = ("candidate_match", "control_match")
ROW_WIDTH = len(PAIR_FIELDS) + len(ARMS) * len(ARM_FIELDS) + len(MATCH_FIELDS)
# Exchange ids end in random hex (UUIDv7): the similarity sample is the exchanges whose last two
# characters are among the first k of these, k = ceil(256 × fraction).
_SUFFIXES = tuple(f"{i:02x}" for i in range(256))

B = NDArray[np.bool_]


class _Codes(dict[Any, int]):
    """A str -> code map that answers `default` for any other value (and -1 for None)."""

    def __init__(self, names: Sequence[str], default: int, extra: dict[str, int]) -> None:
        super().__init__({name: i for i, name in enumerate(names)} | extra | {None: -1})
        self.default = default

    def __missing__(self, key: object) -> int:
        return self.default


# Every ErrorKind has its own code; a label no member spells (old rows) counts as OTHER.
_OTHER_ERROR = ERROR_KINDS.index(ErrorKind.OTHER)
_ERRORS = _Codes(ERROR_KINDS, _OTHER_ERROR, {})
_FINISH = _Codes(FINISH_REASONS, FINISH_REASONS.index("other"), {})
# A verdict no member spells (a later version's) is unknown: left out, never guessed.
_TOOL_CHECK = _Codes(TOOL_CHECKS, -1, {})
_HTTP_4XX, _HTTP_5XX = ERROR_KINDS.index(ErrorKind.HTTP_4XX), ERROR_KINDS.index(ErrorKind.HTTP_5XX)
_HTTP_OTHER = ERROR_KINDS.index(ErrorKind.HTTP_OTHER)


def sample_suffixes(fraction: float) -> tuple[str, ...] | None:
    """Id suffixes selecting about `fraction` of exchanges for text similarity (None: all)."""
    if fraction >= 1.0:
        return None
    return _SUFFIXES[: max(1, math.ceil(256 * fraction))]


# `PairSet.sample_rank` of an id whose tail is not two hex digits: in the sample only when the
# sample is every exchange.
UNRANKED = len(_SUFFIXES)


def sample_size(suffixes: tuple[str, ...] | None) -> int:
    """How many ranks the suffixes select: a pair is in the sample when its rank is below."""
    return UNRANKED + 1 if suffixes is None else len(suffixes)


def suffix_rank(suffix: str | None) -> int:
    """An id tail's rank in the sample order (`_SUFFIXES`), UNRANKED when it is not hex."""
    # int() would read "-1" or "+f" as hex numbers, so two hex digits exactly, or unranked.
    if suffix is None or len(suffix) != 2 or not all(c in _HEX for c in suffix):
        return UNRANKED
    return int(suffix, 16)


_HEX: Final = frozenset("0123456789abcdefABCDEF")


def sample_fraction(suffixes: tuple[str, ...] | None) -> float:
    """The share of random hex ids the suffixes select."""
    return 1.0 if suffixes is None else len(suffixes) / len(_SUFFIXES)


def session_id(key: str | None) -> int:
    if not key:
        return 0
    try:
        value = int(key, 16)
        # Fold a 128-bit hash into 64 bits (multiplying the high half keeps "abab…" distinct).
        value = (value ^ ((value >> 64) * 0x9E37_79B9_7F4A_7C15)) & 0xFFFF_FFFF_FFFF_FFFF
    except ValueError:
        value = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return value or 1


def _code(codes: dict[str, int], name: str | None) -> int:
    name = name or ""  # no model / no replica named: one code
    code = codes.get(name)
    if code is None:
        code = codes[name] = len(codes)
    return code


def _names(codes: dict[str, int]) -> list[str]:
    return sorted(codes, key=codes.__getitem__)


def mark_split(ps: PairSet) -> None:
    """Set `ps.split`: the pairs of sessions whose exchanges more than one gateway replica
    stored (a balancer not keyed on the session), among the pairs of the set."""
    n = ps.n
    session, replica = ps.session[:n], ps.replica[:n]
    ps.split[:n] = False
    keyed = np.flatnonzero(session != 0)
    if len(keyed) == 0:
        return
    # Sort the keyed pairs by session; a session is split when its replicas' min and max differ.
    order = keyed[np.argsort(session[keyed], kind="stable")]
    s, r = session[order], replica[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    mixed = np.minimum.reduceat(r, starts) != np.maximum.reduceat(r, starts)
    if np.any(mixed):
        group = np.cumsum(np.r_[True, s[1:] != s[:-1]]) - 1
        ps.split[order] = mixed[group]


class PairSetBuilder:
    """Accumulates rows of ROW_WIDTH fields (see the module docstring)."""

    def __init__(
        self,
        capacity: int,
        *,
        has_control: bool,
        suffixes: tuple[str, ...] | None = None,
        max_chars: int = 4000,
        lost_before: float = math.inf,
    ) -> None:
        self._set = PairSet.empty(max(capacity, 16))
        self._set.has_control = has_control
        self._set.similarity_fraction = sample_fraction(suffixes)
        self._sample_size = sample_size(suffixes)
        self._max_chars = max_chars
        self._lost_before = lost_before
        self._models: dict[str, int] = {}
        self._replicas: dict[str, int] = {}

    @property
    def n(self) -> int:
        return self._set.n

    def add(self, rows: Sequence[Sequence[Any]]) -> None:
        """Append a batch of rows."""
        if not rows:
            return
        if len(rows[0]) != ROW_WIDTH:
            raise ValueError(f"a row has {len(rows[0])} fields, the layout {ROW_WIDTH}")
        ps = self._set
        start, k = ps.n, len(rows)
        if start + k > ps.capacity:
            grown = ps.resized(max(2 * ps.capacity, start + k))
            grown.n = start
            self._set = ps = grown
        sl = slice(start, start + k)
        cols = list(zip(*rows, strict=True))
        get = dict(zip(PAIR_FIELDS, cols, strict=False))
        ps.received_at[sl] = np.asarray(get["received_at"], dtype=np.float64)
        ps.stream[sl] = np.asarray(get["stream"], dtype=bool)
        ps.temperature[sl] = np.asarray(get["temperature"], dtype=np.float32)
        ps.session[sl] = np.fromiter(map(session_id, get["session_key"]), np.uint64, k)
        ps.turn[sl] = np.nan_to_num(np.asarray(get["turn_index"], dtype=np.float64))
        ps.json_requested[sl] = np.asarray(get["json_requested"], dtype=bool)
        ps.tools_requested[sl] = np.asarray(get["tools_requested"], dtype=bool)
        ps.model[sl] = np.fromiter(map(self._model_code, get["model"]), np.int16, k)
        ps.replica[sl] = np.fromiter(map(self._replica_code, get["replica"]), np.int16, k)
        ps.sample_rank[sl] = np.fromiter(map(suffix_rank, get["id_suffix"]), np.uint16, k)
        sampled = ps.sample_rank[sl] < self._sample_size
        arm_cols: list[dict[str, tuple[Any, ...]]] = []
        for a, arm in enumerate(ARMS):
            offset = len(PAIR_FIELDS) + a * len(ARM_FIELDS)
            fields = dict(zip(ARM_FIELDS, cols[offset : offset + len(ARM_FIELDS)], strict=True))
            arm_cols.append(fields)
            self._fill_arm(ps.arm(arm), sl, fields, ps.json_requested[sl])
        lost = ~ps.candidate.present[sl]
        late = ps.received_at[sl] >= self._lost_before
        ps.lost += int(np.count_nonzero(lost & ~late))
        ps.pending += int(np.count_nonzero(lost & late))
        context = (ps.temperature[sl] == 0, ps.tools_requested[sl], sampled)
        match_c, match_k = cols[-2], cols[-1]
        self._compare(ps.vs_candidate, sl, ps.candidate, arm_cols[0], arm_cols[1], match_c, context)
        if ps.has_control:
            self._compare(ps.vs_control, sl, ps.control, arm_cols[0], arm_cols[2], match_k, context)
        ps.n = start + k

    def finish(self) -> PairSet:
        """The PairSet, trimmed to the rows added (no copy when the capacity was exact)."""
        ps = self._set if self._set.capacity == self._set.n else self._set.resized(self._set.n)
        ps.models = _names(self._models)
        ps.replicas = _names(self._replicas)
        return ps

    def _model_code(self, model: str | None) -> int:
        return _code(self._models, model)

    def _replica_code(self, replica: str | None) -> int:
        return _code(self._replicas, replica)

    def _fill_arm(
        self, arm: ArmColumns, sl: slice, f: dict[str, tuple[Any, ...]], json_requested: B
    ) -> None:
        k = sl.stop - sl.start
        status = np.asarray(f["status"], dtype=np.float64)
        present = np.isfinite(status)
        status = np.nan_to_num(status)
        kind = np.fromiter(map(_ERRORS.__getitem__, f["error_kind"]), np.int8, k)
        by_status = np.select(
            [(status >= 200) & (status < 300), (status >= 400) & (status < 500), status >= 500],
            [0, _HTTP_4XX, _HTTP_5XX],
            default=_HTTP_OTHER,
        )
        error = np.where(~present, 0, np.where(kind >= 0, kind, by_status)).astype(np.int8)
        arm.present[sl] = present
        arm.status[sl] = status
        arm.error[sl] = error
        arm.ok[sl] = ok = present & (error == 0)
        for name in PER_PAIR:
            arm.quantities[name][sl] = np.asarray(f[name], dtype=np.float32)
        arm.counter[sl] = np.fromiter(map(counter_code, f["token_counter"]), np.int64, k)
        finish = np.fromiter(map(_FINISH.__getitem__, f["finish_reason"]), np.int8, k)
        arm.finish[sl] = np.maximum(finish, 0)
        arm.tool_check[sl] = np.fromiter(map(_TOOL_CHECK.__getitem__, f["tool_check"]), np.int8, k)
        valid = arm.json_valid[sl]
        texts, truncated = f["output_text"], f["text_truncated"]
        for i in np.flatnonzero(json_requested & ok):
            t = texts[i]
            if t is not None and not truncated[i]:
                valid[i] = textfn.json_valid(t)

    def _compare(
        self,
        out: Comparison,
        sl: slice,
        other: ArmColumns,
        prod: dict[str, tuple[Any, ...]],
        oth: dict[str, tuple[Any, ...]],
        hash_match: tuple[Any, ...],
        context: tuple[B, B, B],
    ) -> None:
        """Agreement of one arm with production; Python only for rows that need the texts."""
        temp0, tools, sampled = context
        ok = self._set.production.ok[sl] & other.ok[sl]
        match = np.asarray(hash_match, dtype=np.float64)
        pt, ot = prod["output_text"], oth["output_text"]
        cut = np.asarray(prod["text_truncated"], dtype=bool) | np.asarray(
            oth["text_truncated"], dtype=bool
        )
        for i in np.flatnonzero(ok & np.isnan(match) & ~cut):
            if pt[i] is not None and ot[i] is not None:
                match[i] = pt[i] == ot[i]
        out.match[sl] = np.where(ok & np.isfinite(match), match, -1)
        divergence, similarity = out.divergence[sl], out.similarity[sl]
        for i in np.flatnonzero(ok & (match == 0) & temp0):
            a, b = pt[i], ot[i]
            if a is not None and b is not None:
                pos = textfn.first_divergence(a, b)
                if not cut[i] or pos < min(len(a), len(b)):
                    divergence[i] = pos / max(1, len(a))
        similarity[ok & sampled & (match == 1)] = 1.0
        for i in np.flatnonzero(ok & sampled & (match == 0)):
            if pt[i] is not None and ot[i] is not None:
                similarity[i] = textfn.similarity(pt[i], ot[i], self._max_chars)
        pc, oc = prod["tool_calls"], oth["tool_calls"]
        called = np.fromiter(
            (a is not None or b is not None for a, b in zip(pc, oc, strict=True)), bool, len(pc)
        )
        tool_equal = out.tool_equal[sl]
        for i in np.flatnonzero(ok & (tools | called)):
            eq = textfn.tool_calls_equal(pc[i], oc[i])
            if eq is not None:
                tool_equal[i] = eq


# With a control, production is never the latency reference, and these of its fields are not
# loaded (evaluators.pairs.load sends NULL for them; the in-memory path drops them the same way).
PRODUCTION_UNUSED_WITH_CONTROL = (
    "queue_wait_s",
    "inter_event_p50_s",
    "inter_event_p99_s",
    "cached_tokens",
)


def _arm_row(obs: ArmObs | None, unused: tuple[str, ...] = ()) -> tuple[Any, ...]:
    if obs is None:
        return (None,) * len(ARM_FIELDS)
    return tuple(None if name in unused else getattr(obs, name) for name in ARM_FIELDS)


def _hash_match(prod: ArmObs, other: ArmObs | None) -> int | None:
    if other is None or prod.output_hash is None or other.output_hash is None:
        return None
    return int(prod.output_hash == other.output_hash)


def pair_row(pair: Pair, *, has_control: bool = False) -> tuple[Any, ...]:
    """The row layout of one Pair (what the database query yields for one exchange)."""
    head = tuple(getattr(pair, name) for name in PAIR_FIELDS[:-2])
    head += (pair.replica, pair.exchange_id[-2:])
    unused = PRODUCTION_UNUSED_WITH_CONTROL if has_control else ()
    arms = _arm_row(pair.production, unused) + _arm_row(pair.candidate)
    arms += _arm_row(pair.control)
    tail = (
        _hash_match(pair.production, pair.candidate),
        _hash_match(pair.production, pair.control),
    )
    return head + arms + tail


def pairset_from_pairs(
    pairs: Iterable[Pair],
    *,
    has_control: bool | None = None,
    similarity_fraction: float = 1.0,
    max_chars: int = 4000,
) -> PairSet:
    """A PairSet from Pair Structs, in the order given (every missing candidate is lost)."""
    suffixes = sample_suffixes(similarity_fraction)
    pairs = list(pairs)
    if has_control is None:
        has_control = any(p.control is not None for p in pairs)
    rows = [pair_row(p, has_control=has_control) for p in pairs]
    builder = PairSetBuilder(
        len(rows), has_control=has_control, suffixes=suffixes, max_chars=max_chars
    )
    builder.add(rows)
    ps = builder.finish()
    mark_split(ps)
    return ps
