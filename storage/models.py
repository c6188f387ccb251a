"""SQLAlchemy 2.0 table definitions: the schema as the code expects it.

Alembic revisions under migrations/ are the only way the database changes; this module and the
latest revision must agree (a test compares them).

Observations are joined to exchanges by id without a foreign key: the writer batches rows, and a
fast candidate's observation may reach the database before the production exchange it belongs to.

At most one endpoint is live: a partial unique index on `endpoints.role` (WHERE role = 'live')
makes the database itself refuse a second one, whatever a racing replica does. Likewise at most
one rollout per live endpoint is open (`rollouts.live` unique WHERE state is running or paused).
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

from domain.endpoint import Endpoint
from domain.observation import describe
from domain.records import GradingRecord, LabelItem, LabelRecord, ObservationRecord, RolloutRecord

# SQLite only autoincrements INTEGER PRIMARY KEY; PostgreSQL wants BIGINT for large tables.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def _column_type(t: msgspec.inspect.Type) -> tuple[TypeEngine[Any], bool]:
    """The SQL type of an `Endpoint` field's msgspec type, and whether NULL is allowed: strings
    bounded to 255 or less are VARCHAR(max_length), longer ones TEXT; literals VARCHAR(16);
    integers bounded to 32 bits INTEGER, others BIGINT; a dict is a JSON object in TEXT (NULL
    when empty), so is a sub-struct (the grader; NULL when none); `T | None` is nullable."""
    mi = msgspec.inspect
    nullable = False
    if isinstance(t, mi.UnionType):
        (t,) = [m for m in t.types if not isinstance(m, mi.NoneType)]
        nullable = True
    if isinstance(t, mi.Metadata):
        t = t.type
    if isinstance(t, mi.StrType):
        size = t.max_length
        return (String(size) if size is not None and size <= 255 else Text()), nullable
    if isinstance(t, mi.LiteralType):
        assert max(len(str(v)) for v in t.values) <= 16
        return String(16), nullable
    if isinstance(t, mi.IntType):
        small = t.le is not None and t.le < 2**31 and t.ge is not None and t.ge > -(2**31)
        return (Integer() if small else BigInteger()), nullable
    if isinstance(t, mi.FloatType):
        return Float(), nullable
    if isinstance(t, mi.BoolType):
        return Boolean(), nullable
    if isinstance(t, mi.DictType | mi.StructType):
        return Text(), True
    raise TypeError(f"no column type for {t!r}")


def endpoint_columns(struct: type[msgspec.Struct] = Endpoint) -> list[Column[Any]]:
    """One column per `domain.endpoint.Endpoint` field, in its order, typed from the field's
    declaration (the one place a field is declared); `name` is unique."""
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    columns: list[Column[Any]] = []
    for f in info.fields:
        type_, nullable = _column_type(f.type)
        columns.append(Column(f.name, type_, nullable=nullable, unique=f.name == "name"))
    return columns


class EndpointRow(Base):
    """The registry: one row per endpoint, its columns generated from `Endpoint`."""

    __table__ = Table(
        "endpoints",
        Base.metadata,
        Column("id", BigId, primary_key=True, autoincrement=True),
        *endpoint_columns(),
        Index(
            "uq_endpoints_one_live",
            "role",
            unique=True,
            sqlite_where=text("role = 'live'"),
            postgresql_where=text("role = 'live'"),
        ),
    )


class RegistryMetaRow(Base):
    """One row (id = 1) whose version is bumped by every control-plane change, in the same
    transaction, so replicas poll one integer to know whether to reload."""

    __tablename__ = "registry_meta"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, default=0)


class ExchangeRow(Base):
    __tablename__ = "exchanges"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    received_at: Mapped[float] = mapped_column(Float, index=True)
    route: Mapped[str] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(200))
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    temperature: Mapped[float | None] = mapped_column(Float)
    session_key: Mapped[str | None] = mapped_column(String(32))
    turn_index: Mapped[int] = mapped_column(Integer, default=0)
    request_hash: Mapped[str] = mapped_column(String(32))
    json_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    tools_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    replica: Mapped[str] = mapped_column(String(64), default="")
    # ",a,b," - candidates whose ring accepted the copy (delimited so LIKE '%,name,%' is exact).
    targets: Mapped[str] = mapped_column(Text, default="")
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)


_SQL_TYPES: dict[type[Any], TypeEngine[Any]] = {
    float: Float(),
    int: Integer(),
    bool: Boolean(),
    str: Text(),
}


def declared_columns(record: type[msgspec.Struct]) -> list[Column[Any]]:
    """The columns of a record declared in domain (`domain.observation.describe`): its type
    (a string with a length is VARCHAR, without one TEXT; an integer of 64 bits BIGINT), NULL
    where it may be None."""
    columns: list[Column[Any]] = []
    for f in describe(record):
        length = f.quantity.length
        sql = String(length) if f.type is str and length else _SQL_TYPES[f.type]
        if f.type is int and f.quantity.bits > 32:
            sql = BigInteger()
        columns.append(Column(f.name, sql, nullable=f.nullable))
    return columns


class ObservationRow(Base):
    """One arm's answer to one exchange: `domain.records.ObservationRecord`'s fields, as
    declared there, plus a surrogate id."""

    __table__ = Table(
        "observations",
        Base.metadata,
        Column("id", BigId, primary_key=True, autoincrement=True),
        *declared_columns(ObservationRecord),
        UniqueConstraint("exchange_id", "endpoint"),
        Index("ix_observations_endpoint_exchange", "endpoint", "exchange_id"),
    )


class GradingRow(Base):
    """One grading of one pair in one order by a candidate's LLM grader:
    `domain.records.GradingRecord`'s fields, as declared there, plus a surrogate id."""

    __table__ = Table(
        "gradings",
        Base.metadata,
        Column("id", BigId, primary_key=True, autoincrement=True),
        *declared_columns(GradingRecord),
        Index("ix_gradings_endpoint_exchange", "endpoint", "exchange_id"),
        Index("ix_gradings_endpoint_graded_at", "endpoint", "graded_at"),
    )


