"""The workspace's read side over real gRPC (monitor_svc/workspaces/reads.py): the tree, files by line range,
search; a workspace described again after a restart; and the Python client reaching every RPC.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from monitor_svc.workspaces import reads
from quarry.client import MonitorClient, insecure_channel
from quarry.v1 import monitor_pb2
from tests.monitor_svc.workspaces.helpers import (
    PROTECTED,
    TRAIN,
    Env,
    failed,
    git,
    read_request,
    real,
    write_request,
)
from tests.rpc import error_reason, expect_error, violations

# -- reading ------------------------------------------------------------------------------------------


async def test_the_tree_lists_files_with_sizes_and_skips_tool_directories(env: Env, ws: str) -> None:
    def listing(**fields: Any) -> Any:
        return env.stub.ListWorkspaceTree(monitor_pb2.ListWorkspaceTreeRequest(workspace_id=ws, **fields))

    tree = await listing()
    entries = {entry.path: entry for entry in tree.entries}
    assert [entry.path for entry in tree.entries] == sorted(entries) and not tree.truncated
    assert entries["train.py"].kind == monitor_pb2.WORKSPACE_ENTRY_KIND_FILE
    assert entries["train.py"].size_bytes == len(TRAIN)
    assert entries["eval/harness.py"].size_bytes == len("SCORE = 1\n")
    assert entries["eval"].kind == monitor_pb2.WORKSPACE_ENTRY_KIND_DIRECTORY and not entries["eval"].children_omitted
    for skipped in (".git", "__pycache__", ".venv"):
        assert entries[skipped].children_omitted, skipped
        assert not any(path.startswith(f"{skipped}/") for path in entries), skipped
    shallow = {entry.path: entry for entry in (await listing(max_depth=1)).entries}
    assert shallow["eval"].children_omitted and "eval/harness.py" not in shallow
    few = await listing(max_entries=2)
    assert few.truncated and len(few.entries) == 2
    assert [entry.path for entry in (await listing(path="eval")).entries] == ["eval/harness.py"]
    await failed(listing(path="train.py"), "WORKSPACE_WRONG_KIND")
    await expect_error(listing(path="nowhere"), grpc.StatusCode.NOT_FOUND)
    await expect_error(listing(max_depth=99), grpc.StatusCode.INVALID_ARGUMENT)


async def test_reading_a_file_whole_by_line_range_and_capped(env: Env, ws: str) -> None:
    whole = await env.stub.ReadWorkspaceFile(read_request(ws, "train.py"))
    lines = TRAIN.splitlines(keepends=True)
    assert whole.content == TRAIN and (whole.start_line, whole.end_line) == (1, len(lines))
    assert whole.size_bytes == len(TRAIN) and not whole.truncated and not whole.binary
    middle = await env.stub.ReadWorkspaceFile(read_request(ws, "train.py", start_line=3, end_line=4))
    assert middle.content == "LR = 0.1\n\n" and (middle.start_line, middle.end_line) == (3, 4)
    capped = await env.stub.ReadWorkspaceFile(read_request(ws, "train.py", max_bytes=15))
    assert capped.truncated and capped.content == "import sys\n\n" and capped.end_line == 2
    (env.project / "blob.bin").write_bytes(b"\x89PNG\x00\x01\x02")
    blob = await env.stub.ReadWorkspaceFile(read_request(ws, "blob.bin"))
    assert blob.binary and blob.content == "" and blob.size_bytes == 7
    await failed(env.stub.ReadWorkspaceFile(read_request(ws, "eval")), "WORKSPACE_WRONG_KIND")
    await expect_error(env.stub.ReadWorkspaceFile(read_request(ws, "nope.py")), grpc.StatusCode.NOT_FOUND)
    error = await expect_error(
        env.stub.ReadWorkspaceFile(read_request(ws, "train.py", start_line=5, end_line=2)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "end_line" in violations(error)


async def test_searching_code_reports_file_line_and_text(env: Env, ws: str) -> None:
    def search(pattern: str, **fields: Any) -> Any:
        return env.stub.SearchWorkspace(monitor_pb2.SearchWorkspaceRequest(workspace_id=ws, pattern=pattern, **fields))

    found = await search(r"LR\s*=")
    assert [(m.path, m.line_number, m.line) for m in found.matches] == [("train.py", 3, "LR = 0.1")]
    assert not found.truncated and found.files_scanned >= 5  # not .venv's or __pycache__'s "LR = "
    readme = await search("learning RATE", case_insensitive=True)
    assert [(m.path, m.line_number) for m in readme.matches] == [("README.md", 2)]
    assert [m.path for m in (await search("=", glob="*.py", path="eval")).matches] == ["eval/harness.py"]
    assert {m.path for m in (await search(".", glob="*.md")).matches} == {"README.md"}
    one = await search(".", max_matches=1)
    assert len(one.matches) == 1 and one.truncated
    error = await expect_error(search("(unclosed"), grpc.StatusCode.INVALID_ARGUMENT)
    assert "pattern" in violations(error)


async def test_a_pattern_that_backtracks_for_ever_is_stopped(
    env: Env, ws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "SEARCH_SECONDS", 1.0)
    (env.project / "slow.txt").write_text("a" * 64 + "!\n")
    request = monitor_pb2.SearchWorkspaceRequest(workspace_id=ws, pattern="(a+)+$", path="slow.txt")
    await failed(env.stub.SearchWorkspace(request), "WORKSPACE_SEARCH_TOO_SLOW")
    # ...and the monitor still answers.
    request = monitor_pb2.SearchWorkspaceRequest(workspace_id=ws, pattern="LR", path="train.py")
    assert len((await env.stub.SearchWorkspace(request)).matches) == 2


# -- durability --------------------------------------------------------------------------------------


async def test_a_workspace_survives_a_monitor_restart(env: Env, ws: str) -> None:
    await env.start()  # a second monitor on the same data directory
    got = await env.stub.GetWorkspace(monitor_pb2.GetWorkspaceRequest(workspace_id=ws))
    assert got.workspace.workspace_id == ws and got.workspace.root == real(env.project)
    assert list(got.workspace.protected_paths) == ["data/*.csv", "eval"]
    await failed(env.stub.WriteWorkspaceFile(write_request(ws, "eval/x.py", "x")), "WORKSPACE_PATH_PROTECTED")
    assert (await env.open()).workspace_id == ws
    missing = monitor_pb2.GetWorkspaceRequest(workspace_id="ws-0123456789abcdef")
    assert error_reason(await expect_error(env.stub.GetWorkspace(missing), grpc.StatusCode.NOT_FOUND)) == (
        "WORKSPACE_NOT_FOUND"
    )
    error = await expect_error(
        env.stub.GetWorkspace(monitor_pb2.GetWorkspaceRequest(workspace_id="../x")), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "workspace_id" in violations(error)
    # A root no longer configured: the workspace is kept, but not served.
    settings = env.settings.model_copy(update={"workspace_roots": [str(env.tmp_path / "other")]})
    settings.hosts = {
        name: host.model_copy(update={"workspace_roots": [str(env.tmp_path / "other")]})
        for name, host in settings.hosts.items()
    }
    await env.start(settings)
    await failed(env.stub.GetWorkspace(monitor_pb2.GetWorkspaceRequest(workspace_id=ws)), "WORKSPACE_ROOT_NOT_ALLOWED")


# -- the Python client --------------------------------------------------------------------------------


async def test_the_python_client_reaches_every_workspace_rpc(env: Env) -> None:
    async with insecure_channel(env.address) as channel:
        client = MonitorClient(channel)
        opened = await client.open_workspace(str(env.project), host=env.host, protected_paths=PROTECTED)
        ws = opened.workspace_id
        assert (await client.get_workspace(ws)) == opened
        tree = await client.list_workspace_tree(ws, max_depth=1)
        assert "train.py" in [entry.path for entry in tree.entries]
        assert (await client.read_workspace_file(ws, "train.py", start_line=3, end_line=3)).content == "LR = 0.1\n"
        assert [m.line_number for m in (await client.search_workspace(ws, "LR =", glob="*.py")).matches] == [3]
        branch = await client.create_workspace_branch(ws, "exp")
        assert branch.git.branch == "exp"
        assert (await client.write_workspace_file(ws, "new.py", "x = 1\n")).created
        patch = "--- a/train.py\n+++ b/train.py\n@@ -3 +3 @@\n-LR = 0.1\n+LR = 0.2\n"
        assert list((await client.patch_workspace(ws, patch, request_id="c-1")).modified_paths) == ["train.py"]
        assert list((await client.patch_workspace(ws, patch, request_id="c-1")).modified_paths) == ["train.py"]
        diff = await client.diff_workspace(ws)
        assert "+LR = 0.2" in diff.diff and list(diff.untracked_paths) == ["new.py"]
        commit = await client.commit_workspace(ws, "lr 0.2")
        assert commit.committed and commit.commit == git(env.project, "rev-parse", "HEAD")
        reset = await client.reset_workspace(ws, "main", remove_untracked=True)
        assert reset.git.head_commit == opened.git.head_commit and reset.git.branch == "exp"
        assert (env.project / "train.py").read_text() == TRAIN
