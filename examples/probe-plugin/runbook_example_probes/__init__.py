"""Example third-party probes for runbook."""
