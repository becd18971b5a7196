"""Runs a local job as its child and records how it ended, for a monitor that was not there to see it.

    python3 -I -S reaper.py STATUS_FILE ARGV...

The monitor starts every local job through this script (a file of its own, run without importing
anything from Quarry, so that it starts in milliseconds). It waits for the job and writes its exit
status to STATUS_FILE (atomically: a temporary file renamed), then ends the same way: with the same
exit code, or killed by the same signal. A monitor that started the job sees that as its child's
end; one restarted while the job ran reads STATUS_FILE. The signals a stop sends to the job's
process group (SIGTERM, SIGINT, SIGHUP) are the job's: this process ignores them, and so outlives
the job to record it. SIGKILL to the group ends it too, unrecorded; the monitor that sends it knows.
"""

import os
import signal
import sys

_IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def main() -> None:
    status_file, argv = sys.argv[1], sys.argv[2:]
    for number in _IGNORED:
        signal.signal(number, signal.SIG_IGN)
    child = os.fork()
    if child == 0:
        for number in _IGNORED:  # an ignored signal stays ignored across exec: the job gets the defaults
            signal.signal(number, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as error:
            os.write(2, f"cannot start {argv[0]!r}: {error.strerror}\n".encode())
            os._exit(127)
    _, status = os.waitpid(child, 0)  # retried by Python on EINTR
    code = os.waitstatus_to_exitcode(status)  # negative: killed by that signal
    partial = f"{status_file}.partial"
    with open(partial, "w") as recorded:
        recorded.write(str(code))
        recorded.flush()
        os.fsync(recorded.fileno())
    os.replace(partial, status_file)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