class LabelItemRow(Base):
    """A graded pair kept for people (`domain.records.LabelItem`): what the grader was shown,
    one row per (pair, candidate), deleted past `[labels] retention_s`."""

    __table__ = Table(
        "label_items",
        Base.metadata,
        Column("id", BigId, primary_key=True, autoincrement=True),
        *declared_columns(LabelItem),
        UniqueConstraint("exchange_id", "endpoint"),
        Index("ix_label_items_endpoint_graded_at", "endpoint", "graded_at"),
    )


class LabelRow(Base):
    """One person's label of one pair (`domain.records.LabelRecord`): one per labeller."""

    __table__ = Table(
        "labels",
        Base.metadata,
        Column("id", BigId, primary_key=True, autoincrement=True),
        *declared_columns(LabelRecord),
        UniqueConstraint("exchange_id", "endpoint", "labeller"),
        Index("ix_labels_endpoint_labelled_at", "endpoint", "labelled_at"),
    )


class PromotionRow(Base):
    __tablename__ = "promotions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    action: Mapped[str] = mapped_column(String(16))  # promote | rollback
    from_endpoint: Mapped[str | None] = mapped_column(String(63))
    to_endpoint: Mapped[str] = mapped_column(String(63))
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text, default="")
    forced: Mapped[bool] = mapped_column(Boolean, default=False)
    verdict: Mapped[str | None] = mapped_column(String(16))
    report_snapshot: Mapped[str | None] = mapped_column(Text)
    at: Mapped[float] = mapped_column(Float, index=True)


class MirrorCounterRow(Base):
    """Per-replica snapshot of a candidate's copy accounting (the mirror's counters), upserted
    periodically and at shutdown, so a report read from the database can show drops.
    `replica` is unique per process lifetime, so sums across rows never double count."""

    __tablename__ = "mirror_counters"

    replica: Mapped[str] = mapped_column(String(64), primary_key=True)
    endpoint: Mapped[str] = mapped_column(String(63), primary_key=True)
    counters: Mapped[str] = mapped_column(Text)  # JSON object: counter name -> int
    updated_at: Mapped[float] = mapped_column(Float)


# --- ramp evidence (revision 0009) --------------------------------------------------------------


class RolloutRequestRow(Base):
    """One live request of an open rollout: `domain.records.RolloutRecord`'s fields, as declared
    there (the arm that served it, its session and turn, how it went), plus a surrogate id. The
    ramp's step judge reads a rollout's rows by time (`storage.reports.rollout`)."""

    __table__ = Table(
        "rollout_requests",
        Base.metadata,
        Column("id", BigId, primary_key=True, autoincrement=True),
        *declared_columns(RolloutRecord),
        Index("ix_rollout_requests_generation_at", "generation", "at"),
    )


# --- capture and capacity (revision 0003) ------------------------------------------------------


class CaptureRow(Base):
    """A captured, redacted request body of a mirrored exchange, kept for `canary capacity` to
    replay whole conversations: grouped by `session_key`, ordered by `turn_index`, paced by
    `received_at` / `answered_at`. Rows older than the retention age are deleted."""

    __tablename__ = "captures"
    __table_args__ = (Index("ix_captures_session_key_turn_index", "session_key", "turn_index"),)

    exchange_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    captured_at: Mapped[float] = mapped_column(Float, index=True)
    session_key: Mapped[str] = mapped_column(String(32))
    turn_index: Mapped[int] = mapped_column(Integer, default=0)
    received_at: Mapped[float] = mapped_column(Float)
    answered_at: Mapped[float] = mapped_column(Float)
    route: Mapped[str] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(200))
    targets: Mapped[str] = mapped_column(Text, default="")  # ",a,b," like exchanges.targets
    body: Mapped[str] = mapped_column(Text)
    headers: Mapped[str] = mapped_column(Text, default="{}")
    body_bytes: Mapped[int] = mapped_column(Integer)


