"""The workspace's write side over real gRPC (monitor_svc/workspaces/writes.py): opening, writing and
patching files, what may not be written, and git's branch, commit, diff and reset.
"""

from __future__ import annotations

import re
from typing import Any

import grpc

from monitor_svc.workspaces import writes
from quarry.v1 import monitor_pb2
from tests.monitor_svc.workspaces.helpers import (
    README,
    TRAIN,
    Env,
    failed,
    git,
    patch_request,
    read_request,
    real,
    write_request,
)
from tests.rpc import error_reason, expect_error, violations

# -- opening ------------------------------------------------------------------------------------------


async def test_opening_a_workspace_is_idempotent_and_describes_its_git_state(env: Env) -> None:
    workspace = await env.open()
    assert re.fullmatch(r"ws-[0-9a-f]{16}", workspace.workspace_id)
    assert workspace.root == real(env.project)
    assert workspace.host == (env.host or "local")
    assert list(workspace.protected_paths) == ["data/*.csv", "eval"]
    assert workspace.git.is_repo and workspace.git.branch == "main" and not workspace.git.dirty
    assert workspace.git.head_commit == git(env.project, "rev-parse", "HEAD")
    (env.roots / "alias").symlink_to(env.project)
    for root in (f"{env.project}/", env.roots / "alias", f"{env.roots}/alias/../project"):
        assert (await env.open(root)).workspace_id == workspace.workspace_id, root
    got = await env.stub.GetWorkspace(monitor_pb2.GetWorkspaceRequest(workspace_id=workspace.workspace_id))
    assert got.workspace == workspace
    details = await failed(env.open(protected=["eval"]), "WORKSPACE_EXISTS", grpc.StatusCode.ALREADY_EXISTS)
    assert "protected paths" in details


async def test_a_root_outside_the_allowed_roots_is_refused(env: Env) -> None:
    elsewhere = env.tmp_path / "elsewhere"
    elsewhere.mkdir()
    (env.roots / "way-out").symlink_to(elsewhere)
    for root in ("/", elsewhere, env.roots / "way-out", f"{env.roots}/../elsewhere", env.tmp_path):
        details = await failed(env.open(root), "WORKSPACE_ROOT_NOT_ALLOWED")
        assert str(env.roots) in details, details  # says which roots are allowed
    for root in (env.roots / "missing", env.project / "train.py"):
        await failed(env.open(root), "WORKSPACE_ROOT_INVALID")
    error = await expect_error(env.open("relative/dir"), grpc.StatusCode.INVALID_ARGUMENT)
    assert "root" in violations(error)
    error = await expect_error(env.open(protected=["../up"]), grpc.StatusCode.INVALID_ARGUMENT)
    assert "protected_paths[0]" in violations(error)


async def test_without_configured_roots_no_workspace_opens(env: Env) -> None:
    settings = env.settings.model_copy(update={"workspace_roots": []})
    settings.hosts = {name: host.model_copy(update={"workspace_roots": []}) for name, host in settings.hosts.items()}
    await env.start(settings)
    details = await failed(env.open(), "WORKSPACE_ROOT_NOT_ALLOWED")
    assert "none are configured" in details


# -- writing ------------------------------------------------------------------------------------------


async def test_writing_files_atomically(env: Env, ws: str) -> None:
    written = await env.stub.WriteWorkspaceFile(write_request(ws, "src/models/mlp.py", "WIDTH = 64\n"))
    assert written.created and written.size_bytes == len("WIDTH = 64\n")
    assert (env.project / "src/models/mlp.py").read_text() == "WIDTH = 64\n"
    script = "#!/bin/sh\npython train.py --lr 0.2\n"
    again = await env.stub.WriteWorkspaceFile(write_request(ws, "run.sh", script))
    assert not again.created and (env.project / "run.sh").read_text() == script
    assert (env.project / "run.sh").stat().st_mode & 0o777 == 0o755, "an executable stays executable"
    leftovers = [p.name for p in env.project.rglob("*") if ".quarry-" in p.name]
    assert leftovers == [], "no temporary file is left behind"
    huge = "x" * (writes.MAX_FILE_BYTES + 1)
    big = env.stub.WriteWorkspaceFile(write_request(ws, "big.txt", huge))
    error = await expect_error(big, grpc.StatusCode.INVALID_ARGUMENT)
    assert "content" in violations(error)
    await failed(env.stub.WriteWorkspaceFile(write_request(ws, "data", "x")), "WORKSPACE_WRONG_KIND")
    await failed(env.stub.WriteWorkspaceFile(write_request(ws, "train.py/inner", "x")), "WORKSPACE_WRONG_KIND")


