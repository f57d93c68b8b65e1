"""shoal: a Triton-compatible inference server for Python models."""

import os as _os

from shoal._compiled import prefer_fresh_sources as _prefer_fresh_sources

__version__ = "0.1.0"

_prefer_fresh_sources(_os.path.dirname(_os.path.abspath(__file__)))
