"""Shared SQL building blocks for queries.py, promotions.py and writer.py: the tables, row <->
record conversion, the registry-version bump, the dialect's INSERT … ON CONFLICT, and the
translation of driver errors into storage's own exceptions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import msgspec.inspect
from sqlalchemy import RowMapping, String, Table, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import Insert

from domain.endpoint import Endpoint
from domain.errors import InvalidEndpoint, StorageError, StorageUnavailable
from storage.models import Base

ENDPOINTS: Table = Base.metadata.tables["endpoints"]
REGISTRY_META: Table = Base.metadata.tables["registry_meta"]
EXCHANGES: Table = Base.metadata.tables["exchanges"]
OBSERVATIONS: Table = Base.metadata.tables["observations"]
PROMOTIONS: Table = Base.metadata.tables["promotions"]
MIRROR_COUNTERS: Table = Base.metadata.tables["mirror_counters"]
ROLLOUTS: Table = Base.metadata.tables["rollouts"]
ROLLOUT_EVENTS: Table = Base.metadata.tables["rollout_events"]


def insert_ignore(dialect: str, table: Table) -> Insert:
    """INSERT that silently skips rows whose primary or unique key already exists."""
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


def upsert(dialect: str, table: Table, keys: Sequence[str], update: Sequence[str]) -> Insert:
    """INSERT … ON CONFLICT (keys) DO UPDATE SET each of `update` to the new row's value."""
    if dialect == "postgresql":
        pg = postgresql.insert(table)
        return pg.on_conflict_do_update(
            index_elements=list(keys), set_={c: pg.excluded[c] for c in update}
        )
    lite = sqlite.insert(table)
    return lite.on_conflict_do_update(
        index_elements=list(keys), set_={c: lite.excluded[c] for c in update}
    )


def is_transient(exc: BaseException) -> bool:
    """True when retrying later may succeed: the server is down, restarting, unreachable, the
    connection was cut, or SQLite is locked. False for errors in the data or the SQL."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError | InterfaceError | OSError)


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise driver errors as StorageUnavailable (transient) or StorageError (anything else),
    naming what was being done; storage's own exceptions pass through untouched."""
    try:
        yield
    except StorageError:
        raise
    except (SQLAlchemyError, OSError) as exc:
        if is_transient(exc):
            raise StorageUnavailable(f"{what}: {_short(exc)}") from exc
        raise StorageError(f"{what}: {_short(exc)}") from exc


def _short(exc: BaseException) -> str:
    orig: Any = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc)
    return text.splitlines()[0] if text else type(exc).__name__


_FIELDS = tuple(f.name for f in msgspec.structs.fields(Endpoint))
# Dict fields (the verdict overrides) are stored as a JSON object in TEXT, NULL when empty;
# sub-structs (the grader) as a JSON object, NULL when None.
_JSON_FIELDS = tuple(
    f.name
    for f in msgspec.structs.fields(Endpoint)
    if isinstance(
        getattr(t := msgspec.inspect.type_info(f.type), "type", t), msgspec.inspect.DictType
    )
)


def _is_struct(type_: Any) -> bool:
    info = msgspec.inspect.type_info(type_)
    return any(isinstance(m, msgspec.inspect.StructType) for m in getattr(info, "types", (info,)))


_STRUCT_FIELDS = {f.name: f.type for f in msgspec.structs.fields(Endpoint) if _is_struct(f.type)}
# What an update may change: identity and bookkeeping are storage's.
MUTABLE_FIELDS = frozenset(_FIELDS) - {"name", "version", "created_at", "updated_at"}
json_encoder = msgspec.json.Encoder()


_LENGTHS = {
    c.name: c.type.length
    for c in ENDPOINTS.columns
    if isinstance(c.type, String) and c.type.length is not None
}


def validate_endpoint(ep: Endpoint) -> Endpoint:
    """`ep` if every field fits the schema (types, literals, column lengths), the same on both
    dialects (SQLite would store an over-long string that PostgreSQL refuses)."""
    try:
        msgspec.convert(msgspec.to_builtins(ep), Endpoint)
    except msgspec.ValidationError as exc:
        raise InvalidEndpoint(f"endpoint {ep.name!r}: {exc}") from exc
    for name, limit in _LENGTHS.items():
        value = getattr(ep, name, None)
        if isinstance(value, str) and len(value) > limit:
            raise InvalidEndpoint(f"endpoint {ep.name!r}: {name} is longer than {limit} characters")
    return ep


def row_to_endpoint(row: RowMapping) -> Endpoint:
    data = {name: row[name] for name in _FIELDS}
    for name in _JSON_FIELDS:
        data[name] = msgspec.json.decode(raw) if (raw := data[name]) else {}
    for name, type_ in _STRUCT_FIELDS.items():
        data[name] = msgspec.json.decode(raw, type=type_) if (raw := data[name]) else None
    # Not re-validated: a row stored before today's bounds still loads (writes are validated).
    return Endpoint(**data)


def endpoint_values(ep: Endpoint) -> dict[str, Any]:
    values = {name: getattr(ep, name) for name in _FIELDS}
    for name in _JSON_FIELDS:
        values[name] = json_encoder.encode(value).decode() if (value := values[name]) else None
    for name in _STRUCT_FIELDS:
        value = values[name]
        values[name] = None if value is None else json_encoder.encode(value).decode()
    return values


async def bump_version(conn: AsyncConnection) -> int:
    """Increment registry_meta.version; as a transaction's first statement it is the lock."""
    stmt = (
        update(REGISTRY_META)
        .where(REGISTRY_META.c.id == 1)
        .values(version=REGISTRY_META.c.version + 1)
        .returning(REGISTRY_META.c.version)
    )
    version = (await conn.execute(stmt)).scalar_one_or_none()
    if version is None:  # the migration inserts the row; recreate it if someone deleted it
        await conn.execute(insert(REGISTRY_META).values(id=1, version=1))
        version = 1
    return int(version)


async def fetch(conn: AsyncConnection, name: str) -> Endpoint | None:
    row = (await conn.execute(select(ENDPOINTS).where(ENDPOINTS.c.name == name))).mappings()
    first = row.first()
    return None if first is None else row_to_endpoint(first)


async def fetch_live(conn: AsyncConnection) -> Endpoint | None:
    rows = (await conn.execute(select(ENDPOINTS).where(ENDPOINTS.c.role == "live"))).mappings()
    first = rows.first()
    return None if first is None else row_to_endpoint(first)


async def set_role(conn: AsyncConnection, ep: Endpoint, role: str, now: float) -> None:
    await conn.execute(
        update(ENDPOINTS)
        .where(ENDPOINTS.c.name == ep.name)
        .values(role=role, version=ENDPOINTS.c.version + 1, updated_at=now)
    )
