"""BatchWriter: the one bounded, batched path from the gateway to a table (observations and
exchanges, captured bodies).

Records reach it by `put` — synchronous, O(1), never waits: appended to a queue bounded by
`queue_max` records across its streams (so a database outage costs bounded memory; a stream may
have a bound of its own instead), or, when it is full or the writer is closing, dropped and
counted on the stream's `dropped` counter — or
from a stream's `pull`, a callable that hands over up to n records from a bounded queue its
owner keeps (the capture sink, which also budgets bytes). One owned task drains them in batches
— when `batch_size` records are waiting or `flush_interval_s` has passed — with executemany-style
INSERT … ON CONFLICT DO NOTHING (duplicates are ignored, on both dialects), in statements of at
most 100 rows so the event loop the proxy shares is never held long. Each stream's INSERT is
compiled once and its rows go to the driver as parameter tuples (`_Compiled`), not through
SQLAlchemy's per-row parameter construction, which cost more than the database's own work.

With `retry` (observations) a batch is never lost to an unreachable database: it is retried
with capped exponential backoff and jitter while the queue keeps absorbing (then dropping and
counting); a batch the database rejects for its content is retried row by row, and only the
offending rows are dropped (`rows_rejected`). Without it (captures, a sample) a failed batch
costs itself, counted as dropped. `close()` writes what is queued within a deadline and counts
the rest as dropped. It never logs record contents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import random
import sqlite3
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Column, Table, select
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import Insert

from storage.sql import insert_ignore, is_transient

logger = logging.getLogger(__name__)

Row = dict[str, Any]

CHUNK: Final = 100  # rows per INSERT statement (and records converted between yields)
# The writer's own counters; each stream adds its `written` and `dropped` keys.
WRITER_KEYS: Final = ("rows_rejected", "batches", "retries", "db_errors")


@dataclass(frozen=True, slots=True)
class Stream:
    """One kind of record and the table it goes to."""

    name: str  # for log lines: "exchange", "observation", "capture"
    table: Table
    convert: Callable[[Any], Row]  # record -> row (may raise: the record is then rejected)
    written: str  # counter key: rows written
    dropped: str  # counter key: records dropped (queue full, shutdown, a failed batch)
    pull: Callable[[int], list[Any]] | None = None  # the owner's bounded queue, if any
    # A bound of its own (records queued here), instead of a share of `queue_max`: a stream
    # whose volume differs by orders of magnitude from the others must not crowd them out.
    queue_max: int | None = None


class _Compiled:
    """One stream's INSERT compiled once for the engine's dialect and the rows' keys: a batch
    goes to the driver's executemany as tuples (each column's bind processor applied, as
    SQLAlchemy would), without SQLAlchemy building every row's parameters from the statement.
    Only for positional paramstyles (SQLite's qmark, asyncpg's numeric); the keys must match
    the statement's columns exactly, else `build` returns None and the rows take the ordinary
    path (which raises for an unknown column, as before).

    `chunk` also narrows the INSERT to the columns a chunk's rows give a value: a nullable
    column with no default, whose bind processor (if any) binds None as None, that is None in
    every row of the chunk is left out, and the database stores the NULL it would have been
    given. Most of an observation's columns are None on most rows (scores, tool calls,
    inter-event statistics of an unstreamed answer), and binding a None costs the SQLite
    driver as much as binding a value (it looks for an adapter first). The narrowed statements
    are compiled once per set of left-out columns, at most `MAX_NARROWED` of them; past it a
    chunk binds every column."""

    __slots__ = (
        "_all", "_dialect", "_narrowed", "_optional", "_stmt", "get", "keys", "procs", "sql",
    )  # fmt: skip

    MAX_NARROWED: Final = 64

    def __init__(
        self,
        sql: str,
        keys: tuple[str, ...],
        procs: tuple[tuple[int, Any], ...],
        optional: tuple[int, ...] = (),
        stmt: Insert | None = None,
        dialect: Dialect | None = None,
    ):
        self.sql = sql
        self.keys = keys
        self.procs = procs
        self.get = operator.itemgetter(*keys)
        self._optional = optional if stmt is not None else ()
        self._all = tuple(range(len(keys)))  # the full statement binds every column, in order
        self._stmt = stmt
        self._dialect = dialect
        # Left-out column positions -> (the narrowed SQL, the positions it binds, in its
        # order); None: it could not be narrowed (the full statement is used).
        self._narrowed: dict[tuple[int, ...], tuple[str, tuple[int, ...]] | None] = {}

    @classmethod
    def build(cls, stmt: Insert, table: Table, dialect: Dialect, row: Row) -> _Compiled | None:
        compiled = stmt.compile(dialect=dialect, column_keys=list(row))
        if not compiled.positional or len(row) < 2:
            return None
        order = tuple(compiled.positiontup or ())
        if set(order) != set(row) or len(order) != len(row):
            return None
        procs = []
        for i, key in enumerate(order):
            proc = table.c[key].type.bind_processor(dialect)
            if proc is not None:
                procs.append((i, proc))
        by_position = dict(procs)
        optional = tuple(
            i for i, key in enumerate(order) if _may_leave_out(table.c[key], by_position.get(i))
        )
        return cls(str(compiled), order, tuple(procs), optional, stmt, dialect)

    def chunk(self, rows: list[Row]) -> tuple[str, list[tuple[Any, ...]]] | None:
        """(SQL, parameter tuples) for `rows`, narrowed to the columns they give a value;
        None if a row has other keys.

        Column by column: the rows are transposed once (in C), the all-None optional columns
        left out, and each kept column's bind processor mapped over it, None included, as
        SQLAlchemy binds; then the kept columns are transposed back into the driver's tuples."""
        if not rows:
            return self.sql, []
        if set(map(len, rows)) != {len(self.keys)}:
            return None
        count = len(rows)
        columns = list(zip(*map(self.get, rows), strict=True))  # one tuple a column, in C
        absent = tuple(i for i in self._optional if columns[i].count(None) == count)
        sql, take, left_out = self.sql, self._all, frozenset[int]()
        if absent:
            if absent in self._narrowed:
                narrowed = self._narrowed[absent]
            else:
                narrowed = self._narrow(absent)
                if len(self._narrowed) < self.MAX_NARROWED:
                    self._narrowed[absent] = narrowed
            if narrowed is not None:
                (sql, take), left_out = narrowed, frozenset(absent)
        for i, proc in self.procs:
            if i not in left_out:
                columns[i] = tuple(map(proc, columns[i]))
        return sql, list(zip(*[columns[i] for i in take], strict=True))

    def _narrow(self, absent: tuple[int, ...]) -> tuple[str, tuple[int, ...]] | None:
        assert self._stmt is not None
        left_out = {self.keys[i] for i in absent}
        kept = [k for k in self.keys if k not in left_out]
        compiled = self._stmt.compile(dialect=self._dialect, column_keys=kept)
        order = tuple(compiled.positiontup or ())
        if set(order) != set(kept) or len(order) != len(kept):
            return None  # the statement would add columns of its own (a default): bind all
        position = {key: i for i, key in enumerate(self.keys)}
        return str(compiled), tuple(position[key] for key in order)


