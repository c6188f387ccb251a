"""Alembic migrations on SQLite and PostgreSQL: every step up and down on an empty and on a
populated database, models.py agreeing with the latest revision, the schema gate
(`ensure_schema`) and `canary db` from any directory."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from domain.errors import SchemaAhead, SchemaBehind
from domain.records import ExchangeRecord, ObservationRecord
from storage import migrate, queries
from storage.engine import (
    downgrade,
    ensure_schema,
    make_engine,
    schema_state,
    upgrade,
)
from storage.models import Base
from tests.graded_store import write_records

REVISIONS = migrate.all_revisions()
LIVE = Endpoint(name="prod", url="http://127.0.0.1:9000", role="live")


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names()) & set(Base.metadata.tables)


async def tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return await conn.run_sync(_tables)


async def populate(engine: AsyncEngine) -> None:
    """Rows in every table, written the way the gateway writes them."""
    await queries.seed(engine, LIVE, [Endpoint(name="a", url="http://127.0.0.1:9101")])
    await queries.promote(
        engine, "a", actor="t", reason="r", forced=True, verdict="hold", report_snapshot="{}"
    )
    await queries.upsert_counters(engine, "r1", {"a": {"sampled": 2}})
    exchanges = [
        ExchangeRecord(id=f"x{i}", received_at=1.0, route="/v1/completions") for i in range(5)
    ]
    observations = [
        ObservationRecord(exchange_id=f"x{i}", endpoint=name, arm=arm, started_at=1.0)  # type: ignore[arg-type]
        for i in range(5)
        for arm, name in (("production", "prod"), ("candidate", "a"))
    ]
    await write_records(engine, exchanges=exchanges, observations=observations)


async def row_counts(engine: AsyncEngine) -> dict[str, int]:
    return {
        t: await queries.count_rows(engine, t)
        for t in ("endpoints", "exchanges", "observations", "promotions", "mirror_counters")
    }


async def test_revisions_form_one_line() -> None:
    """The revision history is linear with a single head (no unmerged branches)."""
    assert len(migrate.head_revisions()) == 1
    assert REVISIONS[-1] == migrate.head_revisions()[0] and len(REVISIONS) >= 1


async def test_up_and_down_on_empty_database(db_url: str) -> None:
    """From empty, each revision applies and reverts in turn, ending empty again."""
    engine = make_engine(db_url)
    try:
        assert await schema_state(engine) == "empty"
        for rev in REVISIONS:
            await upgrade(db_url, rev)
        assert await schema_state(engine) == "current"
        assert await tables(engine) == set(Base.metadata.tables)
        for rev in reversed(["base", *REVISIONS[:-1]]):
            await downgrade(db_url, rev)
        assert await schema_state(engine) == "empty"
        assert await tables(engine) == set()
        await upgrade(db_url)
        assert await schema_state(engine) == "current"
    finally:
        await engine.dispose()


async def test_up_and_down_on_populated_database(migrated_db_url: str) -> None:
    """Rows survive every downgrade step short of base and the upgrades back to head; base
    drops the tables and head recreates them empty (with the registry row)."""
    engine = make_engine(migrated_db_url)
    try:
        await populate(engine)
        counts = await row_counts(engine)
        assert counts == {
            "endpoints": 2,
            "exchanges": 5,
            "observations": 10,
            "promotions": 1,
            "mirror_counters": 1,
        }
        for rev in reversed(REVISIONS[:-1]):
            await downgrade(migrated_db_url, rev)
            assert await row_counts(engine) == counts
        for rev in REVISIONS[1:]:
            await upgrade(migrated_db_url, rev)
            assert await row_counts(engine) == counts
        assert (await queries.load_endpoints(engine))[1][0].name == "a"
        await downgrade(migrated_db_url, "base")
        assert await tables(engine) == set()
        await upgrade(migrated_db_url)
        assert await row_counts(engine) == dict.fromkeys(counts, 0)
        assert await queries.registry_version(engine) == 0
        await queries.seed(engine, LIVE, [])
        assert await queries.registry_version(engine) == 1
    finally:
        await engine.dispose()


def _diff(conn: Connection) -> list[object]:
    context = MigrationContext.configure(conn, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


async def test_models_match_latest_migration(db_engine: AsyncEngine) -> None:
    """Autogenerate finds nothing to change between storage/models.py and the head schema."""
    async with db_engine.connect() as conn:
        assert await conn.run_sync(_diff) == []


async def test_database_refuses_a_second_live_endpoint(db_engine: AsyncEngine) -> None:
    """The partial unique index rejects a second live row even from a raw update."""
    await queries.seed(db_engine, LIVE, [Endpoint(name="a", url="http://127.0.0.1:9101")])
    with pytest.raises(IntegrityError):
        async with db_engine.begin() as conn:
            await conn.execute(text("UPDATE endpoints SET role = 'live' WHERE name = 'a'"))


async def test_ensure_schema_on_empty_database(db_url: str) -> None:
    """An empty SQLite file is upgraded in place; an empty PostgreSQL database (or SQLite with
    auto-upgrade off) is refused with a message naming `canary db upgrade --db`."""
    engine = make_engine(db_url)
    try:
        if db_url.startswith("sqlite"):
            with pytest.raises(SchemaBehind, match="canary db upgrade --db"):
                await ensure_schema(engine, db_url, auto_upgrade_empty_sqlite=False)
            await ensure_schema(engine, db_url)
            assert await schema_state(engine) == "current"
        else:
            with pytest.raises(SchemaBehind, match="run `canary db upgrade --db postgresql"):
                await ensure_schema(engine, db_url)
            assert await schema_state(engine) == "empty"
    finally:
        await engine.dispose()


async def test_ensure_schema_refuses_an_older_schema(db_url: str) -> None:
    """A database at an older revision is "behind" and refused, even SQLite; nothing is
    migrated implicitly."""
    if len(REVISIONS) < 2:
        pytest.fail("needs at least two revisions")
    await upgrade(db_url, REVISIONS[-2])
    engine = make_engine(db_url)
    try:
        assert await schema_state(engine) == "behind"
        with pytest.raises(SchemaBehind, match=r"older than this .* run `canary db upgrade"):
            await ensure_schema(engine, db_url)
        assert await schema_state(engine) == "behind"
    finally:
        await engine.dispose()


async def test_ensure_schema_refuses_a_newer_schema(db_engine: AsyncEngine) -> None:
    """A database stamped with a revision this code does not know is "ahead" and refused."""
    async with db_engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    assert await schema_state(db_engine) == "ahead"
    with pytest.raises(SchemaAhead, match="newer"):
        await ensure_schema(db_engine, str(db_engine.url))


async def test_unstamped_tables_are_not_empty(db_url: str) -> None:
    """Tables created without Alembic count as "behind", so no upgrade collides with them."""
    engine = make_engine(db_url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.tables["exchanges"].create)
        assert await schema_state(engine) == "behind"
    finally:
        await engine.dispose()


async def test_concurrent_upgrades_are_safe(db_url: str) -> None:
    """Several processes upgrading the same empty database at once all succeed (SQLite: also
    N workers auto-upgrading a new file at first start); the schema is created once."""
    engines = [make_engine(db_url) for _ in range(4)]
    try:
        if db_url.startswith("sqlite"):
            await asyncio.gather(*(ensure_schema(e, db_url) for e in engines))
        await asyncio.gather(*(upgrade(db_url) for _ in range(4)))
        assert await schema_state(engines[0]) == "current"
        assert await queries.registry_version(engines[0]) == 0
    finally:
        for engine in engines:
            await engine.dispose()


async def _canary(cwd: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli.main",
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_canary_db_commands_from_any_directory(db_url: str, tmp_path: Path) -> None:
    """`canary db upgrade/current/downgrade --db URL` work from an unrelated directory (the
    Alembic files ship inside the package); a bad revision exits 2 with one line."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    code, out, err = await _canary(cwd, "db", "current", "--db", db_url)
    if db_url.startswith("sqlite"):  # no file yet: a read-only command never creates one
        assert code == 2 and "no database" in err, err
    else:
        assert code == 0 and "(empty)" in out, err
    code, out, err = await _canary(cwd, "db", "upgrade", "--db", db_url)
    assert code == 0 and f"-> {REVISIONS[-1]} (current)" in out, err
    code, out, err = await _canary(cwd, "db", "downgrade", "nonsense", "--db", db_url)
    assert code == 2 and "nonsense" in err and "Traceback" not in err
    code, out, err = await _canary(cwd, "db", "downgrade", "base", "--db", db_url)
    assert code == 0 and "(empty)" in out.split("->")[1], err


