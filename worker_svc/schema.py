"""The worker's tables: delegations, plus the agent kernel's conversation tables."""

from __future__ import annotations

import sqlalchemy as sa

from quarry.agent.conversation import metadata_with_conversations
from quarry.db import UTCDateTime, json_type
from quarry.recording import add_recording_tables

metadata = metadata_with_conversations()
add_recording_tables(metadata)

delegations = sa.Table(
    "worker_delegations",
    metadata,
    sa.Column("delegation_id", sa.String(256), primary_key=True),
    sa.Column("run_id", sa.String(256), nullable=False),
    sa.Column("tool_call_id", sa.String(256), nullable=False),
    sa.Column("conversation_id", sa.String(128), nullable=False),
    sa.Column("scratchpad_thread_id", sa.String(63), nullable=False),
    sa.Column("role", sa.String(32), nullable=False),
    sa.Column("task", json_type(), nullable=False),
    # running, succeeded, failed
    sa.Column("state", sa.String(16), nullable=False),
    # The outcome, once the delegation has ended.
    sa.Column("result", json_type(), nullable=True),
    sa.Column("last_error", sa.Text, nullable=False),
    sa.Column("create_time", UTCDateTime, nullable=False),
    sa.Column("end_time", UTCDateTime, nullable=True),
    # The worker process running it and when it last said so: a lease, so that a delegation whose
    # worker died is ended as failed instead of staying "running".
    sa.Column("owner", sa.String(64), nullable=False, server_default=""),
    sa.Column("heartbeat_time", UTCDateTime, nullable=True),
    # The configured id of the worker that ran it (QUARRY_WORKER_ID), shown to operators.
    sa.Column("worker_id", sa.String(64), nullable=False, server_default=""),
    sa.Index("worker_delegations_by_state", "state", "heartbeat_time"),
)