def _may_leave_out(column: Column[Any], proc: Callable[[Any], Any] | None) -> bool:
    """Whether an INSERT without `column` stores what binding None would: NULL (nullable, no
    default, and a bind processor, if any, that binds None as None; SQLAlchemy's own do, a
    `TypeDecorator` may not)."""
    if not (
        column.nullable is True
        and not column.primary_key
        and column.default is None
        and column.server_default is None
    ):
        return False
    if proc is None:
        return True
    try:
        return proc(None) is None
    except Exception:
        return False


class BatchWriter:
    """See the module docstring."""

    def __init__(
        self,
        engine: AsyncEngine,
        streams: Sequence[Stream],
        *,
        batch_size: int,
        flush_interval_s: float,
        queue_max: int,
        retry: bool = True,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 5.0,
        name: str = "writer",
        on_count: Callable[[str, int], None] | None = None,
    ) -> None:
        self._engine = engine
        self._streams = tuple(streams)
        self._batch_size = max(1, batch_size)
        self._flush_interval_s = flush_interval_s
        # Bounds the memory a database outage can cost; beyond it records are dropped, counted.
        self._queue_max = queue_max
        self._retry = retry
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._name = name
        self._on_count = on_count
        self._queues: dict[str, deque[Any]] = {s.name: deque() for s in self._streams}
        # Records in every queue, and in the queues that share `queue_max`: kept as counts by
        # `put`, `_take` and `_count_lost` (the only places the queues change), not summed over
        # the queues on every put.
        self._depth = 0
        self._shared_depth = 0
        self._inserts = {s.name: insert_ignore(engine.dialect.name, s.table) for s in streams}
        # Per stream: the INSERT compiled for its rows' keys (None: the ordinary path).
        self._compiled: dict[str, _Compiled | None] = {}
        # SQLite through aiosqlite: a batch is one call on the connection's thread.
        self._direct = engine.dialect.name == "sqlite" and engine.dialect.driver == "aiosqlite"
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._in_flight: dict[str, int] = dict.fromkeys(self._queues, 0)  # taken, not written
        self._outage = False
        keys = [*WRITER_KEYS, *(k for s in self._streams for k in (s.written, s.dropped))]
        self.counts: dict[str, int] = dict.fromkeys(keys, 0)

    # ---- the sink side: called on the request path, never waits
    def put(self, stream: Stream, record: Any) -> None:
        if self._closing:
            self._count(stream.dropped, 1)
            return
        queue = self._queues[stream.name]
        if stream.queue_max is None:
            if self._shared_depth >= self._queue_max:
                self._count(stream.dropped, 1)
                return
            self._shared_depth += 1
        elif len(queue) >= stream.queue_max:
            self._count(stream.dropped, 1)
            return
        queue.append(record)
        self._depth += 1
        if self._depth >= self._batch_size:
            self._wake.set()

    @property
    def depth(self) -> int:
        """Records queued here (not those a stream's owner still holds)."""
        return self._depth

    @property
    def in_flight(self) -> int:
        """Records taken off the queues and not yet written."""
        return sum(self._in_flight.values())

    def _count(self, key: str, n: int) -> None:
        if n:
            self.counts[key] += n
            if self._on_count is not None and key not in WRITER_KEYS:
                self._on_count(key, n)

    # ---- lifecycle
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting records, write what is queued, and return within `timeout_s`; what
        could not be written by then is counted as dropped."""
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        if task is None:
            self._count_lost()
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            logger.warning("%s: shutdown deadline passed; dropping the rest", self._name)
        finally:  # also when close() itself is cancelled: never leave the task behind
            if not task.done():
                task.cancel()
                await asyncio.wait({task})  # a cancel of close() itself still reaches its caller
            self._count_lost()

    def _count_lost(self) -> None:
        for s in self._streams:
            queue = self._queues[s.name]
            left = self._in_flight[s.name] + len(queue)
            if s.pull is not None:
                left += len(s.pull(1 << 30))
            self._count(s.dropped, left)
            queue.clear()
            self._in_flight[s.name] = 0
        self._depth = self._shared_depth = 0

    async def tick(self) -> None:
        """Called by the drain task after each wake-up (override for periodic work)."""

    # ---- the drain task
    async def _run(self) -> None:
        full = False
        # Records a stream's owner holds are not in `depth`: after a full batch, pull again at
        # once; a partial remainder of our own queues waits for the flush interval.
        pulls = any(s.pull is not None for s in self._streams)
        while True:
            if not (full and pulls) and self.depth < self._batch_size and not self._closing:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._flush_interval_s):
                        await self._wake.wait()
            try:
                full = await self._write_batch() >= self._batch_size
            except Exception:
                # A bug (say, a record that cannot be converted) must not end the drain task:
                # the queue would fill and silently drop everything after it.
                logger.exception("%s: batch failed; its records are dropped", self._name)
                self._count("rows_rejected", self.in_flight)
                self._in_flight = dict.fromkeys(self._in_flight, 0)
                full = False
            if not full:
                if self._closing and not self.depth:
                    return
                await self.tick()

    async def _take(self) -> tuple[dict[str, list[Row]], int]:
        """The next batch's rows by stream, and how many records it took."""
        room = self._batch_size
        records: dict[str, list[Any]] = {}
        for s in self._streams:
            queue = self._queues[s.name]
            taken = [queue.popleft() for _ in range(min(room, len(queue)))]
            self._depth -= len(taken)
            if s.queue_max is None:
                self._shared_depth -= len(taken)
            if s.pull is not None and room > len(taken):
                taken += s.pull(room - len(taken))
            records[s.name] = taken
            self._in_flight[s.name] = len(taken)
            room -= len(taken)
        rows = {s.name: await self._convert(s, records[s.name]) for s in self._streams}
        self._in_flight = {name: len(r) for name, r in rows.items()}
        return rows, self._batch_size - room

    async def _convert(self, stream: Stream, records: list[Any]) -> list[Row]:
        rows: list[Row] = []
        for n, record in enumerate(records, 1):
            try:
                rows.append(stream.convert(record))
            except Exception:  # a malformed record (wrong types) costs itself only
                self._count("rows_rejected", 1)
                logger.warning("%s: dropped a malformed %s", self._name, type(record).__name__)
            if not n % CHUNK:
                await asyncio.sleep(0)  # let the proxy run between chunks
        return rows

    async def _write_batch(self) -> int:
        """Write one batch; return how many records it took."""
        rows, taken = await self._take()
        delay, ceiling = self._backoff
        singly = False
        while any(rows.values()):
            try:
                if singly:
                    await self._write_singly(rows)
                else:
                    await self._write(rows)
                    for s in self._streams:
                        self._count(s.written, len(rows[s.name]))
                        rows[s.name].clear()
            except Exception as exc:
                self._count("db_errors", 1)
                if not self._retry:  # a sample: the failed batch costs itself, counted
                    for s in self._streams:
                        self._count(s.dropped, len(rows[s.name]))
                        rows[s.name].clear()
                    logger.warning("%s: a batch was not stored", self._name)
                    break
                if not await self._is_outage(exc):
                    if not singly:
                        logger.warning(
                            "%s: a batch was refused (%s); writing it row by row",
                            self._name,
                            type(exc).__name__,
                        )
                    singly = True
                    continue
                if not self._outage:
                    self._outage = True
                    logger.warning(
                        "%s: database unavailable (%s); retrying with backoff, "
                        "queue bounded at %d records",
                        self._name,
                        _first_line(exc),
                        self._queue_max,
                    )
                self._count("retries", 1)
                await asyncio.sleep(delay * (0.5 + random.random()))  # jitter: replicas desync
                delay = min(delay * 2, ceiling)
            else:
                if self._outage:
                    self._outage = False
                    logger.info("%s: database reachable again", self._name)
        self._in_flight = dict.fromkeys(self._in_flight, 0)
        return taken

    async def _write(self, rows: dict[str, list[Row]]) -> None:
        if self._direct and await self._write_direct(rows):
            self._count("batches", 1)
            return
        async with self._engine.begin() as conn:
            # Statements of at most CHUNK rows: parameter processing runs on the event loop,
            # and the proxy shares it; one transaction per batch all the same.
            for s in self._streams:
                part = rows[s.name]
                for start in range(0, len(part), CHUNK):
                    await self._insert(conn, s, part[start : start + CHUNK])
        self._count("batches", 1)

    def _compiled_for(self, stream: Stream, row: Row) -> _Compiled | None:
        if stream.name not in self._compiled:
            self._compiled[stream.name] = _Compiled.build(
                self._inserts[stream.name], stream.table, self._engine.dialect, row
            )
        return self._compiled[stream.name]

    async def _write_direct(self, rows: dict[str, list[Row]]) -> bool:
        """SQLite (aiosqlite): the batch's BEGIN, one executemany per stream and its COMMIT in
        one call on the connection's own thread. Each aiosqlite call is a hand-off between the
        event loop and that thread, and SQLAlchemy's path costs three per statement of CHUNK
        rows plus the transaction's own; this costs one per batch (and the pool's reset when
        the connection is returned). False when it does not apply (a stream without a compiled
        statement, an aiosqlite without the private entry point): the ordinary path writes it.
        Errors come out as SQLAlchemy would wrap them, so retries and row-by-row work alike."""
        statements: list[tuple[str, list[tuple[Any, ...]]]] = []
        for s in self._streams:
            part = rows[s.name]
            if not part:
                continue
            compiled = self._compiled_for(s, part[0])
            if compiled is None:
                return False
            for start in range(0, len(part), CHUNK):
                if start:
                    await asyncio.sleep(0)  # parameter processing runs on the shared loop
                chunk = compiled.chunk(part[start : start + CHUNK])
                if chunk is None:
                    return False
                sql, params = chunk
                if statements and statements[-1][0] == sql:
                    statements[-1][1].extend(params)  # one executemany while the SQL is the same
                else:
                    statements.append((sql, params))
        async with self._engine.connect() as conn:
            raw = await conn.get_raw_connection()
            entry = thread_entry(raw.driver_connection)
            if entry is None:
                self._direct = False
                return False
            run, db = entry
            try:
                await run(_write_in_thread, db, statements)
            except sqlite3.Error as exc:
                raise DBAPIError.instance(
                    None, None, exc, sqlite3.Error, hide_parameters=True,
                    dialect=self._engine.dialect,
                ) from exc  # fmt: skip
        return True

    async def _insert(self, conn: AsyncConnection, stream: Stream, rows: list[Row]) -> None:
        """One INSERT … ON CONFLICT DO NOTHING of `rows` (the same keys each, by construction),
        through the stream's compiled statement when it applies."""
        compiled = self._compiled_for(stream, rows[0])
        if compiled is None or (chunk := compiled.chunk(rows)) is None:
            await conn.execute(self._inserts[stream.name], rows)
        else:
            await conn.exec_driver_sql(*chunk)

    async def _write_singly(self, rows: dict[str, list[Row]]) -> None:
        """Write rows one transaction each; drop (and count) the ones refused for their content.
        A transient error propagates with the unwritten rows still in the lists."""
        for s in self._streams:
            part = rows[s.name]
            while part:
                try:
                    async with self._engine.begin() as conn:
                        await conn.execute(self._inserts[s.name], [part[0]])
                except Exception as exc:
                    if await self._is_outage(exc):
                        raise
                    self._count("db_errors", 1)
                    self._count("rows_rejected", 1)
                    # The type only: a driver's message may quote the row's values.
                    logger.warning(
                        "%s: dropped a %s row the database refused (%s)",
                        self._name,
                        s.name,
                        type(getattr(exc, "orig", None) or exc).__name__,
                    )
                else:
                    self._count(s.written, 1)
                part.pop(0)
                self._in_flight[s.name] = len(part)

    async def _is_outage(self, exc: Exception) -> bool:
        """Whether `exc` means "the database is unavailable" rather than "this data is refused".
        Error classes alone cannot tell (a refused connection and a refused value can both be a
        bare DBAPIError), so a non-transient-looking error is confirmed with a trivial query."""
        if is_transient(exc):
            return True
        try:
            async with self._engine.connect() as conn:
                await conn.execute(select(1))
        except Exception:
            return True
        return False


def thread_entry(
    driver: object,
) -> tuple[Callable[..., Awaitable[Any]], sqlite3.Connection] | None:
    """aiosqlite's private way to run a function on its connection's thread, and the sqlite3
    connection it holds: (`Connection._execute`, `Connection._conn`), or None when this
    aiosqlite (or another driver) does not have them, and the writer takes SQLAlchemy's path."""
    run = getattr(driver, "_execute", None)
    try:
        db = driver._conn  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return None
    if not callable(run) or not isinstance(db, sqlite3.Connection):
        return None
    return run, db


def _write_in_thread(db: sqlite3.Connection, statements: list[tuple[str, Any]]) -> None:
    """One transaction of executemany statements, on the connection's own thread (the engine
    runs sqlite3 in autocommit mode and issues its BEGINs itself: storage.engine)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for sql, params in statements:
            db.executemany(sql, params)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.rollback()
        raise


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc)
    return (text.splitlines() or [type(exc).__name__])[0][:200]
