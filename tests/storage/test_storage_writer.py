"""ObservationWriter on real SQLite and PostgreSQL: batching, the text guard, duplicates,
outages (the batch is retried, the bounded queue drops and counts), refused rows, shutdown."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.exposition import render
from domain.records import ExchangeRecord, ObservationRecord
from storage.batch import thread_entry
from storage.engine import make_engine
from storage.queries import count_rows
from storage.sql import EXCHANGES, OBSERVATIONS
from storage.textguard import text_hash
from storage.writer import ObservationWriter
from tests.fixtures_db import Outage, terminate_backends
from tests.waiting import SETTLE_S, until


def exchange(i: int, **kw: Any) -> ExchangeRecord:
    return ExchangeRecord(
        id=f"ex-{i:06d}", received_at=1000.0 + i, route="/v1/chat/completions", **kw
    )


def observation(i: int, endpoint: str = "cand", **kw: Any) -> ObservationRecord:
    fields: dict[str, Any] = {"started_at": 1000.0 + i, "status": 200, "ttft_s": 0.05}
    fields.update(kw)
    return ObservationRecord(
        exchange_id=f"ex-{i:06d}", endpoint=endpoint, arm="candidate", **fields
    )


WriterFactory = Callable[..., Awaitable[ObservationWriter]]


@pytest.fixture
async def writer_factory(db_engine: AsyncEngine) -> AsyncIterator[WriterFactory]:
    """Builds started writers on the test database and closes them after the test."""
    made: list[ObservationWriter] = []

    async def make(engine: AsyncEngine | None = None, **kw: Any) -> ObservationWriter:
        opts: dict[str, Any] = {
            "batch_size": 100,
            "flush_interval_s": 0.05,
            "queue_max": 10_000,
            "store_text": True,
            "store_text_max_chars": 4096,
            "backoff_initial_s": 0.02,
            "backoff_max_s": 0.2,
        }
        opts.update(kw)
        writer = ObservationWriter(engine or db_engine, **opts)
        await writer.start()
        made.append(writer)
        return writer

    yield make
    for writer in made:
        await writer.close(timeout_s=2.0)


async def wait_until(cond: Callable[[], bool], timeout_s: float = SETTLE_S) -> None:
    """Until the writer's `cond` holds (its own loop's next turns: tests.waiting)."""

    async def probe() -> bool:
        return cond()

    await until(probe, what="the writer's condition", within_s=timeout_s, every_s=0.01)


async def test_writes_exchanges_and_observations(
    db_engine: AsyncEngine, writer_factory: WriterFactory
) -> None:
    """Records put on the sink reach their tables, with targets stored as ",a,b," text."""
    writer = await writer_factory()
    writer.put_exchange(exchange(1, targets=("a", "b"), model="m", stream=True))
    writer.put_exchange(exchange(2))
    writer.put_observation(observation(1, output_text="hello", output_hash="h1"))
    await writer.close()
    async with db_engine.connect() as conn:
        targets = dict((await conn.execute(select(EXCHANGES.c.id, EXCHANGES.c.targets))).all())
        obs = (await conn.execute(select(OBSERVATIONS))).mappings().one()
    assert targets == {"ex-000001": ",a,b,", "ex-000002": ""}
    assert obs["output_text"] == "hello" and obs["status"] == 200 and obs["ttft_s"] == 0.05
    stats = writer.stats()
    assert stats["written_exchanges"] == 2 and stats["written_observations"] == 1
    assert stats["queue_depth"] == 0 and stats["observations_dropped"] == 0


async def test_compiled_insert_stores_what_sqlalchemy_would(
    db_engine: AsyncEngine, writer_factory: WriterFactory
) -> None:
    """Rows go to the driver through each stream's INSERT compiled once (not SQLAlchemy's
    per-row parameters), on both dialects: NULLs, floats, integers, booleans and text come
    back as written, and a duplicate is ignored as before."""
    writer = await writer_factory()
    writer.put_exchange(exchange(1, stream=True, temperature=None, turn_index=3, model="m"))
    writer.put_exchange(exchange(1, model="again"))  # same id: ON CONFLICT DO NOTHING
    writer.put_observation(
        observation(1, text_truncated=True, tpot_s=None, e2e_s=0.25, output_tokens=7,
                    finish_reason="stop", output_text="é\x00x")
    )  # fmt: skip
    await writer.close()
    assert writer._compiled["exchange"] is not None
    assert writer._compiled["observation"] is not None
    async with db_engine.connect() as conn:
        ex = (await conn.execute(select(EXCHANGES))).mappings().one()
        obs = (await conn.execute(select(OBSERVATIONS))).mappings().one()
    assert ex["model"] == "m" and ex["stream"] is True and ex["temperature"] is None
    assert ex["turn_index"] == 3 and ex["json_requested"] is False
    assert obs["text_truncated"] is True and obs["tpot_s"] is None and obs["e2e_s"] == 0.25
    assert obs["output_tokens"] == 7 and obs["finish_reason"] == "stop"
    assert obs["output_text"] == "é\ufffdx" and obs["started_at"] == 1001.0
    assert writer.stats()["written_exchanges"] == 2  # both attempted; the duplicate is ignored


async def test_inserts_bind_only_the_columns_a_chunk_gives_a_value(
    db_engine: AsyncEngine, writer_factory: WriterFactory
) -> None:
    """A chunk's INSERT leaves out the nullable, default-less columns that are None in every
    row of it (binding a None costs the SQLite driver as much as a value), and what is stored
    is what binding them would have stored: NULL where None, every value where one row of
    the chunk has it. A NOT NULL column with a server default (`finished`) is never left out."""
    writer = await writer_factory(batch_size=1000, flush_interval_s=60.0)
    for i in range(150):  # two chunks of the stream: rows 0-99 and 100-149
        extra: dict[str, Any] = {}
        if i == 120:
            extra = {"score_logprob": -0.5, "tool_calls": '[{"name":"f","arguments":"{}"}]'}
        writer.put_exchange(exchange(i))
        writer.put_observation(observation(i, e2e_s=0.25, finish_reason="stop", **extra))
    await writer.close()
    compiled = writer._compiled["observation"]
    assert compiled is not None
    # The same rows through the compiled statement: the first chunk's SQL lists neither the
    # scores nor the tool calls; the second's lists the two columns row 120 gives.
    rows = [writer._observation_stream.convert(observation(i)) for i in range(3)]
    chunk = compiled.chunk(rows)
    assert chunk is not None
    narrow_sql, params = chunk
    assert "score_logprob" not in narrow_sql and "tool_calls" not in narrow_sql
    assert "finished" in narrow_sql and "text_truncated" in narrow_sql
    assert len(params[0]) < len(compiled.keys) == len(OBSERVATIONS.c) - 1  # all but the id
    columns = {c.name: c for c in OBSERVATIONS.c}
    left_out = set(compiled.keys) - {k for k in compiled.keys if k in narrow_sql}
    assert left_out and all(
        columns[k].nullable and columns[k].server_default is None for k in left_out
    )
    async with db_engine.connect() as conn:
        stored = await conn.execute(select(OBSERVATIONS).order_by(OBSERVATIONS.c.exchange_id))
        got = stored.mappings().all()
    assert len(got) == 150 and await count_rows(db_engine, "exchanges") == 150
    for i, row in enumerate(got):
        assert row["exchange_id"] == f"ex-{i:06d}" and row["e2e_s"] == 0.25
        assert row["finish_reason"] == "stop" and row["finished"] is False
        assert row["tpot_s"] is None and row["score_kl"] is None
        assert row["score_logprob"] == (-0.5 if i == 120 else None)
        assert (row["tool_calls"] is None) is (i != 120)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_sqlite_batch_is_one_call_on_the_connections_thread(migrated_db_url: str) -> None:
    """On SQLite a batch of 250 exchanges and 250 observations is one transaction issued from
    aiosqlite's thread in one call: BEGIN IMMEDIATE, the 500 rows, COMMIT, traced by SQLite
    itself (SQLAlchemy's path would BEGIN and insert in statements of 100 rows, a hand-off
    each); and a row SQLite refuses there still costs only itself."""
    engine = make_engine(migrated_db_url)
    statements: list[str] = []

    async def write(bad: int | None) -> ObservationWriter:
        writer = ObservationWriter(
            engine, batch_size=500, flush_interval_s=60.0, queue_max=10_000, store_text=True,
            store_text_max_chars=4096,
        )  # fmt: skip
        await writer.start()
        base = 0 if bad is None else 1000
        for i in range(base, base + 250):
            writer.put_exchange(exchange(i))
            writer.put_observation(observation(i, output_tokens=2**64 if i == bad else 3))
        await writer.close()
        return writer

    try:
        async with engine.connect() as conn:  # the pool's one connection, traced
            raw = await conn.get_raw_connection()
            assert raw.driver_connection is not None
            await raw.driver_connection.set_trace_callback(statements.append)
        good = await write(None)
        begin = statements.index("BEGIN IMMEDIATE")
        batch = statements[begin : statements.index("COMMIT", begin) + 1]
        assert len(batch) == 502 and all(sql.startswith("INSERT") for sql in batch[1:-1])
        assert good.stats()["written_observations"] == 250
        assert good.stats()["written_exchanges"] == 250
        # 2**64 does not fit an INTEGER: the batch rolls back and goes row by row.
        refused = await write(1009)
        assert refused.stats()["rows_rejected"] == 1
        assert refused.stats()["written_observations"] == 249
        assert await count_rows(engine, "observations") == 499
        assert await count_rows(engine, "exchanges") == 500
    finally:
        await engine.dispose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_without_aiosqlites_thread_entry_the_writer_takes_sqlalchemys_path(
    migrated_db_url: str,
) -> None:
    """The direct path needs two private parts of aiosqlite; a driver without them is found
    out (`thread_entry` None), and the writer's other path, SQLAlchemy's, writes the same
    batch on the same SQLite file: its own BEGIN, not the direct path's, and every row stored."""
    assert thread_entry(object()) is None
    engine = make_engine(migrated_db_url)
    statements: list[str] = []
    try:
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            entry = thread_entry(driver)
            assert driver is not None and entry is not None
            assert isinstance(entry[1], sqlite3.Connection)
            await driver.set_trace_callback(statements.append)
        writer = ObservationWriter(
            engine, batch_size=500, flush_interval_s=60.0, queue_max=10_000, store_text=True,
            store_text_max_chars=4096,
        )  # fmt: skip
        writer._direct = False  # as after a driver without the entry
        await writer.start()
        for i in range(250):
            writer.put_exchange(exchange(i))
            writer.put_observation(observation(i))
        await writer.close()
        assert "BEGIN IMMEDIATE" not in statements
        inserts = [sql for sql in statements if sql.startswith("INSERT")]
        assert len(inserts) == 500  # SQLite traces each row of an executemany
        assert writer.stats()["written_observations"] == 250
        assert await count_rows(engine, "observations") == 250
        assert await count_rows(engine, "exchanges") == 250
    finally:
        await engine.dispose()
    async with make_engine(migrated_db_url).connect() as conn:  # a closed driver has none
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
    await conn.engine.dispose()
    assert thread_entry(driver) is None


