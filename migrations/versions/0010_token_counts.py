"""Tokens counted, not events: `observations.output_tokens` becomes the count of the answer's
text by one tokenizer for every arm (`token_counter` says which), the engine's own count moves to
`usage_tokens` (information), the SSE events that carried tokens to `token_events`, and the
gaps between them are named for what they are (`itl_*` -> `inter_event_*`).

Rows stored before this revision were counted by the engine's usage or by SSE events, one arm
one way and the other another; their counts move to `usage_tokens` / `token_events` and their
`output_tokens` and TPOT (derived from those counts) become NULL: uncounted, so they never gate
a token metric beside counted rows.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_GAPS = ("count", "mean_s", "p50_s", "p99_s", "max_s")


def upgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token_counter", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("usage_tokens", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("token_events", sa.Integer(), nullable=True))
    op.execute(
        "UPDATE observations SET usage_tokens = output_tokens WHERE output_tokens_source = 'usage'"
    )
    op.execute(
        "UPDATE observations SET token_events = output_tokens WHERE output_tokens_source = 'chunks'"
    )
    op.execute("UPDATE observations SET output_tokens = NULL, tpot_s = NULL")
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.drop_column("output_tokens_source")
        for suffix in _GAPS:
            batch_op.alter_column(f"itl_{suffix}", new_column_name=f"inter_event_{suffix}")


def downgrade() -> None:
    with op.batch_alter_table("observations", schema=None) as batch_op:
        for suffix in _GAPS:
            batch_op.alter_column(f"inter_event_{suffix}", new_column_name=f"itl_{suffix}")
        batch_op.add_column(sa.Column("output_tokens_source", sa.String(length=8), nullable=True))
    op.execute(
        "UPDATE observations SET output_tokens = usage_tokens, output_tokens_source = 'usage' "
        "WHERE usage_tokens IS NOT NULL"
    )
    op.execute(
        "UPDATE observations SET output_tokens = token_events, output_tokens_source = 'chunks' "
        "WHERE usage_tokens IS NULL AND token_events IS NOT NULL"
    )
    with op.batch_alter_table("observations", schema=None) as batch_op:
        batch_op.drop_column("token_events")
        batch_op.drop_column("usage_tokens")
        batch_op.drop_column("token_counter")
