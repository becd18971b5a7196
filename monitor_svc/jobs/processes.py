"""Processes the monitor started, on this machine (/proc, signals) and on SSH hosts (POSIX sh one-liners).

A job runs in its own session, so its process group (pgid = its pid) holds it
and everything it started: stopping a job signals the group. A pid is matched
with the start time /proc gives (field 22 of /proc/PID/stat, in clock ticks
since boot), so a later process that got the same pid is never taken for the
job, nor signalled. Where /proc is missing, existence is all that is checked.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from monitor_svc.ssh import quote

_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    state: str  # R, S, D, Z (zombie: it has ended), ...
    process_group: int
    start_ticks: int


def parse_stat(text: str) -> ProcStat | None:
    """/proc/PID/stat: the name (field 2) may hold spaces and parentheses, so fields are counted after its end."""
    _, _, rest = text.rpartition(")")
    fields = rest.split()
    if len(fields) < 20 or not fields[2].lstrip("-").isdigit() or not fields[19].isdigit():
        return None
    return ProcStat(fields[0], int(fields[2]), int(fields[19]))


def proc_stat(pid: int) -> ProcStat | None:
    """None when the process does not exist (or /proc cannot tell)."""
    try:
        return parse_stat((_PROC / str(pid) / "stat").read_text(errors="replace"))
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat.start_ticks if stat else None


def is_running(pid: int, ticks: int | None) -> bool:
    """Whether the process that had this pid and start time still runs (a zombie has ended)."""
    if _PROC.is_dir():
        stat = proc_stat(pid)
        return stat is not None and stat.state != "Z" and (ticks is None or stat.start_ticks == ticks)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs; zombies waiting for a parent to reap them do not count."""
    if _PROC.is_dir():
        for entry in _PROC.iterdir():
            if entry.name.isdigit():
                stat = proc_stat(int(entry.name))
                if stat is not None and stat.process_group == pgid and stat.state != "Z":
                    return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, signal: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal)


# -- on an SSH host -------------------------------------------------------------------------------

# The state and start ticks of a process ("proc STATE TICKS"), or without /proc whether kill -0 sees it.
_REMOTE_STAT = """\
if s=$(sed 's/^.*) //' /proc/{pid}/stat 2>/dev/null) && [ -n "$s" ]; then set -- $s; echo "proc $1 ${{20}}"
elif kill -0 {pid} 2>/dev/null; then echo alive; else echo gone; fi
"""


def remote_stat(pid: int) -> str:
    return _REMOTE_STAT.format(pid=int(pid))


def parse_remote_stat(line: str, ticks: int | None) -> bool | None:
    """Whether the process runs, from remote_stat's line; None when the line is not one it prints."""
    words = line.split()
    if words == ["alive"]:
        return True
    if words == ["gone"]:
        return False
    if len(words) == 3 and words[0] == "proc" and words[2].isdigit():
        return words[1] != "Z" and (ticks is None or int(words[2]) == ticks)
    return None


def remote_group_alive(pgid: int) -> str:
    """Prints "alive" while a process of the group runs, else "gone"."""
    # No "--": dash's kill does not take it, and reads "-PGID" after the signal as a group anyway.
    return f"if kill -0 -{int(pgid)} 2>/dev/null; then echo alive; else echo gone; fi"


def remote_signal_group(pgid: int, signal: str) -> str:
    return f"kill -{quote(signal)} -{int(pgid)} 2>/dev/null; true"


# Starts a command on a host, in its own session, with its output appended to the log (a regular file with
# one link, or a new one, whose resolved path is under a log root: checked as a log read is). The command
# runs under a fixed sh wrapper that writes its exit status next to the log, since the monitor cannot wait
# for a process on another machine; its arguments reach it as "$@", never as shell text. Prints
# "started PID TICKS" (TICKS empty without /proc), or why it did not start.
_REMOTE_LAUNCH = """\
p=$(readlink -f -- {log}) || {{ echo missing; exit 0; }}
inside=
for r in {roots}; do
  r=$(readlink -f -- "$r") || continue
  case $p in "${{r%/}}"/*) inside=1;; esac
done
[ -n "$inside" ] || {{ echo outside; exit 0; }}
if [ -e "$p" ]; then
  [ -f "$p" ] || {{ echo other; exit 0; }}
  set -- $(ls -ldn -- "$p" | awk 'NR == 1 {{ print $2 }}')
  [ "$1" = 1 ] || {{ echo "links $1"; exit 0; }}
fi
rm -f -- {status}
{cd}{exports}setsid sh -c '"$@"; echo $? > "$0"' {status} {argv} >> "$p" 2>&1 < /dev/null &
pid=$!
echo "started $pid $(sed 's/^.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f20)"
"""


def remote_launch(
    argv: tuple[str, ...],
    working_directory: str,
    environment: dict[str, str],
    log_path: str,
    status_path: str,
    roots: list[str],
) -> str:
    """The command that starts `argv` on a host (the variable names are checked identifiers)."""
    change = f"cd -- {quote(working_directory)} || {{ echo nodir; exit 0; }}\n" if working_directory else ""
    exports = "".join(f"export {name}={quote(value)}\n" for name, value in environment.items())
    return _REMOTE_LAUNCH.format(
        log=quote(log_path),
        roots=quote(*roots),
        status=quote(status_path),
        cd=change,
        exports=exports,
        argv=quote(*argv),
    )


def remote_status(status_path: str) -> str:
    """Prints the exit status the launch wrapper wrote, or nothing while there is none."""
    return f"head -c 16 -- {quote(status_path)} 2>/dev/null; true"
