"""Run recordings: the HTTP exchanges (model calls, searches, fetched pages) each run made, and their bodies
by content hash, for export and exact replay.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

from alembic import op

from quarry.recording import create_recording_tables, drop_recording_tables

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_recording_tables(op.get_bind())


def downgrade() -> None:
    drop_recording_tables(op.get_bind())
