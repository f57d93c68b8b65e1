"""``python -m shoal``: the same command line as ``shoal``."""

import sys

from shoal.cli import main

sys.exit(main())
