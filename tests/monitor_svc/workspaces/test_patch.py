"""The unified-diff applier as a pure function: parsing, applying, and the failures it names."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from monitor_svc.workspaces.patch import (
    HunkFailed,
    PatchSyntaxError,
    apply_file_patch,
    parse_patch,
    split_lines,
)

ORIGINAL = "".join(f"line {n}\n" for n in range(1, 21))


def apply(patch: str, files: dict[str, str]) -> dict[str, str]:
    """Every file patch of `patch` applied in turn to `files` (a deletion removes the key)."""
    result = dict(files)
    for file_patch in parse_patch(patch):
        new = apply_file_patch(file_patch, result.get(file_patch.old_path or file_patch.path))
        if file_patch.old_path is not None:
            result.pop(file_patch.old_path, None)
        if new is not None:
            result[file_patch.path] = new
    return result


def test_split_lines_keeps_endings_and_carriage_returns() -> None:
    assert split_lines("a\r\nb\n\nc") == ["a\r\n", "b\n", "\n", "c"]
    assert split_lines("") == [] and split_lines("x\n") == ["x\n"]


def test_a_git_diff_round_trips(tmp_path: Path) -> None:
    """What `git diff` prints for edits, a new file and a deleted one applies back exactly."""
    before = {"a.py": ORIGINAL, "gone.txt": "bye\n", "crlf.txt": "one\r\ntwo\r\n"}
    after = {
        "a.py": ORIGINAL.replace("line 3\n", "line three\n").replace("line 17\n", "") + "line 21\n",
        "new dir/new.txt": "hello\nno newline",
        "crlf.txt": "one\r\nTWO\r\n",
    }
    repo = tmp_path / "repo"
    for name, text in before.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(text.encode())
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "-C", str(repo), *identity, "commit", "-qm", "before"], check=True)
    (repo / "gone.txt").unlink()
    for name, text in after.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(text.encode())
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    diff = subprocess.run(
        ["git", "-C", str(repo), "diff", "--cached", "--no-renames", "--no-color"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    assert apply(diff, before) == after


def test_plain_diff_u_without_prefixes_and_with_timestamps() -> None:
    patch = (
        "--- src/a.py\t2024-01-01 10:00:00.000000000 +0000\n"
        "+++ src/a.py\t2024-01-02 10:00:00.000000000 +0000\n"
        "@@ -2,3 +2,3 @@\n line 2\n-line 3\n+line 3 changed\n line 4\n"
    )
    [file_patch] = parse_patch(patch)
    assert (file_patch.old_path, file_patch.new_path) == ("src/a.py", "src/a.py")
    assert apply(patch, {"src/a.py": ORIGINAL})["src/a.py"] == ORIGINAL.replace("line 3\n", "line 3 changed\n")


def test_a_hunk_that_moved_applies_at_the_nearest_place() -> None:
    patch = "--- a/f\n+++ b/f\n@@ -3,3 +3,3 @@\n line 10\n-line 11\n+eleven\n line 12\n"
    assert apply(patch, {"f": ORIGINAL})["f"] == ORIGINAL.replace("line 11\n", "eleven\n")


def test_miscounted_hunk_headers_are_recounted() -> None:
    # The header says one line each; the body has three and four, as a model might write it.
    patch = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n line 1\n-line 2\n+two\n+2b\n line 3\n"
    assert apply(patch, {"f": ORIGINAL})["f"] == ORIGINAL.replace("line 2\n", "two\n2b\n")


def test_a_hunk_that_does_not_apply_is_named_with_what_differs() -> None:
    patch = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-line 1\n+one\n@@ -5,2 +5,2 @@\n line 5\n-line six\n+six\n"
    with pytest.raises(HunkFailed) as raised:
        apply(patch, {"f": ORIGINAL})
    failure = raised.value
    assert (failure.path, failure.hunk, failure.header) == ("f", 2, "@@ -5,2 +5,2 @@")
    assert "line 6 is 'line 6\\n', the hunk expects 'line six\\n'" in str(failure)
    assert str(failure).startswith("hunk 2 (@@ -5,2 +5,2 @@) does not apply to f")


def test_hunks_apply_in_order_and_never_overlap() -> None:
    # The second hunk's lines exist only before the first hunk's: it does not go back.
    patch = "--- a/f\n+++ b/f\n@@ -10 +10 @@\n-line 10\n+ten\n@@ -2 +2 @@\n-line 2\n+two\n"
    with pytest.raises(HunkFailed) as raised:
        apply(patch, {"f": ORIGINAL})
    assert raised.value.hunk == 2


def test_creation_and_deletion_check_the_file() -> None:
    create = "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+x\n"
    with pytest.raises(HunkFailed, match="creates the file, but it exists"):
        apply(create, {"new.txt": "already\n"})
    delete = "--- a/f\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-line 1\n-line 2\n"
    with pytest.raises(HunkFailed, match="deletes the file, but 18 of its lines are not in it"):
        apply(delete, {"f": ORIGINAL})
    assert apply(delete, {"f": "line 1\nline 2\n"}) == {}
    with pytest.raises(HunkFailed, match="does not exist"):
        apply("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n", {})


def test_no_newline_at_end_of_file_markers() -> None:
    patch = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-old\n\\ No newline at end of file\n+new\n"
    assert apply(patch, {"f": "old"}) == {"f": "new\n"}
    with pytest.raises(HunkFailed):
        apply(patch, {"f": "old\n"})  # the file has the newline the patch says it lacks


def test_git_renames_empty_files_and_quoted_paths() -> None:
    patch = (
        "diff --git a/old.py b/new.py\nsimilarity index 90%\nrename from old.py\nrename to new.py\n"
        "--- a/old.py\n+++ b/new.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
        "diff --git a/empty b/empty\nnew file mode 100644\nindex 0000000..e69de29\n"
        'diff --git "a/caf\\303\\251 \\"q\\".txt" "b/caf\\303\\251 \\"q\\".txt"\n'
        'deleted file mode 100644\n--- "a/caf\\303\\251 \\"q\\".txt"\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n'
    )
    patches = parse_patch(patch)
    assert [(p.old_path, p.new_path) for p in patches] == [
        ("old.py", "new.py"),
        (None, "empty"),
        ('café "q".txt', None),
    ]
    assert apply(patch, {"old.py": "x = 1\n", 'café "q".txt': "bye\n"}) == {"new.py": "x = 2\n", "empty": ""}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello\n", "no file changes found"),
        ("@@ -1 +1 @@\n-a\n+b\n", "a hunk before any"),
        ("--- a/f\n+++ b/f\n@@ -x +1 @@\n-a\n", "malformed hunk header"),
        ("--- a/f\n+++ b/f\n@@ -1 +1 @@\n", "has no lines"),
        ("diff --git a/f b/f\nGIT binary patch\nliteral 3\n", "binary patches are not supported"),
        ("diff --git a/f b/g\ncopy from f\ncopy to g\n", "copies are not supported"),
        ("--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+a\n", "both sides"),
    ],
)
def test_malformed_patches_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(PatchSyntaxError, match=message):
        parse_patch(text)
