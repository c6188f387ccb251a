"""Rows of (exchange, production, candidate, control) fields into a compact `PairSet`.

One builder serves both sources: `evaluators.pairs` feeds it database rows batch by batch, and
`pairset_from_pairs` feeds it `Pair` Structs (tests, simulations). Columns are preallocated and
grown by doubling, so loading costs a few numpy conversions per batch, not an object per pair.
Text is looked at here and nowhere else: it is reduced to per-pair features and then dropped.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from evaluators import text as textfn
from evaluators.types import (
    ERROR_KINDS,
    FINISH_REASONS,
    ArmColumns,
    ArmObs,
    Comparison,
    Pair,
    PairSet,
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
)
ARM_FIELDS = (
    "status",
    "error_kind",
    "started_at",
    "queue_wait_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "itl_p50_s",
    "itl_p99_s",
    "output_tokens",
    "output_tokens_source",
    "prompt_tokens",
    "cached_tokens",
    "finish_reason",
    "output_hash",
    "output_text",
    "text_truncated",
    "tool_calls",
)
ARMS = ("production", "candidate", "control")
ROW_WIDTH = len(PAIR_FIELDS) + len(ARMS) * len(ARM_FIELDS)

_ERROR_INDEX = {name: i for i, name in enumerate(ERROR_KINDS)}
_ERROR_INDEX.update({"http_other": _ERROR_INDEX["other"], "client_error": _ERROR_INDEX["other"]})
_FINISH_INDEX = {name: i for i, name in enumerate(FINISH_REASONS)}
_OTHER_ERROR = _ERROR_INDEX["other"]
_OTHER_FINISH = _FINISH_INDEX["other"]
_FLOAT_COLUMNS = (
    ("queue_wait_s", "queue_wait"),
    ("ttft_s", "ttft"),
    ("tpot_s", "tpot"),
    ("e2e_s", "e2e"),
    ("itl_p50_s", "itl_p50"),
    ("itl_p99_s", "itl_p99"),
    ("output_tokens", "tokens"),
    ("prompt_tokens", "prompt_tokens"),
    ("cached_tokens", "cached_tokens"),
)


def _error_code(kind: str | None, status: int) -> int:
    if kind is not None:
        return _ERROR_INDEX.get(kind, _OTHER_ERROR)
    if 200 <= status < 300:
        return 0
    if 400 <= status < 500:
        return _ERROR_INDEX["http_4xx"]
    if status >= 500:
        return _ERROR_INDEX["http_5xx"]
    return _OTHER_ERROR


def _session_id(key: str | None) -> int:
    if not key:
        return 0
    try:
        value = int(key, 16)
        # Fold a 128-bit hash into 64 bits (multiplying the high half keeps "abab…" distinct).
        value = (value ^ ((value >> 64) * 0x9E37_79B9_7F4A_7C15)) & 0xFFFF_FFFF_FFFF_FFFF
    except ValueError:
        value = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return value or 1


class PairSetBuilder:
    """Accumulates rows of ROW_WIDTH fields (PAIR_FIELDS, then ARM_FIELDS per arm in ARMS)."""

    def __init__(
        self,
        capacity: int,
        *,
        has_control: bool,
        similarity_stride: int = 1,
        max_chars: int = 4000,
        lost_before: float = math.inf,
    ) -> None:
        self._set = PairSet.empty(max(capacity, 16))
        self._set.has_control = has_control
        self._set.similarity_stride = max(1, similarity_stride)
        self._max_chars = max_chars
        self._lost_before = lost_before
        self._models: dict[str | None, int] = {}

    @property
    def n(self) -> int:
        return self._set.n

    def add(self, rows: Sequence[Sequence[Any]]) -> None:
        """Append a batch of rows."""
        if not rows:
            return
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
        ps.session[sl] = np.fromiter(
            (_session_id(s) for s in get["session_key"]), dtype=np.uint64, count=k
        )
        ps.turn[sl] = np.asarray([t or 0 for t in get["turn_index"]], dtype=np.int16)
        ps.json_requested[sl] = np.asarray(get["json_requested"], dtype=bool)
        ps.tools_requested[sl] = np.asarray(get["tools_requested"], dtype=bool)
        ps.model[sl] = np.fromiter(
            (self._model_code(m) for m in get["model"]), dtype=np.int16, count=k
        )
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
        temp0 = ps.temperature[sl] == 0
        tools = ps.tools_requested[sl]
        self._compare(ps.vs_candidate, start, arm_cols[0], arm_cols[1], temp0, tools)
        if ps.has_control:
            self._compare(ps.vs_control, start, arm_cols[0], arm_cols[2], temp0, tools)
        ps.n = start + k

    def finish(self) -> PairSet:
        """The PairSet, trimmed to the rows added."""
        ps = self._set.resized(self._set.n)
        ps.models = [m or "" for m, _ in sorted(self._models.items(), key=lambda kv: kv[1])]
        return ps

    def _model_code(self, model: str | None) -> int:
        code = self._models.get(model)
        if code is None:
            code = self._models[model] = len(self._models)
        return code

    def _fill_arm(
        self,
        arm: ArmColumns,
        sl: slice,
        f: dict[str, tuple[Any, ...]],
        json_requested: np.ndarray[Any, np.dtype[np.bool_]],
    ) -> None:
        status = f["status"]
        present = np.fromiter((s is not None for s in status), dtype=bool, count=len(status))
        arm.present[sl] = present
        arm.status[sl] = np.asarray([s or 0 for s in status], dtype=np.int16)
        error = np.fromiter(
            (
                0 if s is None else _error_code(e, s)
                for e, s in zip(f["error_kind"], status, strict=True)
            ),
            dtype=np.int8,
            count=len(status),
        )
        arm.error[sl] = error
        arm.ok[sl] = present & (error == 0)
        arm.start[sl] = np.asarray(f["started_at"], dtype=np.float64)
        for src, dst in _FLOAT_COLUMNS:
            getattr(arm, dst)[sl] = np.asarray(f[src], dtype=np.float32)
        arm.tokens_from_chunks[sl] = np.asarray(
            [s == "chunks" for s in f["output_tokens_source"]], dtype=bool
        )
        arm.finish[sl] = np.fromiter(
            (0 if r is None else _FINISH_INDEX.get(r, _OTHER_FINISH) for r in f["finish_reason"]),
            dtype=np.int8,
            count=len(status),
        )
        valid = arm.json_valid[sl]
        texts, truncated = f["output_text"], f["text_truncated"]
        for i in np.flatnonzero(json_requested & present & (error == 0)):
            t = texts[i]
            if t is not None and not truncated[i]:
                valid[i] = textfn.json_valid(t)

    def _compare(
        self,
        out: Comparison,
        start: int,
        prod: dict[str, tuple[Any, ...]],
        other: dict[str, tuple[Any, ...]],
        temp0: np.ndarray[Any, np.dtype[np.bool_]],
        tools: np.ndarray[Any, np.dtype[np.bool_]],
    ) -> None:
        stride, max_chars = self._set.similarity_stride, self._max_chars
        p_ok = zip(prod["status"], prod["error_kind"], strict=True)
        o_ok = zip(other["status"], other["error_kind"], strict=True)
        for i, ((ps, pe), (os_, oe)) in enumerate(zip(p_ok, o_ok, strict=True)):
            if os_ is None or pe is not None or oe is not None:
                continue
            if not (200 <= (ps or 0) < 300 and 200 <= os_ < 300):
                continue
            row = start + i
            ph, oh = prod["output_hash"][i], other["output_hash"][i]
            pt, ot = prod["output_text"][i], other["output_text"][i]
            whole = not prod["text_truncated"][i] and not other["text_truncated"][i]
            if ph is not None and oh is not None:
                same: bool | None = ph == oh
            elif pt is not None and ot is not None and whole:
                same = pt == ot
            else:
                same = None
            if same is not None:
                out.match[row] = same
            if same is False and temp0[i] and pt is not None and ot is not None:
                pos = textfn.first_divergence(pt, ot)
                if whole or pos < min(len(pt), len(ot)):
                    out.divergence[row] = pos / max(1, len(pt))
            if row % stride == 0:
                if same:
                    out.similarity[row] = 1.0
                elif pt is not None and ot is not None:
                    out.similarity[row] = textfn.similarity(pt, ot, max_chars)
            pc, oc = prod["tool_calls"][i], other["tool_calls"][i]
            if tools[i] or pc is not None or oc is not None:
                eq = textfn.tool_calls_equal(pc, oc)
                if eq is not None:
                    out.tool_equal[row] = eq


def _arm_row(obs: ArmObs | None) -> tuple[Any, ...]:
    if obs is None:
        return (None,) * len(ARM_FIELDS)
    return tuple(getattr(obs, name) for name in ARM_FIELDS)


def pair_row(pair: Pair) -> tuple[Any, ...]:
    """The row layout of one Pair (what the database query yields for one exchange)."""
    head = tuple(getattr(pair, name) for name in PAIR_FIELDS)
    return head + _arm_row(pair.production) + _arm_row(pair.candidate) + _arm_row(pair.control)


def pairset_from_pairs(
    pairs: Iterable[Pair],
    *,
    has_control: bool | None = None,
    similarity_stride: int = 1,
    max_chars: int = 4000,
) -> PairSet:
    """A PairSet from Pair Structs, in the order given (every missing candidate is lost)."""
    rows = [pair_row(p) for p in pairs]
    if has_control is None:
        has_control = any(row[-len(ARM_FIELDS)] is not None for row in rows)
    builder = PairSetBuilder(
        len(rows),
        has_control=has_control,
        similarity_stride=similarity_stride,
        max_chars=max_chars,
    )
    builder.add(rows)
    return builder.finish()