# Its blank context lines are empty, as an editor that trims trailing spaces leaves them.
MULTI_FILE_PATCH = """\
diff --git a/train.py b/train.py
--- a/train.py
+++ b/train.py
@@ -1,4 +1,4 @@
 import sys

-LR = 0.1
+LR = 0.05

diff --git a/notes/plan.md b/notes/plan.md
new file mode 100644
--- /dev/null
+++ b/notes/plan.md
@@ -0,0 +1,2 @@
+# Plan
+Halve the learning rate.
diff --git a/README.md b/README.md
deleted file mode 100644
--- a/README.md
+++ /dev/null
@@ -1,2 +0,0 @@
-# project
-Learning rate notes
"""


async def test_a_patch_applies_to_several_files_at_once(env: Env, ws: str) -> None:
    patched = await env.stub.PatchWorkspace(patch_request(ws, MULTI_FILE_PATCH))
    assert list(patched.modified_paths) == ["train.py"]
    assert list(patched.created_paths) == ["notes/plan.md"]
    assert list(patched.deleted_paths) == ["README.md"]
    assert (env.project / "train.py").read_text() == TRAIN.replace("LR = 0.1", "LR = 0.05")
    assert (env.project / "notes/plan.md").read_text() == "# Plan\nHalve the learning rate.\n"
    assert not (env.project / "README.md").exists()


