"""The one engine factory, and the schema gate in front of it.

`make_engine` builds an AsyncEngine tuned per dialect: SQLite (aiosqlite) in WAL mode with a
busy timeout, foreign keys on and real BEGINs (sqlite3's legacy mode would run SELECTs outside
the transaction); PostgreSQL (asyncpg) with a bounded pool and pre-ping so a restarted server
or a terminated backend costs one reconnect, not an error.

`ensure_schema` refuses a database whose schema differs from the code, naming the command that
fixes it; only an empty SQLite file is upgraded implicitly. Nothing here logs or reads config.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import Connection, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from domain.errors import SchemaAhead, SchemaBehind, StorageError, UsageError
from storage import migrate
from storage.migrate import SchemaState
from storage.sql import translated

# An execution option read by the SQLite BEGIN hook: writers take the write lock up front,
# so a read-then-write transaction never fails with SQLITE_BUSY_SNAPSHOT halfway through.
IMMEDIATE = "canary_begin_immediate"
# Any constant: PostgreSQL serializes concurrent `canary db upgrade` runs on it.
_PG_MIGRATION_LOCK = 0x63616E617279


# Query parameters that carry a secret (asyncpg accepts `?password=`, libpq-style `sslpassword`).
_SECRET_PARAM = ("password", "passwd", "pwd", "secret", "token", "key")


def masked(db_url: str) -> str:
    """The URL with its password hidden, fit for messages and logs: the userinfo password and
    any query parameter whose name suggests a secret (`?password=`) become `***`."""
    try:
        url = make_url(db_url)
    except ArgumentError:
        return "<unparseable database URL>"
    query = {
        k: ("redacted" if any(s in k.lower() for s in _SECRET_PARAM) else v)
        for k, v in url.query.items()
    }
    return url.set(query=query).render_as_string(hide_password=True)


def make_engine(
    db_url: str,
    *,
    pool_size: int = 5,
    max_overflow: int = 10,
    busy_timeout_ms: int = 5000,
    connect_timeout_s: float = 10.0,
    command_timeout_s: float = 60.0,
    application_name: str = "canary-gateway",
) -> AsyncEngine:
    """An AsyncEngine for `sqlite+aiosqlite://…` or `postgresql+asyncpg://…`."""
    try:
        url = make_url(db_url)
    except ArgumentError as exc:
        raise StorageError(f"not a database URL: {masked(db_url)}") from exc
    if url.drivername == "sqlite+aiosqlite":
        return _sqlite_engine(db_url, busy_timeout_ms)
    if url.drivername == "postgresql+asyncpg":
        return create_async_engine(
            url,
            pool_size=pool_size,
            max_overflow=max_overflow,
            pool_pre_ping=True,
            # Replace connections periodically so a failover or a proxy's idle cut is survived.
            pool_recycle=1800,
            pool_timeout=connect_timeout_s,
            connect_args={
                "timeout": connect_timeout_s,
                "command_timeout": command_timeout_s,
                "server_settings": {"application_name": application_name},
            },
        )
    raise StorageError(
        f"unsupported database URL {masked(db_url)}: "
        "use sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER@HOST/DB"
    )


def _sqlite_engine(db_url: str, busy_timeout_ms: int) -> AsyncEngine:
    engine = create_async_engine(db_url, connect_args={"timeout": busy_timeout_ms / 1000})
    in_memory = make_url(db_url).database in (None, "", ":memory:")

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself (see _on_begin)
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            if not in_memory:
                _enable_wal(cur, busy_timeout_ms / 1000)
                # WAL + NORMAL: durable across application crashes, fsync at checkpoints only.
                cur.execute("PRAGMA synchronous = NORMAL")
            cur.execute("PRAGMA foreign_keys = ON")
        finally:
            cur.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _enable_wal(cur: Any, budget_s: float) -> None:
    """Switch the file to WAL (persistent, so only a new file really switches). SQLite answers
    "locked" at once, without its busy handler, when several connections race to switch a new
    file; retry briefly. The sleep blocks, but only in that race, at first start."""
    cur.execute("PRAGMA journal_mode")
    if str(cur.fetchone()[0]).lower() == "wal":
        return
    deadline = time.monotonic() + budget_s
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except Exception as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@contextlib.asynccontextmanager
async def write_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction that holds SQLite's write lock from its first statement; commits on exit."""
    async with engine.connect() as conn:
        await conn.execution_options(**{IMMEDIATE: True})
        async with conn.begin():
            yield conn


