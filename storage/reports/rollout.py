"""The SQL of a ramp step's evidence: a rollout's live requests as the per-request arrays
`evaluators.rollout.arms.session_units` takes.

`rollout_requests` reads `rollout_requests` of one rollout generation, ended in [since, until), in
arrival order (`at`, then id), through the driver's own cursor in batches (as the pairs loader
does, `storage.reports.pairs`), and builds numpy columns batch by batch: a million requests
never become a million Python objects at once. Outcomes are reduced in SQL to two small
integers: `ok` (no error kind) and `disconnected` (the error kind says nothing about the
endpoint: the client went away or the gateway shut down, `domain.outcomes.NOT_THE_ENDPOINT`).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
import numpy as np
from numpy.typing import NDArray
from sqlalchemy import ColumnElement, case, select
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.observation import Field, describe
from domain.outcomes import NOT_THE_ENDPOINT
from domain.records import RolloutRecord
from storage.models import RolloutRequestRow
from storage.reports.pairs import _batches
from storage.sql import translated

__all__ = ["ROLLOUT_COLUMNS", "evidence_columns", "rollout_requests"]

_TABLE: Final = RolloutRequestRow.__table__
# Integer columns by their declared width (domain.records.RolloutRecord).
_INT_DTYPES: Final[dict[int, type[np.generic]]] = {8: np.int8, 16: np.int32, 64: np.int64}
# Who and where: the unit (session), its arm and the request's turn.
_UNIT: Final = ("session", "arm", "turn")


def _dtype(field: Field) -> type[np.generic]:
    if field.type is float:
        return np.float64  # NULL -> NaN
    return _INT_DTYPES.get(field.quantity.bits, np.int32)


def evidence_columns(record: type[msgspec.Struct]) -> dict[str, type[np.generic]]:
    """The per-request arrays of a declared ramp record, and their dtypes: the unit, `ok`, every
    duration it declares (unit "s": `ttft_s`, `e2e_s` and any quantity added there), NaN where
    NULL, and `disconnected` (`ok` and `disconnected` reduced from the error kind in SQL)."""
    fields = {f.name: f for f in describe(record)}
    durations = {name: _dtype(f) for name, f in fields.items() if f.quantity.unit == "s"}
    return {
        **{name: _dtype(fields[name]) for name in _UNIT},
        "ok": np.bool_,
        **durations,
        "disconnected": np.bool_,
    }


# The arrays, named as `evaluators.rollout.arms.session_units` names its parameters.
ROLLOUT_COLUMNS: Final = evidence_columns(RolloutRecord)
_REDUCED: Final = ("ok", "disconnected")
_DURATIONS: Final = tuple(_TABLE.c[n] for n in ROLLOUT_COLUMNS if n not in (*_UNIT, *_REDUCED))
_BATCH: Final = 20_000  # rows per fetch: large enough to amortize, small enough to bound memory


def _query(generation: int, since: float | None, until: float | None) -> Any:
    r = _TABLE
    ok: ColumnElement[int] = case((r.c.error_kind.is_(None), 1), else_=0)
    gone = sorted(str(k) for k in NOT_THE_ENDPOINT)
    disconnected: ColumnElement[int] = case((r.c.error_kind.in_(gone), 1), else_=0)
    cond: list[ColumnElement[bool]] = [r.c.generation == generation]
    if since is not None:
        cond.append(r.c.at >= since)
    if until is not None:
        cond.append(r.c.at < until)
    unit = (r.c[name] for name in _UNIT)
    return select(*unit, ok, *_DURATIONS, disconnected).where(*cond).order_by(r.c.at, r.c.id)


async def rollout_requests(
    engine: AsyncEngine, generation: int, since: float | None, until: float | None
) -> dict[str, NDArray[Any]]:
    """One rollout generation's requests ended in [since, until) (None: unbounded), in arrival
    order, as the columns of ROLLOUT_COLUMNS (a float NaN where absent)."""
    parts: dict[str, list[NDArray[Any]]] = {name: [] for name in ROLLOUT_COLUMNS}
    stmt = _query(generation, since, until)
    with translated("reading a rollout's requests"):
        async with engine.connect() as conn:
            async for rows in _batches(conn, stmt, _BATCH):
                columns = zip(*rows, strict=True)  # every row has every column
                for (name, dtype), column in zip(ROLLOUT_COLUMNS.items(), columns, strict=True):
                    parts[name].append(np.array(column, dtype=dtype))  # NULL -> NaN in floats
    return {
        name: np.concatenate(chunks) if chunks else np.zeros(0, dtype=ROLLOUT_COLUMNS[name])
        for name, chunks in parts.items()
    }
