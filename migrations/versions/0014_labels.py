"""People check the grader: the graded pairs kept for labelling (`label_items`: what the grader
was shown, `domain.records.LabelItem`) and people's labels (`labels`, one per pair and labeller,
`domain.records.LabelRecord`). A grader's `label_rate` lives in its JSON (`endpoints.grader`).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-08 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "label_items",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("exchange_id", sa.String(length=36), nullable=False),
        sa.Column("endpoint", sa.String(length=63), nullable=False),
        sa.Column("reference", sa.String(length=63), nullable=False),
        sa.Column("unit", sa.String(length=64), nullable=False),
        sa.Column("graded_at", sa.Float(), nullable=False),
        sa.Column("conversation", sa.Text(), nullable=False),
        sa.Column("candidate_answer", sa.Text(), nullable=False),
        sa.Column("reference_answer", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_label_items")),
        sa.UniqueConstraint(
            "exchange_id", "endpoint", name=op.f("uq_label_items_exchange_id_endpoint")
        ),
    )
    op.create_index("ix_label_items_endpoint_graded_at", "label_items", ["endpoint", "graded_at"])
    op.create_table(
        "labels",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("exchange_id", sa.String(length=36), nullable=False),
        sa.Column("endpoint", sa.String(length=63), nullable=False),
        sa.Column("labeller", sa.String(length=64), nullable=False),
        sa.Column("labelled_at", sa.Float(), nullable=False),
        sa.Column("candidate_first", sa.Boolean(), nullable=False),
        sa.Column("choice", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_labels")),
        sa.UniqueConstraint(
            "exchange_id",
            "endpoint",
            "labeller",
            name=op.f("uq_labels_exchange_id_endpoint_labeller"),
        ),
    )
    op.create_index("ix_labels_endpoint_labelled_at", "labels", ["endpoint", "labelled_at"])


def downgrade() -> None:
    op.drop_index("ix_labels_endpoint_labelled_at", table_name="labels")
    op.drop_table("labels")
    op.drop_index("ix_label_items_endpoint_graded_at", table_name="label_items")
    op.drop_table("label_items")
