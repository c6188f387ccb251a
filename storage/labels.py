"""People's labels and the pairs kept for them (`label_items`, `labels`): offer the next pair to
one labeller, store a label (committed before the function returns, so the API's 2xx follows a
durable write), undo a labeller's last one, export and import them as JSONL, delete the kept
text past its retention, and load what the estimate reads.

A pair is offered to a labeller who has not labelled it, in random order, and only while no one
has labelled it unless it falls in the double-labelled share (by hash of the exchange id,
`double_rate`): that share, labelled twice, gives people's agreement with each other. It never
returns the grader's verdict nor which answer is the candidate's; the shown order is drawn here
and the label records it. No SQL strings outside storage/; never logs a pair's text.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec
import xxhash
from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.errors import EXIT_FAILURE, EXIT_USAGE, CanaryError
from domain.records import LABEL_CHOICES, LabelItem, LabelRecord
from storage.engine import write_transaction
from storage.models import Base
from storage.sql import ENDPOINTS, translated

__all__ = [
    "LabelRefused",
    "Offer",
    "Progress",
    "add_label",
    "export_jsonl",
    "import_jsonl",
    "kept_ids",
    "labels_of",
    "next_pair",
    "progress",
    "purge",
    "undo_last",
]

ITEMS: Final = Base.metadata.tables["label_items"]
LABELS: Final = Base.metadata.tables["labels"]
_DOUBLE_SALT: Final = b"canary-label-double\x00"
# Pairs read per offer: the offer draws among them (random order), so a labeller's view costs
# one bounded query whatever the backlog.
_OFFER_WINDOW: Final = 200
# One import at most (a JSONL file is read whole before any row is written).
MAX_IMPORT_LINES: Final = 100_000
_decode_label = msgspec.json.Decoder(LabelRecord).decode
_encode = msgspec.json.Encoder().encode


class LabelRefused(CanaryError):
    """A label the store will not take: an unknown pair (404), a second label of a pair by the
    same labeller (409), a candidate that no longer exists (404), labelling with
    `store_text = false` (409), a bad line of an import (422). `http_field` names the input."""

    exit_code = EXIT_USAGE
    http_status = 409
    code = "conflict"

    def __init__(
        self, message: str, *, status: int = 409, code: str = "conflict", field: str = ""
    ) -> None:
        super().__init__(message)
        self.http_status, self.code, self.http_field = status, code, field
        self.exit_code = EXIT_USAGE if status < 500 else EXIT_FAILURE


class Offer(msgspec.Struct, kw_only=True):
    """A pair as a labeller sees it: the conversation and two answers as A and B, never which
    is the candidate's. `order` is opaque to the labeller and sent back with the label."""

    exchange_id: str
    conversation: str
    answer_a: str
    answer_b: str
    order: str  # "ca": the candidate's answer is A; "rc": the reference's is A


class Progress(msgspec.Struct, kw_only=True):
    """A labeller's progress on one candidate: their labels, the pairs kept, all labels."""

    mine: int
    kept: int
    labelled_pairs: int
    labels: int
    skips: int


def is_double(exchange_id: str, rate: float) -> bool:
    """True iff the pair is in the share offered to a second labeller."""
    return xxhash.xxh3_64_intdigest(_DOUBLE_SALT + exchange_id.encode()) / 2.0**64 < rate


async def _candidate_exists(conn: Any, candidate: str) -> bool:
    row = await conn.execute(select(ENDPOINTS.c.name).where(ENDPOINTS.c.name == candidate))
    return row.first() is not None


def _gone(candidate: str) -> LabelRefused:
    return LabelRefused(
        f"candidate {candidate!r} does not exist (deleted?); its pairs cannot be labelled",
        status=404,
        code="not_found",
        field="candidate",
    )


