"""Deprecated: the research records moved to `quarry.records.research` (and their base to
`quarry.records.base`); this module re-exports them for one release."""

from quarry.records.base import SCHEMA_VERSION, RecordError, record_problems
from quarry.records.research import *  # noqa: F403
from quarry.records.research import __all__ as _research

__all__ = [*_research, "SCHEMA_VERSION", "RecordError", "record_problems"]