async def test_batches_by_count_before_the_interval(writer_factory: WriterFactory) -> None:
    """With a long flush interval, a full batch is written as soon as it is queued."""
    writer = await writer_factory(batch_size=10, flush_interval_s=60.0)
    for i in range(25):
        writer.put_observation(observation(i))
    await wait_until(lambda: writer.stats()["written_observations"] == 20)
    assert writer.stats()["queue_depth"] == 5
    assert writer.stats()["batches"] == 2


async def test_batches_by_time(writer_factory: WriterFactory) -> None:
    """Fewer records than a batch are written once the flush interval passes."""
    writer = await writer_factory(batch_size=1000, flush_interval_s=0.05)
    for i in range(3):
        writer.put_observation(observation(i))
    await wait_until(lambda: writer.stats()["written_observations"] == 3)
    assert writer.stats()["batches"] == 1


async def test_close_flushes_everything_queued(
    db_engine: AsyncEngine, writer_factory: WriterFactory
) -> None:
    """close() writes what is still queued before returning, and later puts are counted."""
    writer = await writer_factory(batch_size=1000, flush_interval_s=60.0)
    for i in range(250):
        writer.put_exchange(exchange(i))
        writer.put_observation(observation(i))
    await writer.close()
    assert await count_rows(db_engine, "observations") == 250
    assert await count_rows(db_engine, "exchanges") == 250
    writer.put_observation(observation(999))
    assert writer.stats()["observations_dropped"] == 1


