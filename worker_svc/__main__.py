"""`python -m worker_svc`: the worker in the foreground, the same as `quarry serve worker`."""

from quarry.cli import serve_main

if __name__ == "__main__":
    serve_main("worker")
