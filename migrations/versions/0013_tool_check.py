"""Tool-call validity on every observation: `observations.tool_check` (None: not applicable;
"valid"; or the first problem, a `domain.outcomes.ToolCheck` value) and `tool_error` (that
problem described without any argument value), declared in `domain.observation.Measured` and
set by the mirror process (gateway/mirror/toolcalls). Rows stored before it are NULL: their
calls were never checked, and the evaluators leave them out of the validity comparison.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 23:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tool_check", sa.String(length=24), nullable=True))
        batch_op.add_column(sa.Column("tool_error", sa.String(length=160), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.drop_column("tool_error")
        batch_op.drop_column("tool_check")