async def test_duplicates_are_ignored(
    db_engine: AsyncEngine, writer_factory: WriterFactory
) -> None:
    """A repeated (exchange_id, endpoint) or exchange id is skipped, in a batch and across
    batches, without failing the batch."""
    writer = await writer_factory()
    for _ in range(2):
        writer.put_exchange(exchange(1))
        writer.put_observation(observation(1, output_text="first"))
        writer.put_observation(observation(1, endpoint="other"))
    await writer.close()
    writer2 = await writer_factory()
    writer2.put_observation(observation(1, output_text="again"))
    await writer2.close()
    assert await count_rows(db_engine, "exchanges") == 1
    assert await count_rows(db_engine, "observations") == 2
    assert writer.stats()["db_errors"] == writer2.stats()["db_errors"] == 0


async def test_text_truncated_and_hashed(
    db_engine: AsyncEngine, writer_factory: WriterFactory
) -> None:
    """Text over store_text_max_chars is cut, flagged, and the full text's hash kept."""
    writer = await writer_factory(store_text_max_chars=10)
    long_text = "abcdefghij" * 5
    writer.put_observation(observation(1, output_text=long_text))
    await writer.close()
    async with db_engine.connect() as conn:
        row = (await conn.execute(select(OBSERVATIONS))).mappings().one()
    assert row["output_text"] == "abcdefghij"
    assert row["text_truncated"] is True
    assert row["output_hash"] == text_hash(long_text)


