"""At most one live endpoint: a partial unique index on endpoints.role WHERE role = 'live', so
the database itself refuses a second live row whatever two racing replicas do.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 09:34:09.094651
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("endpoints", schema=None) as batch_op:
        batch_op.create_index(
            "uq_endpoints_one_live",
            ["role"],
            unique=True,
            sqlite_where=sa.text("role = 'live'"),
            postgresql_where=sa.text("role = 'live'"),
        )


def downgrade() -> None:
    with op.batch_alter_table("endpoints", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_endpoints_one_live",
            sqlite_where=sa.text("role = 'live'"),
            postgresql_where=sa.text("role = 'live'"),
        )
