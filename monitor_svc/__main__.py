"""`python -m monitor_svc`: the monitor in the foreground, the same as `quarry serve monitor`."""

from quarry.cli import serve_main

if __name__ == "__main__":
    serve_main("monitor")