async def test_a_patch_whose_hunk_does_not_apply_changes_nothing(env: Env, ws: str) -> None:
    bad = MULTI_FILE_PATCH.replace("-Learning rate notes", "-Momentum notes")
    details = await failed(env.stub.PatchWorkspace(patch_request(ws, bad)), "WORKSPACE_PATCH_FAILED")
    assert "hunk 1 (@@ -1,2 +0,0 @@)" in details and "README.md" in details, details
    assert "'Momentum notes\\n'" in details, "says what the hunk expected"
    assert (env.project / "train.py").read_text() == TRAIN, "the first file's change was not written"
    assert not (env.project / "notes").exists() and (env.project / "README.md").read_text() == README
    second_hunk = "--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-import sys\n+import os\n@@ -9 +9 @@\n-nothing\n+x\n"
    details = await failed(env.stub.PatchWorkspace(patch_request(ws, second_hunk)), "WORKSPACE_PATCH_FAILED")
    assert "hunk 2 (@@ -9 +9 @@) does not apply to train.py" in details
    assert (env.project / "train.py").read_text() == TRAIN
    error = await expect_error(
        env.stub.PatchWorkspace(patch_request(ws, "just some text\n")), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "patch" in violations(error)


async def test_a_retried_change_with_its_request_id_is_applied_once(env: Env, ws: str) -> None:
    patch = "--- a/train.py\n+++ b/train.py\n@@ -3 +3 @@\n-LR = 0.1\n+LR = 0.3\n"
    first = await env.stub.PatchWorkspace(patch_request(ws, patch, request_id="p-1"))
    again = await env.stub.PatchWorkspace(patch_request(ws, patch, request_id="p-1"))
    assert first == again and list(first.modified_paths) == ["train.py"]
    assert (env.project / "train.py").read_text() == TRAIN.replace("LR = 0.1", "LR = 0.3")
    other = patch_request(ws, patch.replace("0.3", "0.4"), request_id="p-1")
    await failed(env.stub.PatchWorkspace(other), "REQUEST_ID_REUSED", grpc.StatusCode.ALREADY_EXISTS)


# -- what may not be written -------------------------------------------------------------------------


async def test_protected_paths_are_read_only(env: Env, ws: str) -> None:
    for path, rule in (
        ("eval/harness.py", "'eval'"),
        ("eval/new_metric.py", "'eval'"),
        ("data/extra.csv", "'data/*.csv'"),
        (".git/config", ".git"),
        (".git/hooks/post-commit", ".git"),
    ):
        details = await failed(env.stub.WriteWorkspaceFile(write_request(ws, path, "x\n")), "WORKSPACE_PATH_PROTECTED")
        assert rule in details and path in details, details
    (env.project / "harness_link.py").symlink_to("eval/harness.py")  # inside the root, onto a protected file
    details = await failed(
        env.stub.WriteWorkspaceFile(write_request(ws, "harness_link.py", "SCORE = 99\n")), "WORKSPACE_PATH_PROTECTED"
    )
    assert "'eval'" in details
    patch = "--- a/eval/harness.py\n+++ b/eval/harness.py\n@@ -1 +1 @@\n-SCORE = 1\n+SCORE = 100\n"
    await failed(env.stub.PatchWorkspace(patch_request(ws, patch)), "WORKSPACE_PATH_PROTECTED")
    assert (env.project / "eval/harness.py").read_text() == "SCORE = 1\n"
    assert not (env.project / "eval/new_metric.py").exists() and not (env.project / "data/extra.csv").exists()
    readable = await env.stub.ReadWorkspaceFile(read_request(ws, "eval/harness.py"))
    assert readable.content == "SCORE = 1\n", "protected means read-only, not hidden"


async def test_paths_that_escape_the_root_are_refused(env: Env, ws: str) -> None:
    for path in ("../outside.txt", "/etc/passwd", "src/../../outside.txt"):
        for call in (
            env.stub.ReadWorkspaceFile(read_request(ws, path)),
            env.stub.WriteWorkspaceFile(write_request(ws, path, "x")),
        ):
            error = await expect_error(call, grpc.StatusCode.INVALID_ARGUMENT)
            assert error_reason(error) == "WORKSPACE_PATH_ESCAPES" and "path" in violations(error)
    error = await expect_error(env.stub.ReadWorkspaceFile(read_request(ws, "a\x00b")), grpc.StatusCode.INVALID_ARGUMENT)
    assert "path" in violations(error)
    assert not (env.roots / "outside.txt").exists()


async def test_symbolic_links_out_of_the_root_are_refused(env: Env, ws: str) -> None:
    elsewhere = env.tmp_path / "elsewhere"
    elsewhere.mkdir()
    secret = elsewhere / "secret.txt"
    secret.write_text("the private key\n")
    (env.project / "leak.txt").symlink_to(secret)
    (env.project / "outdir").symlink_to(elsewhere)
    (env.project / "alias.py").symlink_to("train.py")  # stays inside: fine
    calls = [
        env.stub.ReadWorkspaceFile(read_request(ws, "leak.txt")),
        env.stub.ReadWorkspaceFile(read_request(ws, "outdir/secret.txt")),
        env.stub.WriteWorkspaceFile(write_request(ws, "leak.txt", "overwritten\n")),
        env.stub.WriteWorkspaceFile(write_request(ws, "outdir/planted.txt", "x\n")),
        env.stub.ListWorkspaceTree(monitor_pb2.ListWorkspaceTreeRequest(workspace_id=ws, path="outdir")),
        env.stub.SearchWorkspace(monitor_pb2.SearchWorkspaceRequest(workspace_id=ws, pattern="key", path="outdir")),
        env.stub.PatchWorkspace(patch_request(ws, "--- /dev/null\n+++ b/outdir/planted.py\n@@ -0,0 +1 @@\n+x\n")),
    ]
    for call in calls:
        details = await failed(call, "WORKSPACE_PATH_ESCAPES")
        assert "the private key" not in details
    assert secret.read_text() == "the private key\n" and sorted(p.name for p in elsewhere.iterdir()) == ["secret.txt"]
    tree = await env.stub.ListWorkspaceTree(monitor_pb2.ListWorkspaceTreeRequest(workspace_id=ws))
    kinds = {entry.path: entry.kind for entry in tree.entries}
    assert kinds["outdir"] == kinds["leak.txt"] == monitor_pb2.WORKSPACE_ENTRY_KIND_SYMLINK
    searched = await env.stub.SearchWorkspace(monitor_pb2.SearchWorkspaceRequest(workspace_id=ws, pattern="private"))
    assert list(searched.matches) == [], "a search does not follow links out"
    assert (await env.stub.ReadWorkspaceFile(read_request(ws, "alias.py"))).content == TRAIN


# -- git ---------------------------------------------------------------------------------------------


async def test_git_branch_commit_diff_and_reset(env: Env, ws: str) -> None:
    initial = git(env.project, "rev-parse", "HEAD")
    branched = await env.stub.CreateWorkspaceBranch(
        monitor_pb2.CreateWorkspaceBranchRequest(workspace_id=ws, branch="exp/lr-0.2")
    )
    assert branched.workspace.git.branch == "exp/lr-0.2" and branched.workspace.git.head_commit == initial
    assert git(env.project, "branch", "--show-current") == "exp/lr-0.2"
    await env.stub.WriteWorkspaceFile(write_request(ws, "train.py", TRAIN.replace("0.1", "0.2")))
    await env.stub.WriteWorkspaceFile(write_request(ws, "sweep.py", "LRS = [0.1, 0.2]\n"))
    diff = await env.stub.DiffWorkspace(monitor_pb2.DiffWorkspaceRequest(workspace_id=ws))
    assert "-LR = 0.1\n+LR = 0.2\n" in diff.diff and diff.base_commit == initial and diff.target_commit == ""
    assert list(diff.untracked_paths) == ["sweep.py"] and not diff.truncated
    hook = env.project / ".git/hooks/pre-commit"  # would refuse the commit, and leave a mark, if it ran
    hook.write_text(f"#!/bin/sh\ntouch {env.tmp_path / 'hook-ran'}\nexit 1\n")
    hook.chmod(0o755)
    commit = await env.stub.CommitWorkspace(monitor_pb2.CommitWorkspaceRequest(workspace_id=ws, message="Try lr 0.2"))
    assert not (env.tmp_path / "hook-ran").exists(), "git hooks never run"
    assert commit.committed and commit.commit == git(env.project, "rev-parse", "HEAD") != initial
    assert git(env.project, "log", "-1", "--format=%s %an") == "Try lr 0.2 Quarry"
    assert list(commit.changed_paths) == ["sweep.py", "train.py"] and not commit.changed_paths_truncated
    nothing = await env.stub.CommitWorkspace(monitor_pb2.CommitWorkspaceRequest(workspace_id=ws, message="again"))
    assert not nothing.committed and nothing.commit == commit.commit and list(nothing.changed_paths) == []
    # A change made outside the workspace API (a command, a job) is committed, and named, all the same.
    (env.project / "sweep.py").unlink()
    by_hand = await env.stub.CommitWorkspace(monitor_pb2.CommitWorkspaceRequest(workspace_id=ws, message="rm"))
    assert by_hand.committed and list(by_hand.changed_paths) == ["sweep.py"]
    commit = by_hand
    between = await env.stub.DiffWorkspace(
        monitor_pb2.DiffWorkspaceRequest(workspace_id=ws, base=initial, target="exp/lr-0.2")
    )
    assert "+LR = 0.2" in between.diff and between.target_commit == commit.commit
    capped = await env.stub.DiffWorkspace(monitor_pb2.DiffWorkspaceRequest(workspace_id=ws, base=initial, max_bytes=40))
    assert capped.truncated and len(capped.diff.encode()) <= 40
    state = await env.stub.GetWorkspace(monitor_pb2.GetWorkspaceRequest(workspace_id=ws))
    assert state.workspace.git.head_commit == commit.commit and not state.workspace.git.dirty
    (env.project / "scratch.txt").write_text("temporary\n")
    reset = await env.stub.ResetWorkspace(
        monitor_pb2.ResetWorkspaceRequest(workspace_id=ws, commit=initial, remove_untracked=True)
    )
    assert reset.workspace.git.head_commit == initial and not reset.workspace.git.dirty
    assert (env.project / "train.py").read_text() == TRAIN
    assert not (env.project / "sweep.py").exists() and not (env.project / "scratch.txt").exists()
    assert (env.project / ".venv/lib/site.py").exists(), "ignored files stay"


async def test_bad_git_requests_are_refused_clearly(env: Env, ws: str) -> None:
    def branch(name: str, start: str = "") -> Any:
        request = monitor_pb2.CreateWorkspaceBranchRequest(workspace_id=ws, branch=name, start_point=start)
        return env.stub.CreateWorkspaceBranch(request)

    for name in ("bad..name", "-x", "a b"):
        error = await expect_error(branch(name), grpc.StatusCode.INVALID_ARGUMENT)
        assert "branch" in violations(error), name
    await failed(branch("main"), "WORKSPACE_GIT_FAILED")  # exists
    details = await failed(branch("new", "no-such-commit"), "WORKSPACE_GIT_FAILED")
    assert "no-such-commit" in details
    reset = env.stub.ResetWorkspace(monitor_pb2.ResetWorkspaceRequest(workspace_id=ws, commit="--hard"))
    assert "commit" in violations(await expect_error(reset, grpc.StatusCode.INVALID_ARGUMENT))
    error = await expect_error(
        env.stub.CommitWorkspace(monitor_pb2.CommitWorkspaceRequest(workspace_id=ws, message=" ")),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "message" in violations(error)


async def test_git_refuses_to_change_protected_paths(env: Env, ws: str) -> None:
    initial = git(env.project, "rev-parse", "HEAD")
    (env.project / "eval/harness.py").write_text("SCORE = 2\n")  # a change made outside the monitor
    git(env.project, "commit", "-q", "-am", "new harness")
    changed = git(env.project, "rev-parse", "HEAD")
    reset = monitor_pb2.ResetWorkspaceRequest(workspace_id=ws, commit=initial)
    details = await failed(env.stub.ResetWorkspace(reset), "WORKSPACE_PATH_PROTECTED")
    assert "eval/harness.py" in details and "'eval'" in details
    branch = monitor_pb2.CreateWorkspaceBranchRequest(workspace_id=ws, branch="old", start_point=initial)
    await failed(env.stub.CreateWorkspaceBranch(branch), "WORKSPACE_PATH_PROTECTED")
    assert git(env.project, "rev-parse", "HEAD") == changed and git(env.project, "branch", "--list", "old") == ""
    assert (env.project / "eval/harness.py").read_text() == "SCORE = 2\n"
    # A reset that leaves protected content as it is goes ahead.
    (env.project / "train.py").write_text("broken\n")
    (env.project / "data/new.csv").write_text("a,b\n")  # untracked, protected
    clean = monitor_pb2.ResetWorkspaceRequest(workspace_id=ws, commit="HEAD", remove_untracked=True)
    await failed(env.stub.ResetWorkspace(clean), "WORKSPACE_PATH_PROTECTED")
    assert (env.project / "train.py").read_text() == "broken\n", "refused before anything changed"
    await env.stub.ResetWorkspace(monitor_pb2.ResetWorkspaceRequest(workspace_id=ws, commit="HEAD"))
    assert (env.project / "train.py").read_text() == TRAIN and (env.project / "data/new.csv").exists()


async def test_a_directory_that_is_not_a_repository_has_no_git(env: Env) -> None:
    plain = env.roots / "plain"
    plain.mkdir()
    for root in (plain, env.project / "eval"):  # inside another repository's tree is not a repository either
        workspace = await env.open(root, protected=[])
        assert not workspace.git.is_repo, root
        commit = monitor_pb2.CommitWorkspaceRequest(workspace_id=workspace.workspace_id, message="m")
        await failed(env.stub.CommitWorkspace(commit), "WORKSPACE_NOT_A_REPO")
    assert git(env.project, "status", "--porcelain") == ""
