"""`python -m sluice.cli`: the same command as the `sluice` console script."""

import sys

from .main import main

sys.exit(main())
