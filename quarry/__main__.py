"""`python -m quarry`: the command line (the one kernel module that may import it, being its entry point)."""

import sys

from quarry.cli import main

sys.exit(main())
