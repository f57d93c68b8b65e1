"""shoal: a Triton-compatible inference server for Python models."""

__version__ = "0.1.0"
