"""Database fixtures: every storage test runs on a fresh SQLite file and on a fresh database in
the local PostgreSQL.

- `db_url`: an empty database (parametrized "sqlite" / "postgresql"); PostgreSQL databases are
  created through asyncpg on the `postgres` maintenance database and dropped afterwards. An
  unreachable PostgreSQL FAILS the test (never skips): the suite claims both dialects.
- `migrated_db_url`: the same, upgraded to the head revision.
- `db_engine`: an engine on `migrated_db_url`, disposed after the test.
- `db_outage(url, reads=False)`: an async context manager inside which the database refuses
  service (PostgreSQL: connections disallowed and backends terminated with
  pg_terminate_backend; SQLite: another connection holds the write lock, and with reads=True the
  control-plane tables are renamed away, since WAL readers never block).

The PostgreSQL server is `postgresql://postgres@127.0.0.1:5432/postgres` unless
CANARY_TEST_PG_DSN names another maintenance DSN. When nothing answers there, the first test that
needs PostgreSQL starts a throwaway server from the local binaries for the rest of the session
(`tests/throwaway_pg.py`: initdb and postgres in a temporary directory, as an unprivileged user
when run as root). With no binaries either, the PostgreSQL half of the suite is skipped with one
summary line, unless CANARY_REQUIRE_PG=1 (what `.ci/run` sets): then it fails, because CI must
keep proving both dialects.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Generator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from storage.engine import make_engine, upgrade
from tests import throwaway_pg


class Outage(Protocol):
    def __call__(self, url: str, *, reads: bool = False) -> AbstractAsyncContextManager[None]: ...


CONFIGURED_DSN = os.environ.get(
    "CANARY_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REQUIRE_PG = os.environ.get("CANARY_REQUIRE_PG") == "1"

DB_KINDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@dataclass
class _PgState:
    """How this session reaches PostgreSQL, decided by the first test that needs it."""

    dsn: str | None = None  # the maintenance DSN in use
    unavailable: str | None = None  # why there is none (the PostgreSQL half is skipped)
    started: throwaway_pg.Server | None = None  # the throwaway server, when one was started


_PG = _PgState()


def _resolve_pg() -> str:
    """The maintenance DSN: the configured server when it answers, else a throwaway server from
    the local binaries; skips (or fails under CANARY_REQUIRE_PG=1) when there is neither."""
    if _PG.dsn is not None:
        return _PG.dsn
    if _PG.unavailable is None:
        if throwaway_pg.answers(CONFIGURED_DSN):
            _PG.dsn = CONFIGURED_DSN
            return _PG.dsn
        bindir = throwaway_pg.find_bindir()
        if bindir is None:
            _PG.unavailable = (
                f"nothing answers at {CONFIGURED_DSN} and no local PostgreSQL binaries "
                "(initdb, postgres) to start one from"
            )
        else:
            try:
                _PG.started = throwaway_pg.start(bindir)
            except (OSError, RuntimeError) as exc:
                _PG.unavailable = (
                    f"nothing answers at {CONFIGURED_DSN} and a throwaway server from {bindir} "
                    f"did not start: {exc}"
                )
            else:
                _PG.dsn = _PG.started.dsn
                return _PG.dsn
    if REQUIRE_PG:
        pytest.fail(f"CANARY_REQUIRE_PG=1 but {_PG.unavailable}", pytrace=False)
    pytest.skip(f"{SKIPPED_HALF}: {_PG.unavailable}")


SKIPPED_HALF = "PostgreSQL half skipped"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Report every PostgreSQL test skipped for want of a server at one place, so the summary
    folds them into one line (`SKIPPED [N] tests/fixtures_db.py:…`) instead of one per test."""
    report: pytest.TestReport = yield
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple) and SKIPPED_HALF in longrepr[2]:
        here = Path(__file__)
        with contextlib.suppress(ValueError):
            here = here.relative_to(item.config.rootpath)
        report.longrepr = (str(here), _resolve_pg.__code__.co_firstlineno, longrepr[2])
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line saying where the PostgreSQL half ran when it was not the configured server (a
    skipped half has its own line among the skips)."""
    if _PG.started is not None:
        terminalreporter.write_line(
            f"PostgreSQL: nothing answered at {CONFIGURED_DSN}; the PostgreSQL half ran on a "
            f"throwaway server from {_PG.started.bindir} at {_PG.started.dsn}"
        )


def pytest_unconfigure() -> None:
    if _PG.started is not None:
        _PG.started.stop()
        _PG.started = None


async def _pg_admin() -> asyncpg.Connection:
    dsn = _resolve_pg()
    try:
        return await asyncpg.connect(dsn, timeout=10)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.fail(
            f"PostgreSQL answers at {dsn} but refused the tests "
            f"({type(exc).__name__}: {exc}). Fix it, or point CANARY_TEST_PG_DSN at another.",
            pytrace=False,
        )


def _pg_url(database: str) -> str:
    parts = urlsplit(_resolve_pg())
    return urlunsplit(parts._replace(scheme="postgresql+asyncpg", path=f"/{database}"))


@contextlib.asynccontextmanager
async def fresh_database(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database of `kind`, as a SQLAlchemy async URL; removed afterwards."""
    if kind == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / f'canary-{uuid.uuid4().hex[:8]}.db'}"
        return
    name = f"canary_test_{uuid.uuid4().hex[:16]}"
    admin = await _pg_admin()
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield _pg_url(name)
    finally:
        admin = await _pg_admin()
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@pytest.fixture(params=DB_KINDS)
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database: a SQLite file in tmp_path, or a new PostgreSQL database."""
    async with fresh_database(request.param, tmp_path) as url:
        yield url


@pytest.fixture
async def migrated_db_url(db_url: str) -> str:
    """`db_url` upgraded to the head revision."""
    await upgrade(db_url)
    return db_url


@pytest.fixture
async def db_engine(migrated_db_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a migrated database, disposed after the test."""
    engine = make_engine(migrated_db_url)
    try:
        yield engine
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def _pg_outage(url: str) -> AsyncIterator[None]:
    name = make_url(url).database
    admin = await _pg_admin()
    try:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
        yield
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await admin.close()


