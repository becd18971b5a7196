"""Leases on running delegations: owner and heartbeat.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from quarry.db import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("worker_delegations") as table:
        table.add_column(sa.Column("owner", sa.String(64), nullable=False, server_default=""))
        table.add_column(sa.Column("heartbeat_time", UTCDateTime, nullable=True))
        table.create_index("worker_delegations_by_state", ["state", "heartbeat_time"])


def downgrade() -> None:
    with op.batch_alter_table("worker_delegations") as table:
        table.drop_index("worker_delegations_by_state")
        table.drop_column("heartbeat_time")
        table.drop_column("owner")
