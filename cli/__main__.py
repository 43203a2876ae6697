"""``python -m balanceroute.cli``: the ``balanceroute`` command."""

import sys

from balanceroute.cli import main

sys.exit(main())
