"""Report segments: a candidate's pairs per span of arrival time, reduced to the report's columns
(`report_segments`), so a report over millions of pairs reads columns instead of joining rows.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 23:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "report_segments",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("candidate", sa.String(length=63), nullable=False),
        sa.Column("control", sa.String(length=63), nullable=False),
        sa.Column("params", sa.String(length=64), nullable=False),
        sa.Column("starts_at", sa.Float(), nullable=False),
        sa.Column("ends_at", sa.Float(), nullable=False),
        sa.Column("exchanges", sa.Integer(), nullable=False),
        sa.Column("watermark", sa.BigInteger(), nullable=False),
        sa.Column("recent", sa.Integer(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("sample_size", sa.Integer(), nullable=False),
        sa.Column("computed_at", sa.Float(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_report_segments")),
        sa.UniqueConstraint(
            "candidate",
            "control",
            "params",
            "starts_at",
            "ends_at",
            name=op.f("uq_report_segments_candidate_control_params_starts_at_ends_at"),
        ),
    )
    if op.get_bind().dialect.name == "postgresql":
        # The columns are raw float arrays: pglz would spend CPU on every read for little gain.
        op.execute("ALTER TABLE report_segments ALTER COLUMN data SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("report_segments")
