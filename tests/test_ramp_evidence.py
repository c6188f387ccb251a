"""The ramp's evidence is declared once (domain/observation.py: `Outcome`, which the mirror's
observation extends too; domain/records.py: `RampRequest`, `RampRecord`): the RAMP frame, the
`rollout_requests` table, the writer's row and the step's arrays follow from it; a second
declaration anywhere in the ramp's code fails here; and adding a quantity is one declaration,
its use and a migration (walked with a synthetic field, as a quantity such as the inter-event
latency would be added)."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Column, Connection, Float, Index, MetaData, Table, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.observation import Measured, Outcome, Quantity, describe
from domain.records import ObservationRecord, RampRecord, RampRequest
from gateway.mirror.channel import frames
from storage.models import BigId, RolloutRequestRow, declared_columns
from storage.reports.ramp import RAMP_COLUMNS, evidence_columns
from storage.writer import ramp_row

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("domain", "gateway", "evaluators", "storage")
OUTCOME = tuple(f.name for f in describe(Outcome))
EVIDENCE = frozenset(f.name for f in describe(RampRecord))
DECLARATIONS = {("domain.observation", "Outcome")} | {
    ("domain.records", name) for name in ("RampRequest", "RampRecord")
}
# Nothing shares the outcome's fields by declaring them again: the observation extends it
# (`class Measured(Outcome)`), as the ramp's records do.
SHARED_WITH_THE_OBSERVATION: set[tuple[str, str]] = set()
# The ramp's pure statistic takes the step's arrays as parameters named as RAMP_COLUMNS names
# them (checked by test_the_step_arrays_are_the_declared_durations).
NAMED_AS_THE_ARRAYS = {("evaluators.ramp.arms", "session_units")}


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _declared(node: ast.AST) -> set[str]:
    """Names a class annotates in its body, or a function takes as parameters."""
    if isinstance(node, ast.ClassDef):
        return {
            n.target.id
            for n in node.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        a = node.args
        return {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    return set()


def _carries_the_record(tree: ast.Module) -> bool:
    """The module imports the ramp's declared record (the evidence's path)."""
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module in ("domain.records", "domain.observation")
        and bool({a.name for a in node.names} & {"Outcome", "RampRequest", "RampRecord"})
        for node in ast.walk(tree)
    )


def second_declarations(sources: dict[str, str]) -> list[str]:
    """Every class or function that spells out the ramp's evidence again: in the ramp's code
    (its packages, and any module importing its record) a class annotating two of its fields
    or a function taking three as parameters; in `domain`, a class annotating three of the
    outcome's fields; and a hand-written packed layout (a literal `struct.Struct` format) in a
    module that carries the record."""
    found = []
    for module, source in sources.items():
        tree = ast.parse(source)
        carries = _carries_the_record(tree)
        ramp = carries or module.startswith(
            ("gateway.server.ramp", "evaluators.ramp", "storage.reports.ramp")
        )
        for node in ast.walk(tree):
            where = (module, getattr(node, "name", ""))
            if where in DECLARATIONS | SHARED_WITH_THE_OBSERVATION | NAMED_AS_THE_ARRAYS:
                continue
            names = _declared(node)
            is_class = isinstance(node, ast.ClassDef)
            if (ramp and len(names & EVIDENCE) >= (2 if is_class else 3)) or (
                is_class and module.startswith("domain") and len(names & set(OUTCOME)) >= 3
            ):
                found.append(f"{module}.{where[1]}: {sorted(names & EVIDENCE)}")
            if (
                carries
                and isinstance(node, ast.Call)
                and ast.unparse(node.func).endswith("Struct")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and len(node.args[0].value.lstrip("!@=<>")) > 3
            ):
                found.append(f"{module}:{node.lineno}: packed layout {node.args[0].value!r}")
    return found


def _sources() -> dict[str, str]:
    return {
        _module(path): path.read_text()
        for pkg in PACKAGES
        for path in sorted((ROOT / pkg).rglob("*.py"))
    }


def test_the_ramp_evidence_is_declared_once() -> None:
    """No module of the packages declares a field of the ramp's evidence a second time."""
    assert second_declarations(_sources()) == []


def test_a_second_declaration_is_found() -> None:
    """The rule sees the forms the evidence was once spelled in: a hand-typed ORM row, a packed
    format, a positional sink signature, a hand-written struct of the outcome."""
    row = (
        "from domain.records import RampRecord\n"
        "class RolloutRequestRow:\n    ttft_s: Mapped[float]\n    e2e_s: Mapped[float]\n"
    )
    packed = (
        "import struct\nfrom domain.records import RampRecord\nR = struct.Struct('!qBqHBdd?d')\n"
    )
    sink = (
        "class RampSink:\n"
        "    def put_ramp(self, generation, arm, session, status, ttft_s, e2e_s): ...\n"
    )
    struct_ = "class Evidence:\n    status: int\n    error_kind: str\n    finished: bool\n"
    found = second_declarations(
        {
            "storage.models": row,
            "gateway.mirror.channel.frames": packed,
            "gateway.server.ramp.hooks": sink,
            "domain.elsewhere": struct_,
        }
    )
    assert len(found) == 4, found


