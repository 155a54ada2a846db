"""`python -m orion.cli`."""

import sys

from orion.cli import main

sys.exit(main())
