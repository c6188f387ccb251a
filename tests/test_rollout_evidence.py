"""The rollout's evidence is declared once (domain/observation.py: `Outcome`, which the mirror's
observation extends too; domain/records.py: `RolloutRequest`, `RolloutRecord`): the RAMP frame, the
`rollout_requests` table, the writer's row and the step's arrays follow from it; a second
declaration anywhere in the rollout's code fails here; and adding a quantity is one declaration,
its use and a migration (walked here with a synthetic field; docs/add-a-metric.md's own walk,
applied to a copy of the tree, is tests/test_add_a_metric_walk.py)."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Column, Connection, Float, Index, MetaData, Table, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.observation import Measured, Outcome, Quantity, describe
from domain.records import ObservationRecord, RolloutRecord, RolloutRequest
from gateway.mirror.channel import frames
from storage.models import BigId, RolloutRequestRow, declared_columns
from storage.reports.rollout import ROLLOUT_COLUMNS, evidence_columns
from storage.writer import rollout_row

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("domain", "gateway", "evaluators", "storage")
OUTCOME = tuple(f.name for f in describe(Outcome))
EVIDENCE = frozenset(f.name for f in describe(RolloutRecord))
INHERITED = {
    c.__name__: [f.name for f in describe(c)] for c in (Outcome, RolloutRequest, RolloutRecord)
}
DECLARATIONS = {("domain.observation", "Outcome")} | {
    ("domain.records", name) for name in ("RolloutRequest", "RolloutRecord")
}
# Nothing shares the outcome's fields by declaring them again: the observation extends it
# (`class Measured(Outcome)`), as the rollout's records do.
SHARED_WITH_THE_OBSERVATION: set[tuple[str, str]] = set()


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
    """The module imports the rollout's declared record (the evidence's path)."""
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module in ("domain.records", "domain.observation")
        and bool({a.name for a in node.names} & {"Outcome", "RolloutRequest", "RolloutRecord"})
        for node in ast.walk(tree)
    )


# The rollout's own modules: its package, its statistics and its SQL (state and evidence).
ROLLOUT_MODULES = ("gateway.rollout", "evaluators.rollout", "storage.reports.rollout",
                   "storage.rollouts")  # fmt: skip


def _strings(node: ast.AST, constants: dict[str, str]) -> list[str]:
    """The string constants an expression is built from, a module-level name of one resolved
    to its value (a format kept in a variable is still a literal format)."""
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            out.append(sub.value)
        elif isinstance(sub, ast.Name) and sub.id in constants:
            out.append(constants[sub.id])
    return out


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level names bound to a string built from literals only."""
    found: dict[str, str] = {}
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            parts = _strings(value, found)
            names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
            if parts and names <= found.keys() | {"str"}:
                found[target.id] = "".join(parts)
    return found


def _inherited(node: ast.AST) -> set[str]:
    """The evidence's fields a class inherits from the declaration it is built on (Outcome,
    RolloutRequest, RolloutRecord); empty for any other class."""
    bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in getattr(node, "bases", ())}
    return set().union(*(set(INHERITED[b]) for b in bases & INHERITED.keys()))


def _packed_codes(fmt: str) -> int:
    """How many fields a `struct` format packs (its byte-order prefix and counts left out)."""
    return sum(1 for c in fmt.lstrip("!@=<>") if c.isalpha() or c == "?")


def second_declarations(sources: dict[str, str]) -> list[str]:
    """Every place that spells out the rollout's evidence again. In the rollout's modules and
    any module importing its record: a class annotating one of the outcome's fields or two of
    the evidence's (a msgspec.Struct, an ORM row, a one-field re-declaration), a function
    taking one of the outcome's fields or three of the evidence's as parameters (a positional
    signature), a tuple, list or set of two or more of the outcome's field names (a hand-kept
    column list), and a `struct` format of more than three fields with a float among them
    (the evidence's durations) from literals, directly or through a module-level variable; in
    the rollout's own modules one field of the outcome is enough. Anywhere: a class built on
    the declaration that annotates one of its fields again; in `domain`, a class annotating
    two of the outcome's fields outside the declaration."""
    found = []
    outcome = set(OUTCOME)
    for module, source in sources.items():
        tree = ast.parse(source)
        carries = _carries_the_record(tree)
        in_rollout = carries or module.startswith(ROLLOUT_MODULES)
        constants = _module_strings(tree)
        for node in ast.walk(tree):
            where = (module, getattr(node, "name", ""))
            if where in DECLARATIONS | SHARED_WITH_THE_OBSERVATION:
                continue
            names = _declared(node)
            is_class = isinstance(node, ast.ClassDef)
            strict = module.startswith(ROLLOUT_MODULES)
            least = 2 if is_class else 3
            spelled = (
                (in_rollout and len(names & EVIDENCE) >= least)
                or (strict and bool(names & outcome))
                or (is_class and bool(names & _inherited(node)))
                or (is_class and module.startswith("domain") and len(names & outcome) >= 2)
            )
            if spelled:
                found.append(f"{module}.{where[1]}: {sorted(names & EVIDENCE)}")
            if in_rollout and isinstance(node, ast.Tuple | ast.List | ast.Set):
                listed = {
                    e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in outcome
                }
                if len(listed) >= 2:
                    found.append(f"{module}:{node.lineno}: the columns by hand {sorted(listed)}")
            if (
                in_rollout
                and isinstance(node, ast.Call)
                and ast.unparse(node.func).endswith("Struct")
                and node.args
                and _packed_codes("".join(_strings(node.args[0], constants))) > 3
                and any(c in "".join(_strings(node.args[0], constants)) for c in "def")
            ):
                fmt = "".join(_strings(node.args[0], constants))
                found.append(f"{module}:{node.lineno}: packed layout {fmt!r}")
    return found


