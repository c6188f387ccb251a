"""The engine factory on SQLite and PostgreSQL: per-dialect settings, URL handling, and
reconnecting after the server drops its connections."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.errors import StorageError
from storage import queries
from storage.engine import make_engine, masked
from tests.fixtures_db import terminate_backends


async def test_dialect_settings(db_engine: AsyncEngine) -> None:
    """SQLite runs in WAL mode with a busy timeout and foreign keys on; PostgreSQL connections
    carry the application name and the pool pre-pings."""
    async with db_engine.connect() as conn:
        if db_engine.dialect.name == "sqlite":
            pragmas = {
                name: (await conn.execute(text(f"PRAGMA {name}"))).scalar()
                for name in ("journal_mode", "busy_timeout", "foreign_keys", "synchronous")
            }
            assert pragmas == {
                "journal_mode": "wal",
                "busy_timeout": 5000,
                "foreign_keys": 1,
                "synchronous": 1,
            }
        else:
            name = (await conn.execute(text("SHOW application_name"))).scalar()
            assert name == "canary-gateway" and db_engine.pool._pre_ping


async def test_reads_run_inside_the_transaction(db_engine: AsyncEngine) -> None:
    """On SQLite a transaction's first SELECT already runs after BEGIN (SQLAlchemy emits it, not
    sqlite3's legacy mode), so its reads are one snapshot; PostgreSQL is READ COMMITTED."""
    async with db_engine.connect() as conn:
        read = text("SELECT version FROM registry_meta")
        assert (await conn.execute(read)).scalar() == 0
        async with db_engine.begin() as other:
            await other.execute(text("UPDATE registry_meta SET version = 5"))
        expected = 0 if db_engine.dialect.name == "sqlite" else 5
        assert (await conn.execute(read)).scalar() == expected
        await conn.rollback()
    assert await queries.registry_version(db_engine) == 5


async def test_reconnects_after_terminated_backends(db_engine: AsyncEngine, db_url: str) -> None:
    """After the server kills every connection (pg_terminate_backend), the next query works
    without an error reaching the caller (pool pre-ping); on SQLite, after a pool reset."""
    await queries.registry_version(db_engine)
    if db_url.startswith("postgresql"):
        assert await terminate_backends(db_url) >= 1
    else:
        await db_engine.dispose()
    assert await queries.registry_version(db_engine) == 0


@pytest.mark.parametrize(
    "url",
    ["sqlite:///x.db", "postgresql://u@h/db", "mysql+aiomysql://u@h/db", "not a url"],
)
async def test_unsupported_urls_are_refused(url: str) -> None:
    """Only sqlite+aiosqlite and postgresql+asyncpg are accepted, with a readable message."""
    with pytest.raises(StorageError, match="URL"):
        make_engine(url)


async def test_masked_hides_passwords() -> None:
    """URLs in messages never show a password."""
    shown = masked("postgresql+asyncpg://user:s3cret@db.example:5432/canary")
    assert "s3cret" not in shown and "user" in shown and "db.example" in shown
