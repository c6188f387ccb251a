"""Model upgrades judged by an LLM grader: a candidate's `grader` (a JSON object in
`endpoints.grader`, NULL when none) and one row per grading in `gradings`
(`domain.records.GradingRecord`), read by candidate and exchange.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
# 0010 is the token-counting revision of another branch; the lead re-chains at merge.
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("endpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("grader", sa.Text(), nullable=True))
    op.create_table(
        "gradings",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("exchange_id", sa.String(length=36), nullable=False),
        sa.Column("endpoint", sa.String(length=63), nullable=False),
        sa.Column("reference", sa.String(length=63), nullable=False),
        sa.Column("graded_at", sa.Float(), nullable=False),
        sa.Column("candidate_first", sa.Boolean(), nullable=False),
        sa.Column("swapped", sa.Boolean(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("winner", sa.String(length=16), nullable=True),
        sa.Column("candidate_chars", sa.Integer(), nullable=False),
        sa.Column("reference_chars", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error_kind", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gradings")),
    )
    op.create_index("ix_gradings_endpoint_exchange", "gradings", ["endpoint", "exchange_id"])
    op.create_index("ix_gradings_endpoint_graded_at", "gradings", ["endpoint", "graded_at"])


def downgrade() -> None:
    op.drop_index("ix_gradings_endpoint_graded_at", table_name="gradings")
    op.drop_index("ix_gradings_endpoint_exchange", table_name="gradings")
    op.drop_table("gradings")
    with op.batch_alter_table("endpoints", schema=None) as batch_op:
        batch_op.drop_column("grader")
