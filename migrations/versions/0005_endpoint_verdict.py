"""One name per endpoint field: `endpoints.verdict_overrides` becomes `endpoints.verdict`, the
name the config file, the admin API, the CLI and `domain.endpoint` use.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("endpoints", schema=None) as batch_op:
        batch_op.alter_column("verdict_overrides", new_column_name="verdict")


def downgrade() -> None:
    with op.batch_alter_table("endpoints", schema=None) as batch_op:
        batch_op.alter_column("verdict", new_column_name="verdict_overrides")