async def test_canary_db_unreachable_database(tmp_path: Path) -> None:
    """An unreachable database exits 1 with a one-line message and no password."""
    code, _, err = await _canary(
        tmp_path, "db", "upgrade", "--db", "postgresql+asyncpg://u:s3cret@127.0.0.1:1/x"
    )
    assert code == 1 and "s3cret" not in err and "Traceback" not in err
    assert "127.0.0.1:1" in err


async def test_target_rps_revision_up_and_down(db_url: str) -> None:
    """0004 adds `endpoints.target_rps` (NULL on existing rows) and its downgrade removes it,
    keeping every row and the one-live index (SQLite copies the table to drop a column)."""
    await upgrade(db_url, "0003")
    engine = make_engine(db_url)
    try:
        async with engine.begin() as conn:
            for name, role in (("prod", "live"), ("a", "candidate"), ("b", "candidate")):
                await conn.execute(
                    text(
                        "INSERT INTO endpoints (name, url, role, kind, sample_rate, sampling, "
                        "buffer_max_items, buffer_max_bytes, concurrency, timeout_s, gpus, "
                        "forward_auth, state, version, created_at, updated_at) VALUES (:n, "
                        "'http://127.0.0.1:9', :r, '', 0.1, 'request', 1, 1, 1, 1.0, 1, "
                        "false, 'active', 1, 0, 0)"
                    ),
                    {"n": name, "r": role},
                )
        await upgrade(db_url, "0004")  # raw SQL: today's queries expect the head schema
        async with engine.begin() as conn:
            rows = await conn.execute(text("SELECT target_rps FROM endpoints ORDER BY id"))
            assert [r[0] for r in rows] == [None, None, None]
            await conn.execute(text("UPDATE endpoints SET target_rps = 20.0 WHERE name = 'a'"))
            got = await conn.execute(text("SELECT target_rps FROM endpoints WHERE name = 'a'"))
            assert got.scalar_one() == 20.0
        await downgrade(db_url, "0003")
        async with engine.connect() as conn:
            columns = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("endpoints")}
            )
            assert "target_rps" not in columns and "sample_rate" in columns
            assert (await conn.execute(text("SELECT count(*) FROM endpoints"))).scalar_one() == 3
        with pytest.raises(IntegrityError):
            async with engine.begin() as conn:
                await conn.execute(text("UPDATE endpoints SET role = 'live' WHERE name = 'b'"))
        await upgrade(db_url)
        assert (await queries.get_endpoint(engine, "a")).target_rps is None
    finally:
        await engine.dispose()


