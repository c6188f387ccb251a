"""Records as the gateway stores them, for the tests that read them back: the one place tests
write exchanges, observations, gradings and pairs kept for people through the real
`ObservationWriter`, and the rows of a graded model upgrade's one-turn sessions (`GradedRows`).
Holds no tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint, GraderSpec
from domain.records import ExchangeRecord, GradingRecord, LabelItem, ObservationRecord
from storage import queries
from storage.models import ExchangeRow, ObservationRow
from storage.textguard import exchange_row, observation_row
from storage.writer import ObservationWriter

Row = dict[str, object]
MAX_CHARS = 4096  # store_text_max_chars of the writer and of the rows inserted directly


def new_writer(engine: AsyncEngine, *, store_text: bool = True) -> ObservationWriter:
    """The real writer at small test settings (not started)."""
    return ObservationWriter(
        engine,
        batch_size=100,
        flush_interval_s=0.05,
        queue_max=10_000,
        store_text=store_text,
        store_text_max_chars=MAX_CHARS,
    )


async def write_records(
    engine: AsyncEngine,
    *,
    exchanges: Iterable[ExchangeRecord] = (),
    observations: Iterable[ObservationRecord] = (),
    gradings: Iterable[GradingRecord] = (),
    label_items: Iterable[LabelItem] = (),
    store_text: bool = True,
) -> dict[str, int]:
    """Write the records through one real writer, started, then closed (what it queued is
    written); its stats (`written_gradings`, `label_items_dropped`, ...)."""
    writer = new_writer(engine, store_text=store_text)
    await writer.start()
    for x in exchanges:
        writer.put_exchange(x)
    for o in observations:
        writer.put_observation(o)
    for g in gradings:
        writer.put_grading(g)
    for item in label_items:
        writer.put_label_item(item)
    await writer.close()
    return writer.stats()


def kept_pair(
    i: int, endpoint: str, conversation: str, candidate_answer: str, reference_answer: str
) -> LabelItem:
    """Pair `i` kept for people as the grading lane keeps it: exchange `ex-i` of unit `s-i`,
    `endpoint` against `prod`, graded now."""
    return LabelItem(
        exchange_id=f"ex-{i}",
        endpoint=endpoint,
        reference="prod",
        unit=f"s-{i}",
        graded_at=time.time(),
        conversation=conversation,
        candidate_answer=candidate_answer,
        reference_answer=reference_answer,
    )


async def live_and_upgrade(
    engine: AsyncEngine,
    created_at: float,
    grader: GraderSpec,
    verdict: dict[str, float | str] | None = None,
) -> None:
    """Production (`live`) and the graded model upgrade (`upgrade`) in the registry."""
    await queries.create_endpoint(engine, Endpoint(name="live", url="http://l", role="live"))
    await queries.create_endpoint(engine, Endpoint(
        name="upgrade", url="http://c", created_at=created_at, grader=grader,
        verdict=verdict or {},
    ))  # fmt: skip


def exchange(xid: str, at: float, session: int) -> Row:
    """The exchange row of a one-turn session at temperature 0 mirrored to `upgrade`."""
    return exchange_row(ExchangeRecord(
        id=xid, received_at=at, route="/v1/chat/completions", model="m",
        temperature=0.0, targets=("upgrade",), session_key=f"{session:032x}",
    ))  # fmt: skip


def observation(xid: str, endpoint: str, arm: str, at: float, text: str) -> Row:
    """The observation row of one arm's answer `text`."""
    record = ObservationRecord(
        exchange_id=xid, endpoint=endpoint, arm=arm, started_at=at, status=200,  # type: ignore[arg-type]
        ttft_s=0.2, e2e_s=0.5, output_tokens=10, finish_reason="stop", output_text=text,
    )  # fmt: skip
    return observation_row(record, store_text=True, max_chars=MAX_CHARS)


async def insert_rows(engine: AsyncEngine, exchanges: list[Row], observations: list[Row]) -> None:
    """Exchange and observation rows, inserted in one transaction."""
    async with engine.begin() as conn:
        await conn.execute(insert(ExchangeRow), exchanges)
        await conn.execute(insert(ObservationRow), observations)


@dataclass
class GradedRows:
    """A graded model upgrade's one-turn sessions, as stored: exchange and observation rows
    (inserted) and gradings (written by the real writer)."""

    exchanges: list[Row] = field(default_factory=list)
    observations: list[Row] = field(default_factory=list)
    gradings: list[GradingRecord] = field(default_factory=list)

    def session(
        self, s: int, now: float, rng: np.random.Generator, *, candidate_first: bool
    ) -> tuple[str, float]:
        """Session `s` (`x0000`, ...) 10 s after the one before: its exchange, both answers (all
        differ) and one grading in the order given, whose winner one draw of `rng` makes the
        candidate 60 %, production 20 % and a tie 20 % of the time. Its (exchange id, time)."""
        at = now - 5_000 + s * 10
        xid = f"x{s:04d}"
        self.exchanges.append(exchange(xid, at, s + 1))
        self.observations.append(observation(xid, "live", "production", at, f"old answer {s}"))
        self.observations.append(observation(xid, "upgrade", "candidate", at, f"a new answer {s}"))
        u = rng.random()
        winner = "candidate" if u < 0.6 else ("reference" if u < 0.8 else "tie")
        self.gradings.append(GradingRecord(
            exchange_id=xid, endpoint="upgrade", reference="live", graded_at=at + 1,
            candidate_first=candidate_first, swapped=False, outcome="graded", winner=winner,  # type: ignore[arg-type]
            candidate_chars=16, reference_chars=13, prompt_tokens=900, completion_tokens=10,
            latency_s=0.3,
        ))  # fmt: skip
        return xid, at

    async def store(
        self, engine: AsyncEngine, label_items: Iterable[LabelItem] = ()
    ) -> dict[str, int]:
        """Insert the rows, then write the gradings and `label_items`: the writer's stats."""
        await insert_rows(engine, self.exchanges, self.observations)
        return await write_records(engine, gradings=self.gradings, label_items=label_items)