class CapacityResultRow(Base):
    """One `canary capacity` run: the headline numbers as columns (the report reads the newest
    per endpoint) and the whole result (steps, percentiles, intervals) as JSON."""

    __tablename__ = "capacity_results"
    __table_args__ = (Index("ix_capacity_results_endpoint_created_at", "endpoint", "created_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    endpoint: Mapped[str] = mapped_column(String(63))
    reference: Mapped[str] = mapped_column(String(63))
    created_at: Mapped[float] = mapped_column(Float)
    load_unit: Mapped[str] = mapped_column(String(16))
    slo: Mapped[str] = mapped_column(Text)
    capacity: Mapped[float | None] = mapped_column(Float)
    capacity_low: Mapped[float | None] = mapped_column(Float)
    capacity_high: Mapped[float | None] = mapped_column(Float)
    reference_capacity: Mapped[float | None] = mapped_column(Float)
    reference_low: Mapped[float | None] = mapped_column(Float)
    reference_high: Mapped[float | None] = mapped_column(Float)
    ratio: Mapped[float | None] = mapped_column(Float)
    ratio_low: Mapped[float | None] = mapped_column(Float)
    ratio_high: Mapped[float | None] = mapped_column(Float)
    usd_per_1m_tokens: Mapped[float | None] = mapped_column(Float)
    reference_usd_per_1m_tokens: Mapped[float | None] = mapped_column(Float)
    result_json: Mapped[str] = mapped_column(Text, default="{}")


# --- report segments (revision 0007) ------------------------------------------------------------


class ReportSegmentRow(Base):
    """A candidate's pairs received in [starts_at, ends_at), already reduced to the report's
    columns (`evaluators.pairs.segments`): a report reads these instead of joining and
    converting the rows again. Valid while `exchanges` still counts the exchanges in that span
    and no observation newer than `watermark` (observations.id) belongs to one of them; every
    report checks both, recomputes what changed, and a stale row is replaced, never trusted."""

    __tablename__ = "report_segments"
    __table_args__ = (UniqueConstraint("candidate", "control", "params", "starts_at", "ends_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    candidate: Mapped[str] = mapped_column(String(63))
    control: Mapped[str] = mapped_column(String(63), default="")  # "" when none
    # The column format and the inputs the columns depend on (text limits).
    params: Mapped[str] = mapped_column(String(64))
    starts_at: Mapped[float] = mapped_column(Float)
    ends_at: Mapped[float] = mapped_column(Float)
    exchanges: Mapped[int] = mapped_column(Integer)  # all exchanges in the span when computed
    watermark: Mapped[int] = mapped_column(BigInteger)  # observations.id checked up to
    # Its observations with id > watermark - RECHECK_IDS when checked (storage.reports.segments).
    recent: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int] = mapped_column(Integer)  # the candidate's pairs in the span
    sample_size: Mapped[int] = mapped_column(Integer)  # similarity computed for ranks below
    computed_at: Mapped[float] = mapped_column(Float)
    data: Mapped[bytes] = mapped_column(LargeBinary)


# --- rollouts (revision 0008) -------------------------------------------------------------------

_OPEN = text("state IN ('running', 'paused')")


class RolloutRow(Base):
    """A candidate's ramp on live traffic (`domain.records.Rollout`; `steps` is a JSON list).
    At most one open rollout per live endpoint, enforced by a partial unique index."""

    __tablename__ = "rollouts"
    __table_args__ = (
        Index(
            "uq_rollouts_one_open", "live", unique=True, sqlite_where=_OPEN, postgresql_where=_OPEN
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    candidate: Mapped[str] = mapped_column(String(63))
    live: Mapped[str] = mapped_column(String(63))
    state: Mapped[str] = mapped_column(String(16))
    weight: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(Integer)
    steps: Mapped[str] = mapped_column(Text)
    min_step_s: Mapped[float] = mapped_column(Float)
    salt: Mapped[str] = mapped_column(String(32))
    generation: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[float] = mapped_column(Float)
    step_started_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class RolloutEventRow(Base):
    """One change of a rollout (`domain.records.RolloutEvent`; `evidence` a JSON object)."""

    __tablename__ = "rollout_events"
    __table_args__ = (Index("ix_rollout_events_rollout_id_id", "rollout_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    rollout_id: Mapped[int] = mapped_column(BigId, ForeignKey("rollouts.id", ondelete="CASCADE"))
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16))
    from_weight: Mapped[float] = mapped_column(Float)
    to_weight: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(Integer)
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[str | None] = mapped_column(Text)
