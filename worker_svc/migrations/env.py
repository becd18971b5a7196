from typing import cast

from alembic import context
from alembic.runtime.environment import EnvironmentContext

from quarry.migrations import run_migrations
from worker_svc.schema import metadata

run_migrations(cast(EnvironmentContext, context), metadata)
