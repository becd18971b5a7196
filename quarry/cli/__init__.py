"""The `quarry` command line: the layer above the kernel and the services, which it starts by name.

This module stays light: the rest loads inside `main`, so a Ctrl-C while it loads (a second
or more on a busy machine) ends the command as quietly as one later.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["main", "serve_main"]

# The status a shell gives a command that SIGINT ended.
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """The `quarry` command; a Ctrl-C that no command has taken charge of ends it without a traceback."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        # Ignored by the parent (a test runner's worker, a shell's background job), so Python left it ignored: the
        # commands take SIGINT over once they run anyway, and a Ctrl-C while they load would be lost.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # The arguments first, with nothing heavy loaded: `--help` and a mistyped flag answer at once.
        from quarry.cli.arguments import build_parser

        parser = build_parser()
        args = parser.parse_args(argv)
        from quarry.cli.commands import run_parsed

        return run_parsed(parser, args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def serve_main(service: str) -> NoReturn:
    """The whole of each service's `__main__`: `python -m worker_svc` is `quarry serve worker`."""
    sys.exit(main(["serve", service, *sys.argv[1:]]))
