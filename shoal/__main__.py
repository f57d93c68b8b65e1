"""``python -m shoal``: the same command line as ``shoal``."""

import sys

from shoal._launch import main

sys.exit(main())
