"""The sandbox a local job runs in: bubblewrap (bwrap), or none where the operator allows that.

A sandboxed job sees the filesystem read-only but for its working tree (a workspace's root, else its
working directory) and a private /tmp; the workspace's .git stays read-only, and the monitor's data
directory, the job logs, key files, ~/.ssh and /run/secrets are hidden (an empty directory, or
/dev/null, in their place), and a workspace's protected paths are bound read-only over themselves.
It has its own PID namespace (no service process, nor its environment, is visible) and, as root, runs
as nobody (65534) in a user namespace of its own. Its environment is an allowlist plus what the job
declares, sandboxed or not.

bwrap is the process the monitor starts, records (pid, start time) and signals: the job's process
group holds it and the namespace's init, so killing the group kills that init, and the kernel then
kills every process left in the namespace, a daemon that called setsid among them. It is not tied to
the monitor (no --die-with-parent): a job outlives a monitor restart.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import PurePosixPath

from monitor_svc.jobs.submission import gpu_environment
from quarry.errors import ErrorReason, FailedPrecondition

NOBODY = 65534
JOB_HOME = "/tmp"  # in the sandbox, a private tmpfs: what a job caches there goes with it
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# From the monitor's environment, the only variables a job gets (then what it declares, its GPUs).
ALLOWED_VARIABLES = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")
SECRET_DIRECTORIES = ("/run/secrets", "/var/run/secrets")
GPU_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
UNAVAILABLE_HELP = (
    "install the Debian package bubblewrap (apt-get install bubblewrap), or set "
    "QUARRY_MONITOR_UNSANDBOXED_JOBS=true to run local jobs unconfined as the monitor's user"
)
_PROBE_SECONDS = 10.0
# How many entries of a workspace a glob rule's matches are looked for in (a dataset may hold millions).
MAX_PROTECTED_SCAN = 20_000
_GLOB_CHARACTERS = frozenset("*?[")


def protected_in(root: str, rules: Sequence[str], *, max_scan: int = MAX_PROTECTED_SCAN) -> list[str]:
    """The paths under `root` that the workspace's protected-path rules name (workspaces/paths.py), outermost
    only, for the sandbox to bind read-only. Symbolic links are left out: binding one would bind its target.

    A rule without glob characters is one path; a glob is matched against the tree, walked to at most
    `max_scan` entries (what lies further is still refused to the monitor's own writes, only not bound).
    """
    found: list[str] = []

    def add(relative: str) -> None:
        path = os.path.join(root, relative)
        if os.path.lexists(path) and not os.path.islink(path):
            found.append(path)

    globs = [rule for rule in rules if _GLOB_CHARACTERS & set(rule)]
    for rule in rules:
        if rule not in globs:
            add(rule)
    if not globs:
        return found
    scanned = 0
    for directory, subdirectories, files in os.walk(root):
        relative_dir = os.path.relpath(directory, root)
        kept = []
        for name in sorted(subdirectories) + sorted(files):
            scanned += 1
            relative = name if relative_dir == "." else f"{relative_dir}/{name}"
            if any(fnmatchcase(relative, rule) for rule in globs):
                add(relative)  # a directory's matches cover what it holds: not entered
            elif name in subdirectories and name != ".git":
                kept.append(name)
        subdirectories[:] = kept
        if scanned >= max_scan:
            break
    return found


def job_environment(
    inherited: Mapping[str, str], declared: Mapping[str, str], gpus: Sequence[int], *, home: str
) -> dict[str, str]:
    """A job's whole environment: the allowlisted part of the monitor's, HOME, the job's own, its GPUs."""
    allowed = {name: inherited[name] for name in ALLOWED_VARIABLES if name in inherited}
    return {"PATH": DEFAULT_PATH, **allowed, "HOME": home, **declared, **gpu_environment(gpus)}


def _inside(path: str, parent: str) -> bool:
    return PurePosixPath(path).is_relative_to(parent)


def hiding_path(writable: str, hidden: Sequence[str]) -> str | None:
    """The hidden path the working tree is, or lies in; None when it is neither."""
    return next((path for path in hidden if _inside(writable, path)), None)


def findable(program: str, working_directory: str, path: str) -> bool:
    """Whether exec would find the program: a path (relative to the working directory), or a name on PATH."""
    if "/" in program:
        return os.access(os.path.join(working_directory or os.getcwd(), program), os.X_OK)
    return shutil.which(program, path=path) is not None


def bwrap_argv(
    bwrap: str,
    argv: Sequence[str],
    *,
    writable: str,
    working_directory: str,
    hidden: Sequence[str],
    environment: Mapping[str, str],
    gpus: Sequence[int],
    isolate_network: bool,
    as_root: bool,
    read_only: Sequence[str] = (),
    exists: Callable[[str], bool] = os.path.exists,
    is_dir: Callable[[str], bool] = os.path.isdir,
) -> tuple[str, ...]:
    """The bwrap command line that runs `argv`; paths absolute and resolved, `writable` "" for none."""
    args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if as_root:  # an unprivileged uid inside, and no capabilities; files it writes are still root's outside
        args += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    if isolate_network:
        args.append("--unshare-net")
    args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for index in gpus:
        device = f"/dev/nvidia{index}"
        if exists(device):
            args += ["--dev-bind", device, device]
    if gpus:
        for device in GPU_CONTROL_DEVICES:
            if exists(device):
                args += ["--dev-bind", device, device]
    # Mounts in order of depth, so the deeper wins: a working tree inside a hidden directory is the one
    # part of it the job sees, a hidden path inside the working tree stays hidden.
    mounts: list[tuple[str, list[str]]] = []
    emptied: list[str] = []
    for path in dict.fromkeys(hidden):
        if is_dir(path):
            mounts.append((path, ["--tmpfs", path]))
            emptied += ["--remount-ro", path]  # once the deeper mounts have their mount points in it
        elif exists(path):
            mounts.append((path, ["--ro-bind", "/dev/null", path]))
    if writable:
        mounts.append((writable, ["--bind", writable, writable]))
        git = f"{writable.rstrip('/')}/.git"
        if exists(git):
            mounts.append((git, ["--ro-bind", git, git]))
        # The workspace's protected paths: read-only, and as mount points they cannot be renamed or removed.
        mounts += [(path, ["--ro-bind", path, path]) for path in read_only]
    for _, mount in sorted(mounts, key=lambda item: len(PurePosixPath(item[0]).parts)):
        args += mount
    args += emptied
    args.append("--clearenv")
    for name, value in environment.items():
        args += ["--setenv", name, value]
    if working_directory:
        args += ["--chdir", working_directory]
    return (*args, "--", *argv)


@dataclass(frozen=True)
class Launch:
    """What the monitor executes for a job, and with which environment."""

    argv: tuple[str, ...]
    environment: dict[str, str]
    sandboxed: bool


class Sandbox:
    """The monitor's choice for local jobs: bwrap when it works here, else unconfined where allowed, else none."""

    def __init__(self, mode: str, allow_unsandboxed: bool, hidden: Sequence[str]) -> None:
        self._mode = mode
        self._allow_unsandboxed = allow_unsandboxed
        self._hidden = tuple(dict.fromkeys(os.path.realpath(os.path.expanduser(path)) for path in hidden))
        self._bwrap: str | None = None
        self._version = ""
        self._problem = "QUARRY_MONITOR_JOB_SANDBOX is none" if mode == "none" else "not probed yet"

    @property
    def hidden(self) -> tuple[str, ...]:
        return self._hidden

    def probe(self) -> None:
        """Once, as the monitor starts: whether bwrap is on PATH and really starts a sandbox here."""
        if self._mode != "bwrap":
            return
        found = shutil.which("bwrap")
        if found is None:
            self._problem = "bwrap is not on PATH"
            return
        try:
            version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=_PROBE_SECONDS)
            trial = subprocess.run(
                self._argv(found, ["true"], writable="", working_directory="", environment={}, gpus=(), isolate=True),
                capture_output=True,
                text=True,
                timeout=_PROBE_SECONDS,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            self._problem = f"bwrap did not run: {error}"
            return
        if trial.returncode != 0:
            said = (trial.stderr.strip().splitlines() or [f"exit status {trial.returncode}"])[-1]
            self._problem = f"bwrap cannot start a sandbox here: {said}"
            return
        self._bwrap, self._version = found, version.stdout.strip() or "bubblewrap"

    def describe(self) -> str:
        """What is in force, for diagnostics."""
        if self._bwrap is not None:
            return self._version
        if self._allow_unsandboxed:
            return f"none (QUARRY_MONITOR_UNSANDBOXED_JOBS; {self._problem})"
        return f"none: local jobs are refused ({self._problem})"

    def check(
        self,
        argv: Sequence[str],
        *,
        working_directory: str,
        environment: Mapping[str, str],
        writable: str,
        in_workspace: bool,
        isolate_network: bool,
    ) -> None:
        """Refuses a local job when there is no sandbox and the operator has not allowed running without one
        (or it asks for a network of its own), or when its working tree is a path the sandbox hides. A
        workspace may lie inside a hidden directory (workspace roots are the operator's choice), not be one.
        A program that is not there is refused here, as an exec that fails is without the sandbox (in it, bwrap
        would start and fail)."""
        if self._bwrap is None:
            if not self._allow_unsandboxed or isolate_network:
                raise FailedPrecondition(
                    f"local jobs run in a sandbox, and this monitor has none ({self._problem}): {UNAVAILABLE_HELP}",
                    reason=ErrorReason.SANDBOX_UNAVAILABLE,
                )
            return
        path = environment.get("PATH") or os.environ.get("PATH", DEFAULT_PATH)
        if not findable(argv[0], working_directory, path):
            raise FailedPrecondition(
                f"cannot start {argv[0]!r}: no such program here", reason=ErrorReason.JOB_NOT_STARTED
            )
        if not writable:
            return
        resolved = os.path.realpath(writable)
        hiding = resolved if resolved in self._hidden else None if in_workspace else hiding_path(resolved, self._hidden)
        if hiding is not None:
            raise FailedPrecondition(
                f"the job's working tree {writable} is hidden from jobs ({hiding}): run it elsewhere",
                reason=ErrorReason.SANDBOX_PATH_HIDDEN,
            )

    def wrap(
        self,
        argv: Sequence[str],
        *,
        writable: str,
        working_directory: str,
        gpus: Sequence[int],
        environment: Mapping[str, str],
        isolate_network: bool,
        read_only: Sequence[str] = (),
    ) -> Launch:
        """The command and environment that start the job: in bwrap, or as it is where that is allowed."""
        if self._bwrap is None:  # check() allowed it
            home = os.environ.get("HOME", JOB_HOME)  # unconfined, as the operator chose: its user's home
            return Launch(tuple(argv), job_environment(os.environ, environment, gpus, home=home), sandboxed=False)
        resolved = os.path.realpath(writable) if writable else ""
        command = self._argv(
            self._bwrap, argv, writable=resolved, working_directory=working_directory,
            environment=environment, gpus=gpus, isolate=isolate_network, read_only=read_only,
        )  # fmt: skip
        return Launch(command, {"PATH": os.environ.get("PATH", DEFAULT_PATH)}, sandboxed=True)

    def _argv(
        self,
        bwrap: str,
        argv: Sequence[str],
        *,
        writable: str,
        working_directory: str,
        environment: Mapping[str, str],
        gpus: Sequence[int],
        isolate: bool,
        read_only: Sequence[str] = (),
    ) -> tuple[str, ...]:
        return bwrap_argv(
            bwrap,
            argv,
            writable=writable,
            working_directory=working_directory,
            hidden=self._hidden,
            environment=job_environment(os.environ, environment, gpus, home=JOB_HOME),
            gpus=gpus,
            isolate_network=isolate,
            as_root=os.geteuid() == 0,
            read_only=read_only,
        )
