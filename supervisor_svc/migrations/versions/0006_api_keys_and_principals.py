"""API keys (digests only), and the principals who started runs and campaigns, decided approvals and sent
directives.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

from quarry.db import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "supervisor_api_keys",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("principal", sa.String(128), nullable=False),
        sa.Column("roles", sa.String(128), nullable=False),
        sa.Column("digest", sa.LargeBinary(32), nullable=False, unique=True),
        sa.Column("create_time", UTCDateTime, nullable=False),
        sa.Column("revoke_time", UTCDateTime, nullable=True),
    )
    # Nullable: rows written before principals were recorded, and by an earlier release during a rollout.
    op.add_column("supervisor_runs", sa.Column("created_by", sa.String(128), nullable=True))
    op.add_column("supervisor_runs", sa.Column("decided_by", sa.String(128), nullable=True))
    op.add_column("supervisor_campaigns", sa.Column("created_by", sa.String(128), nullable=True))
    op.add_column("supervisor_campaign_directives", sa.Column("sent_by", sa.String(128), nullable=True))


def downgrade() -> None:
    op.drop_column("supervisor_campaign_directives", "sent_by")
    op.drop_column("supervisor_campaigns", "created_by")
    op.drop_column("supervisor_runs", "decided_by")
    op.drop_column("supervisor_runs", "created_by")
    op.drop_table("supervisor_api_keys")
