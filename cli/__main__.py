"""``python -m balanceroute.cli``: the ``balanceroute`` command."""

import sys

from balanceroute.cli import main

if __name__ == "__main__":
    sys.exit(main())
