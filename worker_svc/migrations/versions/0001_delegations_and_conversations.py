"""Delegations and their conversations.

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
        "worker_delegations",
        sa.Column("delegation_id", sa.String(256), primary_key=True),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("tool_call_id", sa.String(256), nullable=False),
        sa.Column("conversation_id", sa.String(128), nullable=False),
        sa.Column("scratchpad_thread_id", sa.String(63), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("task", json_type(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("result", json_type(), nullable=True),
        sa.Column("last_error", sa.Text, nullable=False),
        sa.Column("create_time", UTCDateTime, nullable=False),
        sa.Column("end_time", UTCDateTime, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("worker_delegations")
    op.drop_table("agent_messages")
    op.drop_table("agent_conversations")