async def next_pair(
    engine: AsyncEngine,
    candidate: str,
    labeller: str,
    *,
    double_rate: float = 0.1,
    rng: random.Random | None = None,
) -> Offer | None:
    """A pair of `candidate` this labeller has not labelled (None when there is none left)."""
    rng = rng or random.Random()
    mine = select(LABELS.c.exchange_id).where(
        (LABELS.c.endpoint == candidate) & (LABELS.c.labeller == labeller)
    )
    others = (
        select(func.count())
        .where((LABELS.c.endpoint == candidate) & (LABELS.c.exchange_id == ITEMS.c.exchange_id))
        .scalar_subquery()
    )
    query = (
        select(ITEMS, others.label("n"))
        .where((ITEMS.c.endpoint == candidate) & ITEMS.c.exchange_id.not_in(mine))
        .order_by(func.random())
        .limit(_OFFER_WINDOW)
    )
    with translated(f"reading pairs to label of {candidate!r}"):
        async with engine.connect() as conn:
            if not await _candidate_exists(conn, candidate):
                raise _gone(candidate)
            rows = (await conn.execute(query)).mappings().all()
    open_ = [r for r in rows if r["n"] == 0 or is_double(r["exchange_id"], double_rate)]
    if not open_:
        return None
    row = rng.choice(open_)
    first = rng.random() < 0.5
    cand, ref = row["candidate_answer"], row["reference_answer"]
    return Offer(
        exchange_id=row["exchange_id"],
        conversation=row["conversation"],
        answer_a=cand if first else ref,
        answer_b=ref if first else cand,
        order="ca" if first else "rc",
    )


def record_of(
    candidate: str, labeller: str, exchange_id: str, order: str, answer: str, at: float
) -> LabelRecord:
    """The label of an answer as the labeller saw it ("A", "B", "tie", "skip"), or LabelRefused
    naming the field."""
    if order not in ("ca", "rc"):
        raise LabelRefused(
            f"order: {order!r} is not one this API offered ('ca' or 'rc')",
            status=422, code="validation_error", field="order",
        )  # fmt: skip
    first = order == "ca"
    a, b = ("candidate", "reference") if first else ("reference", "candidate")
    choices = {"A": a, "B": b}
    choice = choices.get(answer, answer)
    if choice not in LABEL_CHOICES:
        raise LabelRefused(
            f"answer: {answer!r} is not A, B, tie or skip",
            status=422, code="validation_error", field="answer",
        )  # fmt: skip
    return LabelRecord(
        exchange_id=exchange_id,
        endpoint=candidate,
        labeller=labeller,
        labelled_at=at,
        candidate_first=first,
        choice=choice,  # checked against LABEL_CHOICES above
    )


async def add_label(engine: AsyncEngine, record: LabelRecord) -> LabelRecord:
    """Store one label, committed before returning; LabelRefused for an unknown pair, a second
    label of it by the same labeller, or a candidate that no longer exists."""
    with translated(f"storing a label of {record.endpoint!r}"):
        async with write_transaction(engine) as conn:
            if not await _candidate_exists(conn, record.endpoint):
                raise _gone(record.endpoint)
            known = await conn.execute(
                select(ITEMS.c.id).where(
                    (ITEMS.c.endpoint == record.endpoint)
                    & (ITEMS.c.exchange_id == record.exchange_id)
                )
            )
            if known.first() is None:
                raise LabelRefused(
                    f"exchange_id: no pair {record.exchange_id!r} of {record.endpoint!r} is "
                    "kept for labelling",
                    status=404, code="not_found", field="exchange_id",
                )  # fmt: skip
            try:
                await conn.execute(insert(LABELS).values(msgspec.structs.asdict(record)))
            except IntegrityError as exc:
                raise LabelRefused(
                    f"exchange_id: {record.labeller!r} already labelled pair "
                    f"{record.exchange_id!r}; undo it first to change it",
                    status=409, code="conflict", field="exchange_id",
                ) from exc  # fmt: skip
    return record


async def undo_last(engine: AsyncEngine, candidate: str, labeller: str) -> LabelRecord | None:
    """Delete this labeller's latest label of `candidate` and return it (None: none left)."""
    with translated(f"undoing a label of {candidate!r}"):
        async with write_transaction(engine) as conn:
            row = (
                (
                    await conn.execute(
                        select(LABELS)
                        .where((LABELS.c.endpoint == candidate) & (LABELS.c.labeller == labeller))
                        .order_by(LABELS.c.labelled_at.desc(), LABELS.c.id.desc())
                        .limit(1)
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                return None
            await conn.execute(delete(LABELS).where(LABELS.c.id == row["id"]))
    return _record(row)


def _record(row: Any) -> LabelRecord:
    return LabelRecord(**{k: row[k] for k in LabelRecord.__struct_fields__})


async def labels_of(engine: AsyncEngine, candidate: str) -> list[LabelRecord]:
    """Every label of `candidate`, oldest first (the export and the estimate read these)."""
    with translated(f"reading labels of {candidate!r}"):
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(LABELS)
                    .where(LABELS.c.endpoint == candidate)
                    .order_by(LABELS.c.labelled_at, LABELS.c.id)
                )
            ).mappings()
            return [_record(r) for r in rows]


async def units_of(engine: AsyncEngine, candidate: str) -> dict[str, str]:
    """exchange id -> unit of every pair of `candidate` kept for labelling."""
    with translated(f"reading pairs kept for {candidate!r}"):
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(ITEMS.c.exchange_id, ITEMS.c.unit).where(ITEMS.c.endpoint == candidate)
            )
            return {r[0]: r[1] for r in rows}


