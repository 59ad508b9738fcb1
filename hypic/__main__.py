"""``python -m hypic ...`` = the ``hypic`` command (for machines where the package is on PYTHONPATH
but not installed, such as the device runner)."""

import sys

from hypic.entrypoints.cli import main

if __name__ == "__main__":
    sys.exit(main())
