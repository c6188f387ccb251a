"""Scoring: `endpoints.score_rate` (NULL: the kind's default) and the scores each arm's engine
gave production's answer (`observations.score_*`, NULL when the pair was not scored).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SCORES = (
    ("score_tokens", sa.Integer()),
    ("score_logprob", sa.Float()),
    ("score_top1", sa.Float()),
    ("score_kl", sa.Float()),
)


def upgrade() -> None:
    with op.batch_alter_table("endpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("score_rate", sa.Float(), nullable=True))
    with op.batch_alter_table("observations", schema=None) as batch_op:
        for name, type_ in _SCORES:
            batch_op.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        for name, _ in reversed(_SCORES):
            batch_op.drop_column(name)
    with op.batch_alter_table("endpoints", schema=None) as batch_op:
        batch_op.drop_column("score_rate")