def test_every_form_follows_the_declaration() -> None:
    """The frame carries RampRequest's fields in order, the table holds RampRecord's (a
    surrogate id first, NULL where None is allowed), the writer's row is the record by name."""
    assert frames.RAMP_LAYOUT.names == tuple(f.name for f in describe(RampRequest))
    table = RolloutRequestRow.__table__
    declared = describe(RampRecord)
    assert [c.name for c in table.columns] == ["id", *(f.name for f in declared)]
    for f in declared:
        assert table.c[f.name].nullable == f.nullable, f.name
    record = RampRecord(generation=3, arm=1, session=-5, at=1.0, turn=2, status=200)
    assert ramp_row(record) == {f.name: getattr(record, f.name) for f in declared}
    assert ramp_row(record)["ttft_s"] is None  # missing: None, stored as NULL


def test_the_step_arrays_are_the_declared_durations() -> None:
    """The step's float arrays are the outcome's durations, and the pure statistic takes the
    arrays by the names they are read under."""
    durations = [f.name for f in describe(Outcome) if f.quantity.unit == "s"]
    assert [n for n, t in RAMP_COLUMNS.items() if t is np.float64] == durations
    tree = ast.parse((ROOT / "evaluators/ramp/arms.py").read_text())
    [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "session_units"]
    assert [a.arg for a in fn.args.args] == list(RAMP_COLUMNS)


def test_the_observation_and_the_ramp_share_one_outcome() -> None:
    """The mirror's observation and the ramp's request both extend `Outcome`: status, error
    kind, TTFT, E2E and finished are declared once, and each of their tables carries them."""
    assert issubclass(Measured, Outcome) and issubclass(RampRequest, Outcome)
    assert ObservationRecord is not None and issubclass(ObservationRecord, Outcome)
    observed = [f.name for f in describe(ObservationRecord)]
    assert observed[: len(OUTCOME)] == list(OUTCOME)
    assert [f.name for f in describe(RampRecord)][: len(OUTCOME)] == list(OUTCOME)


# --- the walk: adding a quantity to the ramp's evidence -----------------------------------------


class WalkRequest(RampRequest, kw_only=True):
    """1. The declaration: one field (in the product, on `Outcome` in domain/observation.py)."""

    inter_event_p50_s: Annotated[float | None, Quantity("s")] = None


class WalkRecord(WalkRequest, kw_only=True):
    """RampRecord's own fields on top, as RampRecord adds them to RampRequest."""

    turn: int
    replica: Annotated[str, Quantity(length=64)] = ""


def _walk_table(metadata: MetaData) -> Table:
    """storage.models.RolloutRequestRow's table, generated from the walk's declaration."""
    return Table(
        "rollout_requests",
        metadata,
        Column("id", BigId, primary_key=True, autoincrement=True),
        *declared_columns(WalkRecord),
        Index("ix_rollout_requests_generation_at", "generation", "at"),
    )


def _diff(conn: Connection, metadata: MetaData) -> list[Any]:
    """Autogenerate's changes from the database to `metadata`, on the ramp's table only."""

    def ours(name: str | None, kind: str, _parents: object) -> bool:
        return kind in ("schema", "column") or name in (
            "rollout_requests", "ix_rollout_requests_generation_at",
        )  # fmt: skip

    context = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": ours})
    return list(compare_metadata(context, metadata))


def _add_column(conn: Connection) -> None:
    """3. The migration: one Alembic operation (in the product, revision 0012's upgrade)."""
    Operations(MigrationContext.configure(conn)).add_column(
        "rollout_requests", Column("inter_event_p50_s", Float(), nullable=True)
    )


async def test_adding_a_quantity_is_one_declaration_its_use_and_a_migration(
    db_engine: AsyncEngine,
) -> None:
    """A new quantity declared once reaches the frame (packed, None kept as None), the table
    (whose only difference from the head schema is that one column, added by one operation),
    the writer's row and the step's arrays, with nothing else changed."""
    # 2. Its use: the proxy fills it where it records the outcome (RampRoute.record's keywords).
    sent = WalkRequest(generation=7, arm=1, session=-3, at=2.0, status=200, ttft_s=0.1,
                       e2e_s=0.9, finished=True, inter_event_p50_s=0.02)  # fmt: skip
    layout = frames.RampLayout(WalkRequest)
    assert layout.meta.size == frames.RAMP.size + 8  # one double more
    meta = layout.meta.pack(*layout.values(sent))
    assert WalkRequest(**layout.fields(meta)) == sent  # type: ignore[arg-type]
    missing = msgspec.structs.replace(sent, inter_event_p50_s=None)
    assert layout.fields(layout.meta.pack(*layout.values(missing)))["inter_event_p50_s"] is None

    *before, last = RAMP_COLUMNS
    assert list(evidence_columns(WalkRecord)) == [*before, "inter_event_p50_s", last]

    metadata = MetaData()
    table = _walk_table(metadata)
    async with db_engine.begin() as conn:
        [diff] = await conn.run_sync(_diff, metadata)
        assert diff[0] == "add_column" and diff[3].name == "inter_event_p50_s", diff
        await conn.run_sync(_add_column)
        assert await conn.run_sync(_diff, metadata) == []
        record = WalkRecord(**msgspec.structs.asdict(sent), turn=1, replica="h")
        await conn.execute(insert(table), [ramp_row(record)])  # type: ignore[arg-type]
        await conn.execute(insert(table), [ramp_row(msgspec.structs.replace(record, at=3.0,
                                                  inter_event_p50_s=None))])  # type: ignore[arg-type]  # fmt: skip
        got = (await conn.execute(select(table.c.inter_event_p50_s).order_by(table.c.at))).all()
    values = np.array([v for (v,) in got], dtype=np.float64)
    assert values[0] == 0.02 and math.isnan(values[1])  # NULL -> NaN in the step's arrays