async def test_store_text_false_keeps_only_hashes(
    db_engine: AsyncEngine, writer_factory: WriterFactory
) -> None:
    """With store_text=False no output text or tool-call argument reaches the database."""
    writer = await writer_factory(store_text=False)
    tools = '[{"name":"get_weather","arguments":"{\\"city\\":\\"Paris\\"}"}]'
    writer.put_observation(observation(1, output_text="secret answer", tool_calls=tools))
    await writer.close()
    async with db_engine.connect() as conn:
        row = (await conn.execute(select(OBSERVATIONS))).mappings().one()
    assert row["output_text"] is None
    assert row["output_hash"] == text_hash("secret answer")
    assert "Paris" not in row["tool_calls"] and "get_weather" in row["tool_calls"]


async def test_nul_and_overlong_strings_are_made_insertable(
    db_engine: AsyncEngine, writer_factory: WriterFactory
) -> None:
    """NUL characters (refused by PostgreSQL text) and strings longer than their column are
    fixed instead of failing the batch."""
    writer = await writer_factory()
    writer.put_observation(
        observation(1, output_text="a\x00b", error_kind="x" * 100, finish_reason="stop")
    )
    await writer.close()
    async with db_engine.connect() as conn:
        row = (await conn.execute(select(OBSERVATIONS))).mappings().one()
    assert row["output_text"] == "a\ufffdb" and row["error_kind"] == "x" * 32
    assert writer.stats()["rows_rejected"] == 0


async def test_refused_rows_are_dropped_alone(
    db_engine: AsyncEngine, writer_factory: WriterFactory
) -> None:
    """A row the database refuses (an integer out of range) is dropped and counted; the rest
    of its batch is written."""
    writer = await writer_factory(batch_size=50, flush_interval_s=60.0)
    for i in range(50):
        writer.put_observation(observation(i, output_tokens=2**64 if i == 7 else 10))
    await writer.close()
    stats = writer.stats()
    assert stats["rows_rejected"] == 1
    assert stats["written_observations"] == 49
    assert await count_rows(db_engine, "observations") == 49


async def test_malformed_record_costs_only_itself(
    db_engine: AsyncEngine, writer_factory: WriterFactory
) -> None:
    """A record with wrong field types (records are not validated on construction) is dropped
    and counted; the writer keeps running and writes its neighbours."""
    writer = await writer_factory(store_text=False)
    writer.put_observation(observation(1))
    writer.put_observation(observation(2, tool_calls=123))  # not JSON text
    writer.put_observation(observation(3))
    await writer.close()
    assert writer.stats()["rows_rejected"] == 1
    assert await count_rows(db_engine, "observations") == 2