def _sources() -> dict[str, str]:
    return {
        _module(path): path.read_text()
        for pkg in PACKAGES
        for path in sorted((ROOT / pkg).rglob("*.py"))
    }


def test_the_rollout_evidence_is_declared_once() -> None:
    """No module of the packages declares a field of the rollout's evidence a second time."""
    assert second_declarations(_sources()) == []


PLANTED = {
    # The forms the evidence was once spelled in.
    "a hand-typed ORM row": (
        "storage.models",
        "from domain.records import RolloutRecord\n"
        "class RolloutRequestRow:\n    ttft_s: Mapped[float]\n    e2e_s: Mapped[float]\n",
    ),
    "a literal packed format": (
        "gateway.mirror.channel.frames",
        "import struct\nfrom domain.records import RolloutRecord\n"
        "R = struct.Struct('!qBqHBdd?d')\n",
    ),
    "a positional sink signature": (
        "gateway.rollout.hooks",
        "class RolloutSink:\n"
        "    def put_rollout(self, generation, arm, session, status, ttft_s, e2e_s): ...\n",
    ),
    "a hand-written struct of the outcome": (
        "domain.elsewhere",
        "class Evidence:\n    status: int\n    error_kind: str\n    finished: bool\n",
    ),
    # A msgspec.Struct with the evidence's field names, in the rollout's state and storage.
    "a Struct in the rollout's state module": (
        "gateway.rollout.state",
        "import msgspec\nclass StepRow(msgspec.Struct):\n    session: int\n    ttft_s: float\n",
    ),
    "a Struct in the rollout's storage module": (
        "storage.rollouts",
        "import msgspec\nclass Kept(msgspec.Struct):\n    arm: int\n    e2e_s: float\n",
    ),
    # One field declared again on a class built on the declaration.
    "a one-field re-declaration": (
        "gateway.mirror.evidence",
        "from domain.records import RolloutRequest\n"
        "class Timed(RolloutRequest, kw_only=True):\n    ttft_s: float | None = None\n",
    ),
    # The columns' names kept by hand.
    "a tuple of the columns' names": (
        "gateway.rollout.controller",
        "COLUMNS = ('session', 'arm', 'turn', 'ok', 'ttft_s', 'e2e_s', 'disconnected')\n",
    ),
    # A packed format kept in a variable, then handed to struct.
    "a struct format built from a variable": (
        "gateway.mirror.channel.frames",
        "import struct\nfrom domain.records import RolloutRequest\n"
        "FMT = '!qBqHB' + 'dd?d'\nR = struct.Struct(FMT)\n",
    ),
}


@pytest.mark.parametrize("form", PLANTED)
def test_a_second_declaration_is_found(form: str) -> None:
    """The rule sees each form a second declaration of the evidence was written in, planted
    alone in a module where it would have been written."""
    module, source = PLANTED[form]
    assert len(second_declarations({module: source})) == 1, form


def test_the_planted_forms_pass_once_they_follow_the_declaration() -> None:
    """The same modules, written from the declaration, are not second declarations: the rule
    does not fire on every class or format of those modules."""
    derived = {
        "gateway.rollout.controller": "COLUMNS = tuple(ROLLOUT_COLUMNS)\n",
        "gateway.mirror.channel.frames": (
            "import struct\nfrom domain.records import RolloutRequest\n"
            "FRAME = struct.Struct('!BII')\nR = struct.Struct('!BII' + META.format[1:])\n"
        ),
        "gateway.rollout.arms": "import struct\nHEADER = struct.Struct('@8sQQQ')\n",
        "gateway.rollout.state": "class Step:\n    weight: float\n    session_count: int\n",
    }
    assert second_declarations(derived) == []


def test_every_form_follows_the_declaration() -> None:
    """The frame carries RolloutRequest's fields in order, the table holds RolloutRecord's (a
    surrogate id first, NULL where None is allowed), the writer's row is the record by name."""
    assert frames.ROLLOUT_LAYOUT.names == tuple(f.name for f in describe(RolloutRequest))
    table = RolloutRequestRow.__table__
    declared = describe(RolloutRecord)
    assert [c.name for c in table.columns] == ["id", *(f.name for f in declared)]
    for f in declared:
        assert table.c[f.name].nullable == f.nullable, f.name
    record = RolloutRecord(generation=3, arm=1, session=-5, at=1.0, turn=2, status=200)
    assert rollout_row(record) == {f.name: getattr(record, f.name) for f in declared}
    assert rollout_row(record)["ttft_s"] is None  # missing: None, stored as NULL


