"""The plugin API: everything a probe author imports, from one stable path.

    from gpu_runbook.plugin import Context, Evidence, Probe, Table

The modules behind these names (probe, evidence) may move; this path and these names stay. A probe is
registered under the `runbook.probes` entry-point group (as the built-in ones are), or loaded from a file
with `--probes-dir DIR` or a runbook's `probe_files`.
"""

from __future__ import annotations

from .evidence import Bars, Block, Breakdown, Evidence, ProbeStatus, Series, Table, downsample, utcnow
from .probe import Context, NoParams, Probe
from .target import Target
from .values import Values, value

__all__ = [
    "Bars",
    "Block",
    "Breakdown",
    "Context",
    "Evidence",
    "NoParams",
    "Probe",
    "ProbeStatus",
    "Series",
    "Table",
    "Target",
    "Values",
    "downsample",
    "utcnow",
    "value",
]