async def schema_state(engine: AsyncEngine) -> SchemaState:
    """ "empty" (never migrated), "current", "behind" (upgrade needed) or "ahead" (newer code
    migrated this database)."""
    with translated("reading the schema version"):
        async with engine.connect() as conn:
            return await conn.run_sync(migrate.state_of)


async def _migrate_on(engine: AsyncEngine, revision: str, *, down: bool) -> None:
    async with write_transaction(engine) as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(text(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})"))
        step = migrate.run_downgrade if down else migrate.run_upgrade
        await conn.run_sync(step, revision)


@contextlib.asynccontextmanager
async def _engine_for(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(db_url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def upgrade(db_url: str, revision: str = "head") -> None:
    """`alembic upgrade REVISION` on the database, in one transaction (DDL is transactional on
    both dialects); concurrent runs serialize and the later one finds nothing to do."""
    with translated(f"upgrading {masked(db_url)}"):
        async with _engine_for(db_url) as engine:
            await _migrate_on(engine, revision, down=False)


async def downgrade(db_url: str, revision: str) -> None:
    """`alembic downgrade REVISION` (e.g. "base" drops every table)."""
    with translated(f"downgrading {masked(db_url)}"):
        async with _engine_for(db_url) as engine:
            await _migrate_on(engine, revision, down=True)


async def current_revision(db_url: str) -> tuple[tuple[str, ...], SchemaState]:
    """The database's stamped revision(s) and how they compare with the code."""
    with translated(f"reading the revision of {masked(db_url)}"):
        async with _engine_for(db_url) as engine, engine.connect() as conn:
            revs = await conn.run_sync(migrate.current_revisions)
            state = await conn.run_sync(migrate.state_of)
    return revs, state


async def ensure_schema(
    engine: AsyncEngine, db_url: str, *, auto_upgrade_empty_sqlite: bool = True
) -> None:
    """Return when the schema matches the code; raise SchemaBehind (or SchemaAhead) otherwise.

    An empty SQLite database is upgraded in place when `auto_upgrade_empty_sqlite` is set: the
    embedded default must work on first start without an extra command.
    """
    state = await schema_state(engine)
    if state == "current":
        return
    if state == "empty" and auto_upgrade_empty_sqlite and engine.dialect.name == "sqlite":
        with translated(f"creating the schema in {masked(db_url)}"):
            await _migrate_on(engine, "head", down=False)
        return
    where = masked(db_url)
    heads = ", ".join(migrate.head_revisions())
    if state == "ahead":
        raise SchemaAhead(
            f"the database {where} has a schema newer than this canary-gateway "
            f"(this one expects revision {heads}); run the newer canary-gateway, or "
            f"downgrade the schema with it: `canary db downgrade {heads} --db {where}`"
        )
    what = "empty" if state == "empty" else "older than this canary-gateway"
    raise SchemaBehind(
        f"the database {where} schema is {what} (expected revision {heads}); "
        f"run `canary db upgrade --db {where}`"
    )


def sqlite_path(db_url: str) -> str | None:
    """The file of a SQLite URL (None: not SQLite, or in memory)."""
    try:
        url = make_url(db_url)
    except ArgumentError:
        return None
    if not url.drivername.startswith("sqlite") or url.database in (None, "", ":memory:"):
        return None
    return url.database


def require_existing_database(db_url: str) -> None:
    """Raise UsageError (the operator's --db) when a SQLite URL names a file that does not exist:
    a read-only command must never create an empty database where the operator expected their
    data."""
    path = sqlite_path(db_url)
    if path is not None and not os.path.exists(path):
        raise UsageError(
            f"no database at {path} (from {masked(db_url)}): check --db or CANARY_STORAGE_DB_URL; "
            "a read-only command never creates one"
        )


class DatabaseFileGuard:
    """Notices when the SQLite file under a running gateway is deleted or replaced.

    SQLite keeps writing to its open (now unlinked) inode, so every later write succeeds and
    is lost at exit; the identity (device, inode) taken at start-up is compared on demand.
    PostgreSQL URLs have no file: `problem()` is always None for them."""

    __slots__ = ("_identity", "path")

    def __init__(self, db_url: str) -> None:
        self.path = sqlite_path(db_url)
        self._identity = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def problem(self) -> str | None:
        """Why the database file is not the one opened at start-up (None: it is, or no file)."""
        if self.path is None or self._identity is None:
            return None
        now = self._stat()
        if now is None:
            return f"the database file {self.path} was deleted while the gateway runs"
        if now != self._identity:
            return f"the database file {self.path} was replaced while the gateway runs"
        return None