def test_the_step_arrays_are_the_declared_durations() -> None:
    """The step's float arrays are the outcome's durations; the pure statistic takes them as one
    mapping (no parameter per field), and the controller hands it the evidence's mapping whole."""
    durations = [f.name for f in describe(Outcome) if f.quantity.unit == "s"]
    assert [n for n, t in ROLLOUT_COLUMNS.items() if t is np.float64] == durations
    tree = ast.parse((ROOT / "evaluators/rollout/arms.py").read_text())
    [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "session_units"]
    assert [a.arg for a in fn.args.posonlyargs + fn.args.args] == ["columns"]
    controller = ast.parse((ROOT / "gateway/rollout/controller.py").read_text())
    calls = [
        n
        for n in ast.walk(controller)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "session_units"
    ]
    assert calls and all(len(c.args) == 1 and isinstance(c.args[0], ast.Name) for c in calls)


def test_the_observation_and_the_rollout_share_one_outcome() -> None:
    """The mirror's observation and the rollout's request both extend `Outcome`: status, error
    kind, TTFT, E2E and finished are declared once, and each of their tables carries them."""
    assert issubclass(Measured, Outcome) and issubclass(RolloutRequest, Outcome)
    assert ObservationRecord is not None and issubclass(ObservationRecord, Outcome)
    observed = [f.name for f in describe(ObservationRecord)]
    assert observed[: len(OUTCOME)] == list(OUTCOME)
    assert [f.name for f in describe(RolloutRecord)][: len(OUTCOME)] == list(OUTCOME)


# --- the walk: adding a quantity to the rollout's evidence ------------------------------------


class WalkRequest(RolloutRequest, kw_only=True):
    """1. The declaration: one field (in the product, on `Outcome` in domain/observation.py)."""

    probe_s: Annotated[float | None, Quantity("s")] = None


class WalkRecord(WalkRequest, kw_only=True):
    """RolloutRecord's own fields on top, as RolloutRecord adds them to RolloutRequest."""

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
    """Autogenerate's changes from the database to `metadata`, on the rollout's table only."""

    def ours(name: str | None, kind: str, _parents: object) -> bool:
        return kind in ("schema", "column") or name in (
            "rollout_requests", "ix_rollout_requests_generation_at",
        )  # fmt: skip

    context = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": ours})
    return list(compare_metadata(context, metadata))


def _add_column(conn: Connection) -> None:
    """3. The migration: one Alembic operation (in the product, revision 0012's upgrade)."""
    Operations(MigrationContext.configure(conn)).add_column(
        "rollout_requests", Column("probe_s", Float(), nullable=True)
    )


async def test_adding_a_quantity_is_one_declaration_its_use_and_a_migration(
    db_engine: AsyncEngine,
) -> None:
    """A new quantity declared once reaches the frame (packed, None kept as None), the table
    (whose only difference from the head schema is that one column, added by one operation),
    the writer's row and the step's arrays, with nothing else changed."""
    # 2. Its use: the proxy fills it where it records the outcome (RolloutRoute.record's keywords).
    sent = WalkRequest(generation=7, arm=1, session=-3, at=2.0, status=200, ttft_s=0.1,
                       e2e_s=0.9, finished=True, probe_s=0.02)  # fmt: skip
    layout = frames.RolloutLayout(WalkRequest)
    assert layout.meta.size == frames.ROLLOUT_META.size + 8  # one double more
    meta = layout.meta.pack(*layout.values(sent))
    assert WalkRequest(**layout.fields(meta)) == sent  # type: ignore[arg-type]
    missing = msgspec.structs.replace(sent, probe_s=None)
    assert layout.fields(layout.meta.pack(*layout.values(missing)))["probe_s"] is None

    *before, last = ROLLOUT_COLUMNS
    assert list(evidence_columns(WalkRecord)) == [*before, "probe_s", last]

    metadata = MetaData()
    table = _walk_table(metadata)
    async with db_engine.begin() as conn:
        [diff] = await conn.run_sync(_diff, metadata)
        assert diff[0] == "add_column" and diff[3].name == "probe_s", diff
        await conn.run_sync(_add_column)
        assert await conn.run_sync(_diff, metadata) == []
        record = WalkRecord(**msgspec.structs.asdict(sent), turn=1, replica="h")
        await conn.execute(insert(table), [rollout_row(record)])  # type: ignore[arg-type]
        await conn.execute(insert(table), [rollout_row(msgspec.structs.replace(record, at=3.0,
                                                  probe_s=None))])  # type: ignore[arg-type]  # fmt: skip
        got = (await conn.execute(select(table.c.probe_s).order_by(table.c.at))).all()
    values = np.array([v for (v,) in got], dtype=np.float64)
    assert values[0] == 0.02 and math.isnan(values[1])  # NULL -> NaN in the step's arrays
