"""Git in a workspace runs nothing the workspace (or the user's configuration) names
(monitor_svc/workspaces/git.py): a job may write the repository's configuration, its hooks and its
attributes; every command they name only leaves a mark, which must never appear, on this machine and
over SSH, through every git operation of the monitor's RPCs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quarry.v1 import monitor_pb2
from tests.monitor_svc.workspaces.helpers import TRAIN, Env, failed, git, write_request

HOOKS = ("pre-commit", "post-commit", "commit-msg", "reference-transaction", "post-checkout", "pre-auto-gc")


def marker(env: Env, name: str) -> str:
    return f"touch {env.tmp_path / 'marks' / name}"


def executable(path: Path, body: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def marks(env: Env) -> list[str]:
    return sorted(path.name for path in (env.tmp_path / "marks").iterdir())


def plant_commands(env: Env) -> None:
    """Every command the repository's own configuration (and a file it includes) can make git run, but filters."""
    (env.tmp_path / "marks").mkdir()
    project = env.project
    (project / ".gitattributes").write_text("*.py diff=conv merge=drive\n*.md diff=ext\n*.sh diff=inc\n")
    git(project, "add", ".gitattributes")
    git(project, "commit", "-q", "-m", "attributes")
    for hook in HOOKS:
        executable(project / ".git/hooks" / hook, marker(env, f"hook-{hook}"))
        executable(env.tmp_path / "hooks" / hook, marker(env, f"hooks-path-{hook}"))
    settings = {
        "core.hooksPath": str(env.tmp_path / "hooks"),
        "core.fsmonitor": executable(env.tmp_path / "fsmonitor", marker(env, "fsmonitor")),
        "core.pager": marker(env, "pager"),
        "core.editor": marker(env, "editor"),
        "sequence.editor": marker(env, "sequence-editor"),
        "core.askPass": marker(env, "askpass"),
        "core.sshCommand": marker(env, "ssh-command"),
        "core.gitProxy": marker(env, "git-proxy"),
        "core.alternateRefsCommand": marker(env, "alternate-refs"),
        "credential.helper": marker(env, "credential"),
        "gpg.program": marker(env, "gpg"),
        "gpg.ssh.program": marker(env, "gpg-ssh"),
        "commit.gpgSign": "true",
        "log.showSignature": "true",
        "diff.external": marker(env, "diff-external"),
        "diff.conv.textconv": marker(env, "textconv"),
        "diff.ext.command": marker(env, "diff-command"),
        "merge.drive.driver": marker(env, "merge-driver"),
        "uploadpack.packObjectsHook": marker(env, "pack-objects-hook"),
        "gc.auto": "1",  # every commit would start a gc (and its pre-auto-gc hook)
        "include.path": str(env.tmp_path / "included.gitconfig"),
    }
    for key, value in settings.items():
        git(project, "config", key, value)
    (env.tmp_path / "included.gitconfig").write_text(
        f'[diff "inc"]\n\ttextconv = {marker(env, "included-textconv")}\n'
        f"[core]\n\tpager = {marker(env, 'included-pager')}\n"
    )


