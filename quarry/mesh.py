"""Deprecated: mesh authentication moved to `quarry.mesh_auth`; this module re-exports it for one release."""

from quarry.mesh_auth import *  # noqa: F403
from quarry.mesh_auth import __all__ as __all__
