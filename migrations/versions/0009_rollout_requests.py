"""Ramp evidence: every live request of an open rollout with its arm, session and turn
(`rollout_requests`), read by rollout generation and time.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rollout_requests",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("session", sa.BigInteger(), nullable=False),
        sa.Column("arm", sa.Integer(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("error_kind", sa.String(length=32), nullable=True),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("e2e_s", sa.Float(), nullable=True),
        sa.Column("finished", sa.Boolean(), nullable=False),
        sa.Column("replica", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_requests")),
    )
    op.create_index("ix_rollout_requests_generation_at", "rollout_requests", ["generation", "at"])


def downgrade() -> None:
    op.drop_index("ix_rollout_requests_generation_at", table_name="rollout_requests")
    op.drop_table("rollout_requests")
