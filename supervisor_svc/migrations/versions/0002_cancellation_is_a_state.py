"""Cancellation is a state, not an error: a cancelled run keeps its reason in cancel_reason.

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

_runs = sa.table(
    "supervisor_runs",
    sa.column("state", sa.String),
    sa.column("error_code", sa.String),
    sa.column("last_error", sa.Text),
    sa.column("cancel_reason", sa.Text),
)


def upgrade() -> None:
    cancelled = _runs.c.state == "cancelled"
    op.execute(_runs.update().where(cancelled).values(cancel_reason=_runs.c.last_error, error_code="", last_error=""))


def downgrade() -> None:
    cancelled = _runs.c.state == "cancelled"
    op.execute(
        _runs.update()
        .where(cancelled)
        .values(error_code="cancelled", last_error=sa.func.coalesce(_runs.c.cancel_reason, ""))
    )
