"""The sandbox's command line and environment (monitor_svc/jobs/sandbox.py), as pure functions: no GPU here,
so the device nodes a job gets are checked on the argv; and the monitor's diagnostics saying which is in force."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from monitor_svc.gpus import NvmlProbe
from monitor_svc.jobs.sandbox import ALLOWED_VARIABLES, Sandbox, bwrap_argv, hiding_path, job_environment, protected_in
from monitor_svc.service import diagnostics
from quarry.config import MonitorSettings
from quarry.errors import FailedPrecondition


def argv(
    *,
    existing: Sequence[str] = (),
    directories: Sequence[str] = (),
    gpus: Sequence[int] = (),
    hidden: Sequence[str] = (),
    writable: str = "/srv/ws",
    isolate_network: bool = False,
    as_root: bool = True,
) -> list[str]:
    present = {*existing, *directories}
    return list(
        bwrap_argv(
            "/usr/bin/bwrap",
            ["python3", "train.py"],
            writable=writable,
            working_directory=f"{writable}/src" if writable else "",
            hidden=hidden,
            environment={"PATH": "/usr/bin", "HOME": "/tmp"},
            gpus=gpus,
            isolate_network=isolate_network,
            as_root=as_root,
            exists=present.__contains__,
            is_dir=set(directories).__contains__,
        )
    )


def pairs(args: list[str], option: str) -> list[tuple[str, str]]:
    """The (source, destination) of every use of a two-argument option, in order."""
    return [(args[i + 1], args[i + 2]) for i, arg in enumerate(args) if arg == option]


def test_the_job_runs_after_the_options_in_its_own_namespaces_with_only_its_environment() -> None:
    args = argv()
    assert args[0] == "/usr/bin/bwrap" and args[-3:] == ["--", "python3", "train.py"]
    for option in ("--unshare-pid", "--clearenv"):
        assert option in args
    assert "--die-with-parent" not in args, "a job outlives a monitor restart"
    assert "--new-session" not in args, "the job stays in the group the monitor signals"
    assert args[args.index("--proc") + 1] == "/proc" and args[args.index("--dev") + 1] == "/dev"
    assert ("/", "/") in pairs(args, "--ro-bind") and args[args.index("--tmpfs") + 1] == "/tmp"
    assert pairs(args, "--setenv") == [("PATH", "/usr/bin"), ("HOME", "/tmp")]
    assert args[args.index("--chdir") + 1] == "/srv/ws/src"
    assert "--unshare-net" not in args
    assert "--unshare-net" in argv(isolate_network=True)


def test_as_root_the_job_is_nobody_in_a_user_namespace_and_otherwise_as_it_is() -> None:
    args = argv(as_root=True)
    assert args[args.index("--unshare-user") :][:5] == ["--unshare-user", "--uid", "65534", "--gid", "65534"]
    assert "--unshare-user" not in argv(as_root=False) and "--uid" not in argv(as_root=False)


def test_the_workspace_is_writable_its_git_read_only_and_hidden_paths_empty_and_read_only() -> None:
    args = argv(
        existing=["/srv/ws/.git", "/etc/quarry.toml"],
        directories=["/srv", "/srv/ws/data", "/run/secrets"],
        hidden=["/srv", "/srv/ws/data", "/run/secrets", "/etc/quarry.toml", "/not/there"],
    )
    assert pairs(args, "--bind") == [("/srv/ws", "/srv/ws")]
    assert ("/srv/ws/.git", "/srv/ws/.git") in pairs(args, "--ro-bind")
    assert ("/dev/null", "/etc/quarry.toml") in pairs(args, "--ro-bind"), "a hidden file reads as empty"
    tmpfs = [args[i + 1] for i, arg in enumerate(args) if arg == "--tmpfs"]
    assert tmpfs == ["/tmp", "/srv", "/run/secrets", "/srv/ws/data"], "shallower first: the deeper mount wins"
    assert "/not/there" not in args
    # The workspace inside a hidden directory is bound over it, a hidden path inside it over the workspace.
    order = [args[i + 1] for i, arg in enumerate(args) if arg in ("--tmpfs", "--bind")]
    assert order.index("/srv") < order.index("/srv/ws") < order.index("/srv/ws/data")
    remounted = [args[i + 1] for i, arg in enumerate(args) if arg == "--remount-ro"]
    assert remounted == ["/srv", "/srv/ws/data", "/run/secrets"]
    assert args[: args.index("--clearenv")][-6::2] == ["--remount-ro"] * 3, "after every mount inside them"


def test_without_a_working_tree_only_tmp_is_writable() -> None:
    args = argv(writable="")
    assert pairs(args, "--bind") == [] and "--chdir" not in args


def test_a_job_gets_the_device_nodes_of_its_gpus_and_the_drivers_only_with_gpus() -> None:
    nodes = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    args = argv(existing=nodes, gpus=[0, 2])
    assert pairs(args, "--dev-bind") == [
        (node, node) for node in ("/dev/nvidia0", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm")
    ]
    assert pairs(argv(existing=nodes), "--dev-bind") == [], "no GPU given: no GPU reachable"
    assert pairs(argv(existing=["/dev/nvidiactl"], gpus=[3]), "--dev-bind") == [("/dev/nvidiactl", "/dev/nvidiactl")]


def test_the_environment_is_the_allowlist_the_home_the_jobs_own_and_its_gpus() -> None:
    inherited = {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "TERM": "xterm",
        "HOME": "/root",
        "QUARRY_MESH_TOKEN": "mesh-secret",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=otel-secret",
        "OPENAI_API_KEY": "model-key",
    }
    environment = job_environment(inherited, {"SEED": "7"}, [1, 3], home="/tmp")
    assert environment == {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "TERM": "xterm",
        "HOME": "/tmp",
        "SEED": "7",
        "CUDA_VISIBLE_DEVICES": "1,3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert set(ALLOWED_VARIABLES) == {"PATH", "LANG", "LC_ALL", "TZ", "TERM"}
    assert job_environment({}, {}, [], home="/w")["PATH"].endswith("/usr/bin:/sbin:/bin"), "a PATH even so"


def test_a_working_tree_that_is_or_lies_in_a_hidden_path_is_named() -> None:
    assert hiding_path("/data/quarry/monitor", ["/data/quarry"]) == "/data/quarry"
    assert hiding_path("/data/quarry", ["/data/quarry"]) == "/data/quarry"
    assert hiding_path("/data/quarry-work", ["/data/quarry"]) is None
    assert hiding_path("/srv/ws", ["/srv/ws/data"]) is None


PLAIN: dict[str, Any] = {
    "working_directory": "/srv/ws", "environment": {}, "writable": "/srv/ws", "in_workspace": False,
    "isolate_network": False,
}  # fmt: skip


def test_without_a_sandbox_local_jobs_are_refused_unless_allowed_and_diagnostics_say_which() -> None:
    refused = Sandbox("none", False, [])
    with pytest.raises(FailedPrecondition) as caught:
        refused.check(["true"], **PLAIN)
    assert caught.value.reason == "SANDBOX_UNAVAILABLE"
    assert "bubblewrap" in str(caught.value) and "QUARRY_MONITOR_UNSANDBOXED_JOBS" in str(caught.value)
    allowed = Sandbox("none", True, [])
    allowed.check(["true"], **PLAIN)
    with pytest.raises(FailedPrecondition):  # a network of its own needs the sandbox
        allowed.check(["true"], **{**PLAIN, "isolate_network": True})

    def fact(sandbox: Sandbox) -> str:
        facts = diagnostics(MonitorSettings(), NvmlProbe(), sandbox).facts
        [found] = [f for f in facts if f.name == "local job sandbox"]
        assert found.setting == "QUARRY_MONITOR_JOB_SANDBOX"
        return found.value

    assert fact(allowed).startswith("none (QUARRY_MONITOR_UNSANDBOXED_JOBS")
    assert fact(refused).startswith("none: local jobs are refused")
    bwrap = Sandbox("bwrap", False, [])
    bwrap.probe()  # bubblewrap is installed wherever the tests run (.ci/run installs it)
    assert fact(bwrap).startswith("bubblewrap ")


def test_protected_paths_are_found_outermost_without_links_and_within_the_scan_bound(tmp_path: Path) -> None:
    for name in ("eval.py", "data/a.csv", "data/b.csv", "configs/x.lock", "configs/deep/y.lock", "free.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "link.lock").symlink_to(tmp_path / "free.txt")
    rules = ("eval.py", "data", "missing.py", "*.lock")
    found = protected_in(str(tmp_path), rules)
    # A glob's `*` matches "/" as the monitor's own path rules do; a matching directory covers its contents.
    assert sorted(found) == sorted(
        str(tmp_path / name) for name in ("eval.py", "data", "configs/x.lock", "configs/deep/y.lock")
    )
    assert len(protected_in(str(tmp_path), ("*.lock",), max_scan=1)) < 2, "the walk stops at its bound"
