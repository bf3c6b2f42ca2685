"""`python -m optbench`: the command line (optbench/cli/main.py)."""

import sys

from optbench.cli.main import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
