"""`python -m orion`: the `orion` command."""

import sys

from orion.cli import main

sys.exit(main())
