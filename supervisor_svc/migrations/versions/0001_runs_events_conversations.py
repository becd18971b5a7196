"""Runs, run events and the supervisor's conversations.

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
        "agent_conversations",
        sa.Column("conversation_id", sa.String(128), primary_key=True),
        sa.Column("last_sequence_no", sa.BigInteger, nullable=False),
        sa.Column("create_time", UTCDateTime, nullable=False),
    )
    op.create_table(
        "agent_messages",
        sa.Column(
            "conversation_id",
            sa.String(128),
            sa.ForeignKey("agent_conversations.conversation_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("sequence_no", sa.BigInteger, primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("tool_calls", json_type(), nullable=False),
        sa.Column("tool_call_id", sa.String(256), nullable=False),
        sa.Column("create_time", UTCDateTime, nullable=False),
    )
    op.create_table(
        "supervisor_runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("request_id", sa.String(256), nullable=True, unique=True),
        sa.Column("request_digest", sa.String(64), nullable=False),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("options", json_type(), nullable=False),
        sa.Column("labels", json_type(), nullable=False),
        sa.Column("scratchpad_thread_id", sa.String(63), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("report", json_type(), nullable=True),
        sa.Column("error_code", sa.String(32), nullable=False),
        sa.Column("last_error", sa.Text, nullable=False),
        sa.Column("usage", json_type(), nullable=False),
        sa.Column("last_sequence_no", sa.BigInteger, nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("heartbeat_time", UTCDateTime, nullable=False),
        sa.Column("cancel_reason", sa.Text, nullable=True),
        sa.Column("create_time", UTCDateTime, nullable=False),
        sa.Column("start_time", UTCDateTime, nullable=True),
        sa.Column("end_time", UTCDateTime, nullable=True),
    )
    op.create_index("supervisor_runs_by_time", "supervisor_runs", ["create_time", "run_id"])
    op.create_index("supervisor_runs_by_state", "supervisor_runs", ["state", "heartbeat_time"])
    op.create_table(
        "supervisor_run_events",
        sa.Column(
            "run_id",
            sa.String(64),
            sa.ForeignKey("supervisor_runs.run_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("sequence_no", sa.BigInteger, primary_key=True),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("terminal", sa.Boolean, nullable=False),
        sa.Column("create_time", UTCDateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("supervisor_run_events")
    op.drop_table("supervisor_runs")
    op.drop_table("agent_messages")
    op.drop_table("agent_conversations")
