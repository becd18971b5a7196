from alembic import context

from quarry.db import run_migrations
from scratchpad_svc.schema import metadata

run_migrations(context, metadata)
