"""Regular-expression search over file texts, run in a child process that is killed when it takes too long.

Python's `re` can backtrack for ever on some patterns (a ReDoS, "(a+)+$"), and a thread cannot
be stopped: so the monitor reads the files, and this module, as `python -m
monitor_svc.workspaces.grep`, matches them, reading a JSON request on stdin and printing the
matches as JSON. `match_files` is the pure part.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from pathlib import Path

MAX_LINE_CHARS = 500
# The package's parent directory: the child imports this module however the monitor was started.
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def match_files(pattern: str, flags: int, files: list[tuple[str, str]], limit: int) -> list[tuple[str, int, str]]:
    """(path, line number from 1, line without its ending, cut) of matching lines, at most `limit` + 1."""
    compiled = re.compile(pattern, flags)
    found: list[tuple[str, int, str]] = []
    for path, text in files:
        for number, line in enumerate(text.split("\n"), 1):
            if compiled.search(line):
                found.append((path, number, line.removesuffix("\r")[:MAX_LINE_CHARS]))
                if len(found) > limit:
                    return found
    return found


class SearchTooSlow(Exception):
    pass


async def search(
    pattern: str, flags: int, files: list[tuple[str, str]], limit: int, seconds: float
) -> list[tuple[str, int, str]]:
    """`match_files` in a child process, killed after `seconds` (SearchTooSlow)."""
    request = json.dumps({"pattern": pattern, "flags": flags, "files": files, "limit": limit}).encode()
    path = os.pathsep.join(filter(None, [_PACKAGE_PARENT, os.environ.get("PYTHONPATH", "")]))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        __name__,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
    )
    try:
        async with asyncio.timeout(seconds):
            stdout, stderr = await process.communicate(request)
    except TimeoutError as error:
        raise SearchTooSlow from error
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    if process.returncode != 0:
        why = stderr.decode(errors="replace")[-500:]
        raise RuntimeError(f"the search process failed ({process.returncode}): {why}")
    return [(str(path), int(number), str(line)) for path, number, line in json.loads(stdout)]


def main() -> None:
    request = json.load(sys.stdin)
    files = [(str(path), str(text)) for path, text in request["files"]]
    json.dump(match_files(request["pattern"], int(request["flags"]), files, int(request["limit"])), sys.stdout)


if __name__ == "__main__":
    main()
