"""Threads and entries.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from quarry.db import UTCDateTime, json_type

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scratchpad_threads",
        sa.Column("thread_id", sa.String(63), primary_key=True),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("labels", json_type(), nullable=False),
        sa.Column("create_time", UTCDateTime, nullable=False),
        sa.Column("last_sequence_no", sa.BigInteger, nullable=False),
        sa.Column("request_id", sa.String(128), nullable=True, unique=True),
    )
    op.create_table(
        "scratchpad_entries",
        sa.Column(
            "thread_id",
            sa.String(63),
            sa.ForeignKey("scratchpad_threads.thread_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("sequence_no", sa.BigInteger, primary_key=True),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("author_id", sa.String(256), nullable=False),
        sa.Column("author_role", sa.String(32), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("sources", json_type(), nullable=False),
        sa.Column("create_time", UTCDateTime, nullable=False),
        sa.UniqueConstraint("thread_id", "request_id", name="uq_scratchpad_entries_request"),
    )


def downgrade() -> None:
    op.drop_table("scratchpad_entries")
    op.drop_table("scratchpad_threads")
