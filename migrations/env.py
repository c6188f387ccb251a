"""Alembic environment for canary-gateway (SQLite via aiosqlite, PostgreSQL via asyncpg).

Called three ways: by `storage.engine.upgrade` with an open connection in
`config.attributes["connection"]` (the normal path), by the `alembic` command line with
`-x db=URL` (development: `revision --autogenerate`), and offline (`--sql`) to print SQL.
It never configures logging: the gateway owns that.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection

from storage.engine import make_engine
from storage.models import Base

config = context.config
target_metadata = Base.metadata


def _db_url() -> str:
    url = config.attributes.get("db_url") or context.get_x_argument(as_dictionary=True).get("db")
    if not url:
        raise SystemExit("no database URL: pass -x db=URL (or use `canary db upgrade --db URL`)")
    return str(url)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode recreates the table.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_new_engine(url: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(
        url=_db_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()
elif (conn := config.attributes.get("connection")) is not None:
    _run(conn)
else:
    asyncio.run(_run_with_new_engine(_db_url()))
