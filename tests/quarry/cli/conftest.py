"""The command line is tested against the mesh the supervisor's tests build (re-exported as a fixture here)."""

from tests.supervisor_svc.conftest import mesh

__all__ = ["mesh"]
