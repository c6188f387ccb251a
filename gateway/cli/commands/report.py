"""`canary report NAME`: the promotion report of one candidate, read straight from storage.

The database is `--db URL`, else `db_url` from `--config FILE` / `CANARY_STORAGE_DB_URL`. Verdict
settings are the config's `[verdict]` table with the candidate's own overrides on top. A
progress bar is drawn on stderr while a large window loads. Exit codes: 0 a report was written
(whatever its verdict), 2 bad input (unknown candidate, bad --since, schema mismatch), 1 the
database failed.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from domain.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from evaluators.judge.settings import VerdictSettings
    from evaluators.pairs.spill import Spill
    from evaluators.report.model import Report

# Windows this large get a progress bar while loading.
PROGRESS_MIN_ROWS = 50_000
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: str, *, now: float | None = None) -> float:
    """Epoch seconds from `1700000000`, an ISO 8601 instant, or a relative age (`30m`, `2h`,
    `7d`, `1w`: that long ago). Naive ISO times are UTC."""
    value = value.strip()
    now = time.time() if now is None else now
    if m := _RELATIVE.match(value):
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageError(
            f"--since/--until: {value!r} is not epoch seconds, ISO 8601, or an age like 2h"
        ) from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def register(sub: argparse._SubParsersAction[Any]) -> None:
    from gateway.cli.commands.candidates import subparser

    p = subparser(
        sub,
        "report",
        help="the promotion report of a candidate: verdict, reasons, metrics",
        description=(
            "Compare a candidate with production (and the control) over the mirrored pairs in "
            "storage, and print the verdict (promote / hold / reject) with one reason per "
            "metric, the metric tables, the copy accounting, TTFT by turn and each arm's load. "
            "The JSON format is a stable schema (evaluators/SCHEMA.md); HTML is one "
            "self-contained page with plots. Exit codes: 0 report written, 2 bad input, "
            "1 the database failed."
        ),
        examples=(
            "canary report int8",
            "canary report bi-kv --since 2h --format html --out bi-kv.html",
            "canary report int8 --db postgresql+asyncpg://canary@db/canary --format json",
        ),
    )
    p.add_argument("name", help="the candidate")
    p.add_argument("--db", metavar="URL", help="database URL (default: db_url from the config)")
    p.add_argument("--config", metavar="FILE", help="gateway config file (db_url, [verdict])")
    p.add_argument(
        "--since",
        metavar="T",
        help="only pairs received since T: epoch seconds, ISO 8601, or an age (30m, 2h, 7d); "
        "default: since the candidate was registered",
    )
    p.add_argument("--until", metavar="T", help="only pairs received before T (same forms)")
    p.add_argument(
        "--format", choices=("text", "markdown", "json", "html"), default="text", help="(text)"
    )
    p.add_argument("--out", metavar="FILE", help="write the report here instead of stdout")
    p.add_argument(
        "--planned-look",
        action="store_true",
        help="this is a planned (final) look: guardrails beyond their margin reject (Holm), "
        "and tail quantiles are bootstrapped",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="judge with the strict preset of margins (0.1 pp failures, α = 0.025; "
        "`canary plan --strict` says how long it takes)",
    )
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> tuple[str, VerdictSettings, Spill]:
    from evaluators.judge.settings import STRICT, VerdictSettings
    from evaluators.pairs.spill import Spill, default_dir
    from gateway.config.load import load_config

    cfg = load_config(args.config)
    url: str = args.db or cfg.storage.db_url
    if not url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
        raise UsageError(
            f"--db: must start with sqlite+aiosqlite:// or postgresql+asyncpg://, got {url!r}"
        )
    from storage.engine import require_existing_database

    require_existing_database(url)  # a report never creates an empty database
    # A large window's columns go to a file, as in the gateway's report process.
    spill = Spill(cfg.reports.spill_dir or default_dir(url), cfg.reports.spill_over_bytes)
    settings = VerdictSettings().with_overrides(cfg.verdict)
    return url, settings.with_overrides(STRICT) if args.strict else settings, spill


async def _report(
    url: str, args: argparse.Namespace, settings: VerdictSettings, spill: Spill
) -> Report:
    from evaluators.report.build import evaluate
    from gateway.cli.progress import Progress
    from storage.engine import ensure_schema, make_engine

    def progress(total: int) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
        if total < PROGRESS_MIN_ROWS:
            return None, lambda: None
        bar = Progress(total, f"loading {args.name}")
        return bar.advance, bar.close

    since = parse_time(args.since) if args.since else None
    until = parse_time(args.until) if args.until else None
    engine = make_engine(url)
    try:
        await ensure_schema(engine, url, auto_upgrade_empty_sqlite=False)
        return await evaluate(
            engine,
            args.name,
            since=since,
            until=until,
            settings=settings,
            planned_look=args.planned_look,
            progress=progress,
            spill=spill,
        )
    finally:
        await engine.dispose()


def run(args: argparse.Namespace) -> int:
    from evaluators.report.render import render
    from gateway.cli.escape import safe_for, terminal_safe

    url, settings, spill = _settings(args)
    report = asyncio.run(_report(url, args, settings, spill))
    text = render(safe_for(report, args.format), args.format)
    if args.format in ("text", "markdown"):
        text = terminal_safe(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"{report.candidate}: {report.verdict} (report written to {args.out})")
    else:
        sys.stdout.write(text)
    return EXIT_OK
