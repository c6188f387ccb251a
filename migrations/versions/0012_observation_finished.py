"""One outcome for the mirror and the ramp: `observations.finished` (the answer was delivered
whole: the stream's final event, or a whole plain answer), declared with the status, error
kind, TTFT and E2E in `domain.observation.Outcome`, as `rollout_requests.finished` already is.
Rows stored before it are NULL-free: false where they failed, true where they answered.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 21:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("finished", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.execute("UPDATE observations SET finished = (error_kind IS NULL AND status > 0)")


def downgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.drop_column("finished")