@contextlib.asynccontextmanager
async def _sqlite_outage(url: str, reads: bool) -> AsyncIterator[None]:
    path = make_url(url).database
    assert path
    conn = sqlite3.connect(path, timeout=5, isolation_level=None)
    try:
        if reads:
            # WAL readers never block, so "reads fail" is simulated by hiding the tables.
            for table in _READ_TABLES:
                conn.execute(f"ALTER TABLE {table} RENAME TO {table}_hidden")
            yield
            for table in _READ_TABLES:
                conn.execute(f"ALTER TABLE {table}_hidden RENAME TO {table}")
        else:
            # Another writer holding the lock: writes fail with "database is locked" once the
            # busy timeout passes, SQLite's everyday way of being unavailable.
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE registry_meta SET version = version WHERE id = -1")
            try:
                yield
            finally:
                conn.execute("ROLLBACK")
    finally:
        conn.close()


_READ_TABLES = ("registry_meta", "endpoints")


@pytest.fixture
def db_outage() -> Outage:
    """`async with db_outage(url[, reads=True]):` makes the database refuse service inside the
    block."""

    def outage(url: str, *, reads: bool = False) -> AbstractAsyncContextManager[None]:
        if url.startswith("postgresql"):
            return _pg_outage(url)
        return _sqlite_outage(url, reads)

    return outage


async def terminate_backends(url: str) -> int:
    """Kill every server connection to the database behind `url` (a brief PostgreSQL outage);
    returns how many were terminated."""
    name = make_url(url).database
    admin = await _pg_admin()
    try:
        rows = await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
    finally:
        await admin.close()
    await asyncio.sleep(0)
    return sum(1 for r in rows if r[0])
