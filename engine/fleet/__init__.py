"""`runbook fleet`: one runbook judged for every host a metrics store (Prometheus, VictoriaMetrics) already
scrapes. The judging and the walk per host (judge.py), the command (cli.py), the table and the report (report.py)
live here; the series themselves are the probes' (probes/prometheus), the simulated fleet the simulator's
(engine/sim/fleet.py), the live table the TUI's (engine/tui/fleet.py)."""

from .judge import Fleet, FleetHost, FleetJudge, FleetOptions, FleetResults, recorded_for

__all__ = ["Fleet", "FleetHost", "FleetJudge", "FleetOptions", "FleetResults", "recorded_for"]
