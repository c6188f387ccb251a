"""The writer's compiled INSERT binds what SQLAlchemy binds, a column type whose bind processor
does not bind None as None included (a `TypeDecorator` may map None to a value): such a column
is never left out of a chunk's statement, and what is stored is what SQLAlchemy's own
executemany stores, row for row, in a real SQLite file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    TypeDecorator,
    create_engine,
    insert,
    select,
)
from sqlalchemy.engine import Dialect

from storage.batch import _Compiled


class NoneAsDash(TypeDecorator[str]):
    """Binds None as '-' and every other value upper-cased."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str:
        return "-" if value is None else str(value).upper()


class Upper(TypeDecorator[str]):
    """Upper-cases a value and raises on None: SQLAlchemy calls it with None too."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str:
        return str(value.upper())


def _table(metadata: MetaData, name: str) -> Table:
    return Table(
        name,
        metadata,
        Column("id", Integer, primary_key=True),
        Column("plain", String, nullable=True),
        Column("dashed", NoneAsDash, nullable=True),
        Column("upper", Upper, nullable=True),
    )


def test_compiled_chunks_store_what_sqlalchemy_stores(tmp_path: Path) -> None:
    metadata = MetaData()
    ours, theirs = _table(metadata, "ours"), _table(metadata, "theirs")
    engine = create_engine(f"sqlite:///{tmp_path / 'c.db'}")
    metadata.create_all(engine)
    # A chunk where `plain` and `dashed` are None in every row, `upper` set in every row; then
    # one where each has values.
    chunks = [
        [{"id": i, "plain": None, "dashed": None, "upper": f"u{i}"} for i in range(3)],
        [{"id": 10 + i, "plain": f"p{i}", "dashed": f"d{i}", "upper": "x"} for i in range(3)],
    ]
    compiled = _Compiled.build(insert(ours), ours, engine.dialect, chunks[0][0])
    assert compiled is not None
    with engine.begin() as conn:
        for rows in chunks:
            chunk = compiled.chunk(rows)
            assert chunk is not None
            sql, params = chunk
            if rows is chunks[0]:
                assert '"plain"' not in sql and "plain" not in sql.split("VALUES")[0]
                assert "dashed" in sql  # its None binds as '-': leaving it out would store NULL
            conn.exec_driver_sql(sql, params)
            conn.execute(insert(theirs), rows)
        got = conn.execute(select(ours).order_by(ours.c.id)).all()
        want = conn.execute(select(theirs).order_by(theirs.c.id)).all()
    assert got == want
    assert got[0] == (0, None, "-", "U0")
    assert got[3] == (10, "p0", "D0", "X")
