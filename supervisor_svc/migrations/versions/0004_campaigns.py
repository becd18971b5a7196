"""Campaigns, their event logs and their directives.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

from quarry.db import UTCDateTime, json_type

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "supervisor_campaigns",
        sa.Column("campaign_id", sa.String(64), primary_key=True),
        sa.Column("request_id", sa.String(256), nullable=True, unique=True),
        sa.Column("request_digest", sa.String(64), nullable=False),
        sa.Column("spec", json_type(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("cycle", sa.Integer, nullable=False),
        sa.Column("best_value", sa.Double, nullable=True),
        sa.Column("noise_floor", sa.Double, nullable=True),
        sa.Column("tokens", sa.BigInteger, nullable=False),
        sa.Column("usage_window", json_type(), nullable=False),
        sa.Column("cycles", sa.Integer, nullable=False),
        sa.Column("branch", sa.String(128), nullable=False),
        sa.Column("scratchpad_thread_id", sa.String(63), nullable=False),
        sa.Column("pause_reason", sa.Text, nullable=False),
        sa.Column("end_reason", sa.Text, nullable=False),
        sa.Column("pending_directives", sa.Integer, nullable=False),
        sa.Column("last_sequence_no", sa.BigInteger, nullable=False),
        sa.Column("sleep_until", UTCDateTime, nullable=True),
        sa.Column("sleep_reason", sa.Text, nullable=False),
        sa.Column("resume_time", UTCDateTime, nullable=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("heartbeat_time", UTCDateTime, nullable=False),
        sa.Column("create_time", UTCDateTime, nullable=False),
        sa.Column("update_time", UTCDateTime, nullable=False),
        sa.Column("end_time", UTCDateTime, nullable=True),
    )
    op.create_index("supervisor_campaigns_by_time", "supervisor_campaigns", ["create_time", "campaign_id"])
    op.create_index("supervisor_campaigns_by_state", "supervisor_campaigns", ["state", "heartbeat_time"])
    op.create_table(
        "supervisor_campaign_events",
        sa.Column(
            "campaign_id",
            sa.String(64),
            sa.ForeignKey("supervisor_campaigns.campaign_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("sequence_no", sa.BigInteger, primary_key=True),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("terminal", sa.Boolean, nullable=False),
        sa.Column("dedupe_key", sa.String(128), nullable=True),
        sa.Column("create_time", UTCDateTime, nullable=False),
        sa.UniqueConstraint("campaign_id", "dedupe_key", name="supervisor_campaign_events_dedupe"),
    )
    op.create_table(
        "supervisor_campaign_directives",
        sa.Column(
            "campaign_id",
            sa.String(64),
            sa.ForeignKey("supervisor_campaigns.campaign_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("request_id", sa.String(256), primary_key=True),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("consumed_cycle", sa.Integer, nullable=False),
        sa.Column("create_time", UTCDateTime, nullable=False),
        sa.Column("consume_time", UTCDateTime, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("supervisor_campaign_directives")
    op.drop_table("supervisor_campaign_events")
    op.drop_table("supervisor_campaigns")
