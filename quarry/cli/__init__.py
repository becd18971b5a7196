"""The `quarry` command line: the layer above the kernel and the services, which it starts by name."""

from quarry.cli.commands import main, serve_main

__all__ = ["main", "serve_main"]