async def test_verdict_rename_revision_up_and_down(db_url: str) -> None:
    """0005 renames `endpoints.verdict_overrides` to `verdict` (the one name of the field) and
    back, keeping each row's overrides and the one-live index."""
    await upgrade(db_url, "0004")
    engine = make_engine(db_url)
    try:
        async with engine.begin() as conn:
            for name, role, overrides in (
                ("prod", "live", None),
                ("a", "candidate", '{"alpha": 0.01}'),
            ):
                await conn.execute(
                    text(
                        "INSERT INTO endpoints (name, url, role, kind, sample_rate, sampling, "
                        "buffer_max_items, buffer_max_bytes, concurrency, timeout_s, gpus, "
                        "forward_auth, state, verdict_overrides, version, created_at, updated_at) "
                        "VALUES (:n, 'http://127.0.0.1:9', :r, '', 0.1, 'request', 1, 1, 1, 1.0, "
                        "1, false, 'active', :v, 1, 0, 0)"
                    ),
                    {"n": name, "r": role, "v": overrides},
                )
        await upgrade(db_url, "0005")  # raw SQL: today's queries expect the head schema
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT name, verdict FROM endpoints ORDER BY id"))
            assert [tuple(r) for r in rows] == [("prod", None), ("a", '{"alpha": 0.01}')]
        await downgrade(db_url, "0004")
        async with engine.connect() as conn:
            got = await conn.execute(
                text("SELECT verdict_overrides FROM endpoints WHERE name = 'a'")
            )
            assert got.scalar_one() == '{"alpha": 0.01}'
        with pytest.raises(IntegrityError):
            async with engine.begin() as conn:
                await conn.execute(text("UPDATE endpoints SET role = 'live' WHERE name = 'a'"))
        await upgrade(db_url)
        assert (await queries.get_endpoint(engine, "a")).verdict == {"alpha": 0.01}
    finally:
        await engine.dispose()


