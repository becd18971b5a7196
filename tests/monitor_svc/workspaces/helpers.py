"""What the workspace tests share: a git repository under a workspace root, and a monitor serving it on this
machine or over the loopback SSH server (SFTP and git).

The workspace is a temporary git repository under a configured workspace root, with `eval` and
`data/*.csv` protected. The SSH host is this machine too, so a test checks the files directly.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from quarry.config import MonitorSettings
from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.monitor_svc.fake_ssh import monitor_for
from tests.rpc import error_reason, expect_error

Stub = monitor_pb2_grpc.MonitorServiceStub
TRAIN = "import sys\n\nLR = 0.1\n\n\ndef main():\n    print('loss', LR)\n\n\nmain()\n"
README = "# project\nLearning rate notes\n"
PROTECTED = ["eval/", "data/*.csv"]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def real(path: Path) -> str:
    return os.path.realpath(path)


def make_repo(project: Path) -> None:
    for path, text in {
        "train.py": TRAIN,
        "README.md": README,
        "eval/harness.py": "SCORE = 1\n",
        "data/train.csv": "x,y\n1,2\n",
        "run.sh": "#!/bin/sh\npython train.py\n",
        ".gitignore": "__pycache__/\n.venv/\n",
        "__pycache__/train.cpython-311.pyc": "LR = 7\n",
        ".venv/lib/site.py": "LR = 9\n",
    }.items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(text)
    (project / "run.sh").chmod(0o755)
    git(project, "init", "-q", "-b", "main")
    git(project, "config", "user.name", "Test")
    git(project, "config", "user.email", "test@example.com")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "initial")


@dataclass
class Env:
    """One monitor serving the workspace root `roots`, on this machine ("local") or over SSH ("gpu1")."""

    host: str
    roots: Path
    project: Path
    tmp_path: Path
    settings: MonitorSettings
    stack: contextlib.AsyncExitStack
    stub: Stub = field(init=False)
    address: str = field(init=False)

    async def start(self, settings: MonitorSettings | None = None) -> Stub:
        """A monitor on the same data directory (a restart), replacing `stub`."""
        host, channel, stub = await monitor_for(settings or self.settings, self.tmp_path / "data")
        self.stack.push_async_callback(host.shutdown)
        self.stack.push_async_callback(channel.close, None)
        self.stub, self.address = stub, host.address
        return stub

    async def open(self, root: Path | str | None = None, protected: list[str] | None = None) -> monitor_pb2.Workspace:
        request = monitor_pb2.OpenWorkspaceRequest(
            host=self.host,
            root=str(root or self.project),
            protected_paths=PROTECTED if protected is None else protected,
        )
        return (await self.stub.OpenWorkspace(request)).workspace


def read_request(workspace_id: str, path: str, **fields: Any) -> monitor_pb2.ReadWorkspaceFileRequest:
    return monitor_pb2.ReadWorkspaceFileRequest(workspace_id=workspace_id, path=path, **fields)


def write_request(workspace_id: str, path: str, content: str, **fields: Any) -> monitor_pb2.WriteWorkspaceFileRequest:
    return monitor_pb2.WriteWorkspaceFileRequest(workspace_id=workspace_id, path=path, content=content, **fields)


def patch_request(workspace_id: str, patch: str, **fields: Any) -> monitor_pb2.PatchWorkspaceRequest:
    return monitor_pb2.PatchWorkspaceRequest(workspace_id=workspace_id, patch=patch, **fields)


async def failed(call: Any, reason: str, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> str:
    """The details of the error `call` ends with, after checking its code and reason."""
    error = await expect_error(call, code)
    assert error_reason(error) == reason, error.details()
    return error.details() or ""
