"""The supervisor's tables: runs, their public event log, and the agent kernel's conversation tables."""

from __future__ import annotations

import sqlalchemy as sa

from quarry.agent.conversation import metadata_with_conversations
from quarry.db import UTCDateTime, json_type

metadata = metadata_with_conversations()

runs = sa.Table(
    "supervisor_runs",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    # The StartRun idempotency key, and a digest of what it asked for (a reused key must ask the same).
    sa.Column("request_id", sa.String(256), nullable=True, unique=True),
    sa.Column("request_digest", sa.String(64), nullable=False),
    sa.Column("question", sa.Text, nullable=False),
    sa.Column("options", json_type(), nullable=False),
    sa.Column("labels", json_type(), nullable=False),
    sa.Column("scratchpad_thread_id", sa.String(63), nullable=False),
    # queued, running, succeeded, failed, cancelled
    sa.Column("state", sa.String(16), nullable=False),
    # Set once the run succeeded: markdown, citations, removed_citations, budget flags.
    sa.Column("report", json_type(), nullable=True),
    # Set once the run succeeded: what its report lacks (RunWarning values); NULL means none, and is
    # also what an earlier release writes, since it does not know the column.
    sa.Column("warnings", json_type(), nullable=True),
    sa.Column("error_code", sa.String(32), nullable=False),
    sa.Column("last_error", sa.Text, nullable=False),
    # Token usage by tier, kept current while the run goes on.
    sa.Column("usage", json_type(), nullable=False),
    # The event counter: the newest event's sequence number.
    sa.Column("last_sequence_no", sa.BigInteger, nullable=False),
    # The process executing the run, and when it last said so (a lease: a run whose owner stops
    # renewing it is ended as failed by whichever supervisor notices).
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("heartbeat_time", UTCDateTime, nullable=False),
    # Set by CancelRun; the owner sees it on its next heartbeat when another replica took the call.
    sa.Column("cancel_reason", sa.Text, nullable=True),
    sa.Column("create_time", UTCDateTime, nullable=False),
    sa.Column("start_time", UTCDateTime, nullable=True),
    sa.Column("end_time", UTCDateTime, nullable=True),
    sa.Index("supervisor_runs_by_time", "create_time", "run_id"),
    sa.Index("supervisor_runs_by_state", "state", "heartbeat_time"),
)

run_events = sa.Table(
    "supervisor_run_events",
    metadata,
    sa.Column("run_id", sa.String(64), sa.ForeignKey("supervisor_runs.run_id", ondelete="CASCADE"), primary_key=True),
    sa.Column("sequence_no", sa.BigInteger, primary_key=True),
    # The serialized quarry.v1.RunEvent: the public contract is also the storage format, so a
    # re-attaching client gets byte-for-byte what a live one got.
    sa.Column("payload", sa.LargeBinary, nullable=False),
    sa.Column("terminal", sa.Boolean, nullable=False),
    sa.Column("create_time", UTCDateTime, nullable=False),
)
