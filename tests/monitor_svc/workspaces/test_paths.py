"""The workspace path rules as pure functions: request paths, protected rules, containment, realpath."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from monitor_svc.workspaces.paths import (
    MAX_PATH_CHARS,
    MAX_PROTECTED_PATHS,
    protected_rules,
    protecting_rule,
    realpath,
    relative_path,
    relative_to,
    within,
)
from quarry.errors import ErrorReason, InvalidArgument


@pytest.mark.parametrize(
    ("value", "expected"),
    [("a/b.py", "a/b.py"), ("a//b/./c/", "a/b/c"), ("./x", "x"), ("dir/", "dir"), ("..a/b..", "..a/b..")],
)
def test_request_paths_in_normal_form(value: str, expected: str) -> None:
    assert relative_path(value, "path") == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("/etc/passwd", ErrorReason.WORKSPACE_PATH_ESCAPES),
        ("../x", ErrorReason.WORKSPACE_PATH_ESCAPES),
        ("a/../../x", ErrorReason.WORKSPACE_PATH_ESCAPES),
        ("a/..", ErrorReason.WORKSPACE_PATH_ESCAPES),
        ("a\x00b", ErrorReason.INVALID_ARGUMENT),
        ("x" * (MAX_PATH_CHARS + 1), ErrorReason.INVALID_ARGUMENT),
        ("", ErrorReason.INVALID_ARGUMENT),
        ("./", ErrorReason.INVALID_ARGUMENT),
    ],
)
def test_request_paths_that_are_refused(value: str, reason: ErrorReason) -> None:
    with pytest.raises(InvalidArgument) as raised:
        relative_path(value, "path")
    assert raised.value.reason == reason and [v.field for v in raised.value.violations] == ["path"]


def test_the_root_itself_only_where_allowed() -> None:
    assert relative_path("", "path", allow_root=True) == "" and relative_path(".", "path", allow_root=True) == ""


def test_protected_rules_are_normalised_and_checked() -> None:
    assert protected_rules(["eval/", "./data/*.csv", "eval"]) == ("data/*.csv", "eval")
    for bad in (["../up"], ["/abs"], [""], ["."], ["x"] * (MAX_PROTECTED_PATHS + 1)):
        with pytest.raises(InvalidArgument):
            protected_rules(bad)


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("eval", "eval"),
        ("eval/harness.py", "eval"),
        ("eval/deep/x.py", "eval"),
        ("evaluation.py", None),
        ("data/train.csv", "data/*.csv"),
        ("data/sub/train.csv", "data/*.csv"),  # `*` matches across "/"
        ("data/readme.txt", None),
        ("ckpt-3/weights.bin", "ckpt-*"),  # a glob naming a directory protects what is under it
        ("src/model.py", None),
        (".git/config", ".git"),
        ("vendor/lib/.git/hooks/pre-commit", ".git"),
        (".GIT/config", ".git"),
        (".github/workflows/ci.yml", None),
    ],
)
def test_which_rule_protects_a_path(path: str, rule: str | None) -> None:
    assert protecting_rule(path, ("eval", "data/*.csv", "ckpt-*")) == rule


def test_containment_is_by_component() -> None:
    assert within("/w/root", "/w/root") and within("/w/root/a", "/w/root")
    assert not within("/w/rootless", "/w/root") and not within("/w", "/w/root")
    assert within("/anything", "/")
    assert relative_to("/w/root/a/b", "/w/root") == "a/b" and relative_to("/w/root", "/w/root") == ""


async def _lstat_mode(path: str) -> int | None:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return None


async def _readlink(path: str) -> str:
    return os.readlink(path)


def _pythons(path: str) -> str:
    return os.path.realpath(path)


async def test_realpath_over_lstat_and_readlink_agrees_with_pythons(tmp_path: Path) -> None:
    """What the SSH backend resolves with SFTP calls, the local backend with os.path.realpath: the same."""
    root = tmp_path / "root"
    (root / "dir/sub").mkdir(parents=True)
    (root / "dir/file.txt").write_text("x")
    (tmp_path / "outside").mkdir()
    links = {
        "abs": str(tmp_path / "outside"),
        "rel": "dir/sub",
        "up": "dir/sub/../../dir",
        "chain": "rel",
        "dangling": "missing/thing",
        "loop-a": "loop-b",
        "loop-b": "loop-a",
        "dir/sub/back": "../..",
        "self": ".",
    }
    for name, target in links.items():
        (root / name).symlink_to(target)
    paths = [
        "dir/file.txt",
        "abs/secret",
        "rel/x",
        "up/file.txt",
        "chain/../file.txt",
        "dangling",
        "dangling/more",
        "loop-a/x",
        "dir/sub/back/abs",
        "self/self/dir",
        "missing/a/../b",
        "",
    ]
    for path in paths:
        absolute = f"{root}/{path}" if path else str(root)
        assert await realpath(absolute, _lstat_mode, _readlink) == _pythons(absolute), path