async def test_rollouts_revision_up_and_down(db_url: str) -> None:
    """0008 adds `rollouts` and `rollout_events` (with the one-open-rollout index) to a populated
    0007 database, and its downgrade drops them, keeping the endpoints and the promotions."""
    await upgrade(db_url, "0007")
    engine = make_engine(db_url)
    try:
        assert {"rollouts", "rollout_events"} & await tables(engine) == set()
        # Populated by today's queries at the head, then brought down to 0008 (the later
        # revisions' downgrades keep these rows).
        await upgrade(db_url)
        await populate(engine)
        await downgrade(db_url, "0008")
        counts = await row_counts(engine)
        opened = (
            "INSERT INTO rollouts (candidate, live, state, weight, step, steps, min_step_s, "
            "salt, generation, started_at, step_started_at, updated_at) VALUES "
            "('b', 'a', 'running', 1, 0, '[1.0, 100.0]', 0, '00', 1, 0, 0, 0)"
        )
        async with engine.begin() as conn:
            await conn.execute(text(opened))
            await conn.execute(
                text(
                    "INSERT INTO rollout_events (rollout_id, at, kind, from_weight, to_weight, "
                    "step, actor, reason) SELECT id, 0, 'start', 0, 1, 0, 't', 'r' FROM rollouts"
                )
            )
        with pytest.raises(IntegrityError):
            async with engine.begin() as conn:
                await conn.execute(text(opened))
        await downgrade(db_url, "0007")
        assert {"rollouts", "rollout_events"} & await tables(engine) == set()
        assert await row_counts(engine) == counts
        await upgrade(db_url)
        assert await queries.count_rows(engine, "rollouts") == 0
        assert await row_counts(engine) == counts
    finally:
        await engine.dispose()


async def test_gradings_revision_up_and_down(db_url: str) -> None:
    """0011 adds `endpoints.grader` (NULL on existing rows) and the `gradings` table to a
    populated database; its downgrade drops both and keeps every other row."""
    await upgrade(db_url)
    engine = make_engine(db_url)
    try:
        await populate(engine)
        await downgrade(db_url, "0009")
        counts = await row_counts(engine)
        assert "gradings" not in await tables(engine)
        async with engine.connect() as conn:
            columns = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("endpoints")}
            )
        assert "grader" not in columns and "verdict" in columns
        await upgrade(db_url, "0011")
        assert await row_counts(engine) == counts
        assert (await queries.get_endpoint(engine, "a")).grader is None
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO gradings (exchange_id, endpoint, reference, graded_at, "
                    "candidate_first, swapped, outcome, winner, candidate_chars, "
                    "reference_chars, prompt_tokens, completion_tokens, attempts) VALUES "
                    "('x0', 'a', 'prod', 1.0, true, false, 'graded', 'tie', 3, 4, 50, 7, 1)"
                )
            )
        assert await queries.count_rows(engine, "gradings") == 1
        await downgrade(db_url, "0009")
        assert "gradings" not in await tables(engine)
        assert await row_counts(engine) == counts
    finally:
        await engine.dispose()
