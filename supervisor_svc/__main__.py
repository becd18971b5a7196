"""`python -m supervisor_svc`: the supervisor in the foreground, the same as `quarry serve supervisor`."""

from quarry.cli import serve_main

if __name__ == "__main__":
    serve_main("supervisor")
