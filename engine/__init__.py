"""runbook: an investigation engine for GPU inference hosts."""

__version__ = "0.1.0"
