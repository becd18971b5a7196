"""`python -m scratchpad_svc`: the scratchpad in the foreground (same as `quarry serve scratchpad`)."""

import sys

from quarry.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", "scratchpad", *sys.argv[1:]]))