async def test_recovers_after_outage(
    migrated_db_url: str, db_outage: Outage, writer_factory: WriterFactory
) -> None:
    """While the database is down the batch is retried with backoff and nothing is lost; once
    it is back every record is written."""
    engine = make_engine(migrated_db_url, busy_timeout_ms=50)
    try:
        writer = await writer_factory(engine, batch_size=50)
        for i in range(100):
            writer.put_observation(observation(i))
        await wait_until(lambda: writer.stats()["written_observations"] == 100)
        async with db_outage(migrated_db_url):
            for i in range(100, 300):
                writer.put_observation(observation(i))
            await wait_until(lambda: writer.stats()["retries"] >= 2)
            assert writer.stats()["written_observations"] == 100
        await writer.close()
        stats = writer.stats()
        assert stats["written_observations"] == 300
        assert stats["observations_dropped"] == 0 and stats["rows_rejected"] == 0
        assert stats["db_errors"] >= 2
        assert await count_rows(engine, "observations") == 300
    finally:
        await engine.dispose()


async def test_brief_interruption_costs_nothing(
    migrated_db_url: str, writer_factory: WriterFactory
) -> None:
    """Server connections cut under the writer (PostgreSQL: pg_terminate_backend; SQLite: the
    engine's connections are discarded) are replaced, and every record is written."""
    engine = make_engine(migrated_db_url)
    try:
        writer = await writer_factory(engine, batch_size=20)
        for round_ in range(5):
            for i in range(40):
                writer.put_observation(observation(round_ * 40 + i))

            def reached(n: int = 40 * (round_ + 1)) -> bool:
                return writer.stats()["written_observations"] == n

            await wait_until(reached)
            if migrated_db_url.startswith("postgresql"):
                assert await terminate_backends(migrated_db_url) >= 1
            else:
                await engine.dispose()
        await writer.close()
        assert writer.stats()["written_observations"] == 200
        assert await count_rows(engine, "observations") == 200
    finally:
        await engine.dispose()


async def test_full_queue_drops_and_counts(
    migrated_db_url: str, db_outage: Outage, writer_factory: WriterFactory
) -> None:
    """During an outage the queue stops at queue_max and the overflow is dropped and counted:
    written + dropped always equals what was put."""
    engine = make_engine(migrated_db_url, busy_timeout_ms=50)
    try:
        writer = await writer_factory(engine, batch_size=10, queue_max=50)
        async with db_outage(migrated_db_url):
            for i in range(500):
                writer.put_observation(observation(i))
            assert writer.stats()["queue_depth"] <= 50 + 10
            await wait_until(lambda: writer.stats()["retries"] >= 1)
        await writer.close()
        stats = writer.stats()
        assert stats["observations_dropped"] >= 440
        assert stats["written_observations"] + stats["observations_dropped"] == 500
        assert await count_rows(engine, "observations") == stats["written_observations"]
    finally:
        await engine.dispose()


async def test_close_deadline_during_outage_counts_the_rest(
    migrated_db_url: str, db_outage: Outage, writer_factory: WriterFactory
) -> None:
    """close() returns by its deadline even when the database is down, and counts every record
    it could not write as dropped."""
    engine = make_engine(migrated_db_url, busy_timeout_ms=50)
    try:
        writer = await writer_factory(engine, batch_size=10)
        async with db_outage(migrated_db_url):
            for i in range(35):
                writer.put_exchange(exchange(i))
                writer.put_observation(observation(i))
            await wait_until(lambda: writer.stats()["retries"] >= 1)
            await writer.close(timeout_s=0.3)
        stats = writer.stats()
        assert stats["queue_depth"] == 0
        assert stats["written_observations"] + stats["observations_dropped"] == 35
        assert stats["written_exchanges"] + stats["exchanges_dropped"] == 35
    finally:
        await engine.dispose()


async def test_prometheus_lines(writer_factory: WriterFactory) -> None:
    """Every stat is exported with HELP and TYPE, counters suffixed _total."""
    writer = await writer_factory()
    writer.put_observation(observation(1))
    await writer.close()
    text = "\n".join(render(writer.prometheus_lines()))
    assert "# TYPE canary_writer_queue_depth gauge" in text
    assert "canary_writer_written_observations_total 1" in text
    assert "canary_writer_observations_dropped_total 0" in text
