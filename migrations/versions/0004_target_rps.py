"""Adaptive sampling: `endpoints.target_rps`, the copies per second a candidate asks for (NULL:
its `sample_rate` is used as it is; set: `sample_rate` is the ceiling of an adaptive share).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("endpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("target_rps", sa.Float(), nullable=True))


def downgrade() -> None:
    # SQLite cannot drop a column in place: batch mode copies the table (rows and the partial
    # one-live index survive, as the populated-database migration test checks).
    with op.batch_alter_table("endpoints", schema=None) as batch_op:
        batch_op.drop_column("target_rps")