def plant_user_configuration(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filter in the configuration of the monitor's user (~/.gitconfig, ~/.config/git/config): never read."""
    home = env.tmp_path / "home"
    for config in (home / ".gitconfig", home / ".config/git/config"):
        config.parent.mkdir(parents=True, exist_ok=True)
        name = config.parent.name
        config.write_text(
            f'[filter "user"]\n\tclean = {marker(env, f"user-clean-{name}")}\n'
            f"\tsmudge = {marker(env, f'user-smudge-{name}')}\n"
        )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    (env.project / ".git/info").mkdir(exist_ok=True)
    (env.project / ".git/info/attributes").write_text("* filter=user\n")


async def every_git_operation(env: Env, ws: str) -> None:
    stub = env.stub
    initial = git(env.project, "rev-parse", "HEAD")
    await stub.GetWorkspace(monitor_pb2.GetWorkspaceRequest(workspace_id=ws))
    await stub.CreateWorkspaceBranch(monitor_pb2.CreateWorkspaceBranchRequest(workspace_id=ws, branch="exp/a"))
    await stub.WriteWorkspaceFile(write_request(ws, "train.py", TRAIN.replace("0.1", "0.2")))
    await stub.WriteWorkspaceFile(write_request(ws, "README.md", "# changed\n"))
    await stub.WriteWorkspaceFile(write_request(ws, "run.sh", "#!/bin/sh\nexit 0\n"))
    await stub.WriteWorkspaceFile(write_request(ws, "new.py", "X = 1\n"))
    diff = await stub.DiffWorkspace(monitor_pb2.DiffWorkspaceRequest(workspace_id=ws))
    assert "+LR = 0.2" in diff.diff and "+# changed" in diff.diff, "the diff is git's own, not a textconv's"
    commit = await stub.CommitWorkspace(monitor_pb2.CommitWorkspaceRequest(workspace_id=ws, message="lr"))
    assert commit.committed
    await stub.DiffWorkspace(monitor_pb2.DiffWorkspaceRequest(workspace_id=ws, base=initial, target="exp/a"))
    await stub.CreateWorkspaceBranch(
        monitor_pb2.CreateWorkspaceBranchRequest(workspace_id=ws, branch="exp/b", start_point=initial)
    )
    await stub.WriteWorkspaceFile(write_request(ws, "scratch.py", "Y = 2\n"))
    reset = await stub.ResetWorkspace(
        monitor_pb2.ResetWorkspaceRequest(workspace_id=ws, commit=commit.commit, remove_untracked=True)
    )
    assert reset.workspace.git.head_commit == commit.commit and not reset.workspace.git.dirty


async def test_no_command_of_the_repositorys_or_the_users_git_configuration_runs(
    env: Env, ws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant_commands(env)
    plant_user_configuration(env, monkeypatch)
    await every_git_operation(env, ws)
    assert marks(env) == []
    unsigned = git(env.project, "-c", "log.showSignature=false", "log", "-1", "--format=%s %G?")
    assert unsigned == "lr N", "committed, unsigned"


async def test_a_filter_the_repository_configures_never_runs_and_git_writes_are_refused(env: Env, ws: str) -> None:
    (env.tmp_path / "marks").mkdir()
    project = env.project
    (env.tmp_path / "filters.gitconfig").write_text(f'[filter "included"]\n\tclean = {marker(env, "included-clean")}\n')
    for key, value in {
        "filter.evil.clean": marker(env, "clean"),
        "filter.evil.smudge": marker(env, "smudge"),
        "filter.evil.required": "true",
        "filter.proc.process": marker(env, "process"),
        f"includeIf.gitdir:{project}/.git.path": str(env.tmp_path / "filters.gitconfig"),
    }.items():
        git(project, "config", key, value)
    (project / ".git/info").mkdir(exist_ok=True)
    (project / ".git/info/attributes").write_text("*.py filter=evil\n*.md filter=proc\n*.sh filter=included\n")
    (project / "train.py").write_text(TRAIN.replace("0.1", "0.3"))  # re-read through the filter, if one ran
    (project / "README.md").write_text("# changed\n")
    (project / "run.sh").write_text("#!/bin/sh\n")
    state = await env.stub.GetWorkspace(monitor_pb2.GetWorkspaceRequest(workspace_id=ws))
    assert state.workspace.git.dirty
    diff = await env.stub.DiffWorkspace(monitor_pb2.DiffWorkspaceRequest(workspace_id=ws))
    assert "+LR = 0.3" in diff.diff
    for call in (
        env.stub.CommitWorkspace(monitor_pb2.CommitWorkspaceRequest(workspace_id=ws, message="m")),
        env.stub.ResetWorkspace(monitor_pb2.ResetWorkspaceRequest(workspace_id=ws, commit="HEAD")),
        env.stub.CreateWorkspaceBranch(monitor_pb2.CreateWorkspaceBranchRequest(workspace_id=ws, branch="b")),
    ):
        details = await failed(call, "WORKSPACE_GIT_FAILED")
        assert "filter." in details and "a command the monitor never runs" in details
    assert marks(env) == []
