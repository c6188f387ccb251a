"""Alembic plumbing: the programmatic config of the shipped migrations package and the
synchronous steps run on a connection (inside `AsyncConnection.run_sync`).

Never reads alembic.ini from the working directory: the file inside the `migrations` package is
the only one, so `canary db upgrade` behaves the same from any cwd after `pip install`. The URL
is handed over in `Config.attributes`, never interpolated into the ini (a `%` in a password
would break ConfigParser).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, inspect

from domain.errors import StorageError
from storage.models import Base

SchemaState = Literal["empty", "current", "behind", "ahead"]


def migrations_dir() -> Path:
    """The directory of the installed `migrations` package (it holds alembic.ini)."""
    import migrations

    # __path__ rather than __file__: an editable install may expose the package as a namespace.
    for entry in migrations.__path__:
        if (Path(entry) / "alembic.ini").is_file():
            return Path(entry)
    raise StorageError(f"no alembic.ini in the migrations package ({list(migrations.__path__)})")


def alembic_config(db_url: str | None = None, connection: Connection | None = None) -> Config:
    """An Alembic Config for the shipped migrations; env.py reads `db_url` / `connection`
    from its attributes."""
    here = migrations_dir()
    cfg = Config(str(here / "alembic.ini"))
    cfg.set_main_option("script_location", str(here))
    if db_url is not None:
        cfg.attributes["db_url"] = db_url
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def _script() -> ScriptDirectory:
    # Parsing the revision files once per process is enough: they ship with the code.
    return ScriptDirectory.from_config(alembic_config())


def head_revisions() -> tuple[str, ...]:
    """The revision(s) this code expects the database to be at."""
    return tuple(_script().get_heads())


def all_revisions() -> list[str]:
    """Every revision id, oldest first."""
    return [rev.revision for rev in reversed(list(_script().walk_revisions()))]


def current_revisions(conn: Connection) -> tuple[str, ...]:
    """The revision(s) stamped in the database (empty when never migrated)."""
    return tuple(MigrationContext.configure(conn).get_current_heads())


def state_of(conn: Connection) -> SchemaState:
    """Compare the database's stamped revision with the code's head."""
    current = current_revisions(conn)
    if not current:
        ours = set(Base.metadata.tables)
        present = set(inspect(conn).get_table_names())
        # Tables without a stamp: created some other way; an upgrade would collide with them.
        return "behind" if ours & present else "empty"
    if set(current) == set(head_revisions()):
        return "current"
    for rev in current:
        try:
            if _script().get_revision(rev) is None:
                return "ahead"
        except CommandError:
            return "ahead"
    return "behind"


def run_upgrade(conn: Connection, revision: str) -> None:
    command.upgrade(alembic_config(connection=conn), revision)


def run_downgrade(conn: Connection, revision: str) -> None:
    command.downgrade(alembic_config(connection=conn), revision)
