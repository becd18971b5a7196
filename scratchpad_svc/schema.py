"""The scratchpad's tables. Only this service reads or writes them."""

from __future__ import annotations

import sqlalchemy as sa

from quarry.db import UTCDateTime, json_type

metadata = sa.MetaData()

threads = sa.Table(
    "scratchpad_threads",
    metadata,
    sa.Column("thread_id", sa.String(63), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("labels", json_type(), nullable=False),
    sa.Column("create_time", UTCDateTime, nullable=False),
    # The sequence counter: locked and advanced in the same transaction as the
    # inserts, so sequence numbers follow commit order with no gaps.
    sa.Column("last_sequence_no", sa.BigInteger, nullable=False),
    sa.Column("request_id", sa.String(128), nullable=True, unique=True),
)

entries = sa.Table(
    "scratchpad_entries",
    metadata,
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
