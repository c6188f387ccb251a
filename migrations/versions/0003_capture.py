"""Capture and capacity: `captures` (redacted request bodies of mirrored exchanges, for
replaying whole conversations) and `capacity_results` (one row per `canary capacity` run).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "captures",
        sa.Column("exchange_id", sa.String(length=36), nullable=False),
        sa.Column("captured_at", sa.Float(), nullable=False),
        sa.Column("session_key", sa.String(length=32), nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.Column("answered_at", sa.Float(), nullable=False),
        sa.Column("route", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("targets", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("headers", sa.Text(), nullable=False),
        sa.Column("body_bytes", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("exchange_id", name=op.f("pk_captures")),
    )
    op.create_index(op.f("ix_captures_captured_at"), "captures", ["captured_at"])
    op.create_index("ix_captures_session_key_turn_index", "captures", ["session_key", "turn_index"])
    op.create_table(
        "capacity_results",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("endpoint", sa.String(length=63), nullable=False),
        sa.Column("reference", sa.String(length=63), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("load_unit", sa.String(length=16), nullable=False),
        sa.Column("slo", sa.Text(), nullable=False),
        sa.Column("capacity", sa.Float(), nullable=True),
        sa.Column("capacity_low", sa.Float(), nullable=True),
        sa.Column("capacity_high", sa.Float(), nullable=True),
        sa.Column("reference_capacity", sa.Float(), nullable=True),
        sa.Column("reference_low", sa.Float(), nullable=True),
        sa.Column("reference_high", sa.Float(), nullable=True),
        sa.Column("ratio", sa.Float(), nullable=True),
        sa.Column("ratio_low", sa.Float(), nullable=True),
        sa.Column("ratio_high", sa.Float(), nullable=True),
        sa.Column("usd_per_1m_tokens", sa.Float(), nullable=True),
        sa.Column("reference_usd_per_1m_tokens", sa.Float(), nullable=True),
        sa.Column("result_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_capacity_results")),
    )
    op.create_index(
        "ix_capacity_results_endpoint_created_at", "capacity_results", ["endpoint", "created_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_capacity_results_endpoint_created_at", table_name="capacity_results")
    op.drop_table("capacity_results")
    op.drop_index("ix_captures_session_key_turn_index", table_name="captures")
    op.drop_index(op.f("ix_captures_captured_at"), table_name="captures")
    op.drop_table("captures")
