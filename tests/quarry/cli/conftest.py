"""The command line is tested against the mesh the supervisor's tests build (re-exported as fixtures here)."""

from tests.supervisor_svc.conftest import mesh, supervisor_overrides

__all__ = ["mesh", "supervisor_overrides"]