async def progress(engine: AsyncEngine, candidate: str, labeller: str) -> Progress:
    """Counts for the labelling view's progress line."""
    with translated(f"reading label progress of {candidate!r}"):
        async with engine.connect() as conn:
            kept = await conn.scalar(
                select(func.count()).select_from(ITEMS).where(ITEMS.c.endpoint == candidate)
            )
            rows = (
                await conn.execute(
                    select(LABELS.c.exchange_id, LABELS.c.labeller, LABELS.c.choice).where(
                        LABELS.c.endpoint == candidate
                    )
                )
            ).all()
    return Progress(
        mine=sum(r[1] == labeller for r in rows),
        kept=int(kept or 0),
        labelled_pairs=len({r[0] for r in rows if r[2] != "skip"}),
        labels=sum(r[2] != "skip" for r in rows),
        skips=sum(r[2] == "skip" for r in rows),
    )


async def purge(engine: AsyncEngine, retention_s: float, now: float | None = None) -> int:
    """Delete the kept text of pairs graded more than `retention_s` ago (their labels stay)."""
    cutoff = (time.time() if now is None else now) - retention_s
    with translated("deleting pairs kept for labelling past their retention"):
        async with engine.begin() as conn:
            result = await conn.execute(delete(ITEMS).where(ITEMS.c.graded_at < cutoff))
    return int(result.rowcount or 0)


def export_jsonl(records: Iterable[LabelRecord]) -> bytes:
    """One label a line, every field (the import reads the same)."""
    return b"".join(_encode(r) + b"\n" for r in records)


def parse_jsonl(data: bytes) -> list[LabelRecord]:
    """Labels from JSONL; LabelRefused naming the line for anything else (nothing is stored)."""
    out: list[LabelRecord] = []
    for i, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        if len(out) >= MAX_IMPORT_LINES:
            raise LabelRefused(
                f"line {i}: more than {MAX_IMPORT_LINES} labels in one import; split the file",
                status=422, code="validation_error", field=f"line {i}",
            )  # fmt: skip
        try:
            out.append(_decode_label(line))
        except msgspec.ValidationError as exc:
            raise LabelRefused(
                f"line {i}: {exc}", status=422, code="validation_error", field=f"line {i}"
            ) from exc
        except msgspec.DecodeError as exc:
            raise LabelRefused(
                f"line {i}: not JSON", status=422, code="validation_error", field=f"line {i}"
            ) from exc
    return out


async def import_jsonl(engine: AsyncEngine, records: Sequence[LabelRecord]) -> tuple[int, int]:
    """Store labels in one transaction; (stored, already there). A label that is already there
    (same pair, labeller and choice) is skipped; one that contradicts a stored label refuses
    the whole import, naming it, so nothing is half-imported."""
    stored = same = 0
    with translated("importing labels"):
        async with write_transaction(engine) as conn:
            for r in records:
                existing = (
                    await conn.execute(
                        select(LABELS.c.choice).where(
                            (LABELS.c.endpoint == r.endpoint)
                            & (LABELS.c.exchange_id == r.exchange_id)
                            & (LABELS.c.labeller == r.labeller)
                        )
                    )
                ).first()
                if existing is None:
                    await conn.execute(insert(LABELS).values(msgspec.structs.asdict(r)))
                    stored += 1
                elif existing[0] == r.choice:
                    same += 1
                else:
                    raise LabelRefused(
                        f"exchange_id: {r.labeller!r} labelled pair {r.exchange_id!r} of "
                        f"{r.endpoint!r} {existing[0]!r} already, the import says {r.choice!r}",
                        status=409, code="conflict", field="exchange_id",
                    )  # fmt: skip
    return stored, same


def item_of(item: LabelItem) -> dict[str, Any]:
    """A kept pair as a `label_items` row."""
    return msgspec.structs.asdict(item)


async def kept_ids(engine: AsyncEngine, candidate: str) -> list[str]:
    """The exchange ids of every pair of `candidate` kept for labelling (the estimate's
    chosen pairs; a pair purged past its retention keeps its labels but leaves this list)."""
    with translated(f"reading pairs kept for {candidate!r}"):
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(ITEMS.c.exchange_id).where(ITEMS.c.endpoint == candidate)
            )
            return [r[0] for r in rows]
