"""`canary db`: apply and inspect the schema migrations (`upgrade`, `current`, `downgrade`).

The Alembic environment ships inside the installed package, so these work from any directory.
The database is `--db URL`, else `db_url` from `--config FILE` / `CANARY_STORAGE_DB_URL`, else the
default SQLite file. Passwords in URLs are never printed.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from domain.errors import EXIT_OK, UsageError

_URL_HELP = (
    "database URL, e.g. sqlite+aiosqlite:///./canary.db or "
    "postgresql+asyncpg://USER@HOST/DB (default: db_url from --config or CANARY_STORAGE_DB_URL)"
)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "db",
        help="database schema: upgrade, current, downgrade",
        description="Apply or inspect canary-gateway's schema migrations (Alembic).",
    )
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    upgrade = actions.add_parser("upgrade", help="migrate the schema to the latest revision")
    upgrade.add_argument(
        "revision", nargs="?", default="head", help="target revision (default: head)"
    )
    actions.add_parser("current", help="print the database's revision and whether it is current")
    downgrade = actions.add_parser(
        "downgrade", help="migrate the schema back to REVISION ('base' drops every table)"
    )
    downgrade.add_argument("revision", metavar="REVISION")
    for action in (upgrade, actions.choices["current"], downgrade):
        action.add_argument("--db", metavar="URL", help=_URL_HELP)
        action.add_argument("--config", metavar="FILE", help="gateway config file (for db_url)")
    parser.set_defaults(func=run)


def _db_url(args: argparse.Namespace) -> str:
    from gateway.config.load import load_config

    url: str = args.db or load_config(args.config).storage.db_url
    if not url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
        raise UsageError(
            f"--db: must start with sqlite+aiosqlite:// or postgresql+asyncpg://, got {url!r}"
        )
    return url


async def _current(url: str) -> str:
    from storage.engine import current_revision

    revs, state = await current_revision(url)
    return f"{', '.join(revs) or '(none)'} ({state})"


async def _act(action: str, url: str, revision: str) -> None:
    from storage.engine import downgrade, masked, upgrade

    before = await _current(url)
    if action == "upgrade":
        await upgrade(url, revision)
    else:
        await downgrade(url, revision)
    print(f"{masked(url)}: {before} -> {await _current(url)}")


def run(args: argparse.Namespace) -> int:
    from alembic.util import CommandError

    from storage.engine import masked, require_existing_database

    url = _db_url(args)
    if args.db_action == "current":  # read-only: never creates a database
        require_existing_database(url)
    try:
        if args.db_action == "current":
            print(f"{masked(url)}: {asyncio.run(_current(url))}")
        else:
            asyncio.run(_act(args.db_action, url, args.revision))
    except CommandError as exc:  # Alembic's own (an unknown revision): the operator's input
        raise UsageError(str(exc)) from exc
    return EXIT_OK
