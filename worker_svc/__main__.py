"""`python -m worker_svc`: the worker in the foreground (same as `quarry serve worker`)."""

import sys

from quarry.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", "worker", *sys.argv[1:]]))
