"""`python -m scratchpad_svc`: the scratchpad in the foreground, the same as `quarry serve scratchpad`."""

from quarry.cli import serve_main

if __name__ == "__main__":
    serve_main("scratchpad")
