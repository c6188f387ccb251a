"""Rollouts: a candidate ramped on live traffic (`rollouts`) and every change of it
(`rollout_events`); a partial unique index on rollouts.live WHERE the state is open, so the
database itself refuses a second open rollout for one live endpoint, whatever racing replicas do.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_OPEN = sa.text("state IN ('running', 'paused')")


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("candidate", sa.String(length=63), nullable=False),
        sa.Column("live", sa.String(length=63), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Text(), nullable=False),
        sa.Column("min_step_s", sa.Float(), nullable=False),
        sa.Column("salt", sa.String(length=32), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("step_started_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollouts")),
    )
    op.create_index(
        "uq_rollouts_one_open",
        "rollouts",
        ["live"],
        unique=True,
        sqlite_where=_OPEN,
        postgresql_where=_OPEN,
    )
    op.create_table(
        "rollout_events",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("rollout_id", _ID, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("from_weight", sa.Float(), nullable=False),
        sa.Column("to_weight", sa.Float(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollouts.id"],
            name=op.f("fk_rollout_events_rollout_id_rollouts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_events")),
    )
    op.create_index(
        "ix_rollout_events_rollout_id_id", "rollout_events", ["rollout_id", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_rollout_events_rollout_id_id", table_name="rollout_events")
    op.drop_table("rollout_events")
    op.drop_index(
        "uq_rollouts_one_open", table_name="rollouts", sqlite_where=_OPEN, postgresql_where=_OPEN
    )
    op.drop_table("rollouts")
