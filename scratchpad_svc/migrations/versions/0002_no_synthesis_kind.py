"""Entry kind "synthesis" is gone from the contracts: entries of that kind read as notes.

The supervisor's report was never stored as an entry; a model could still have appended a
synthesis through the supervisor's tools. Such an entry stays, as the note it effectively was.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_entries = sa.table("scratchpad_entries", sa.column("kind", sa.String))


def upgrade() -> None:
    op.execute(_entries.update().where(_entries.c.kind == "synthesis").values(kind="note"))


def downgrade() -> None:
    """Nothing to undo: which notes were syntheses is not kept."""
