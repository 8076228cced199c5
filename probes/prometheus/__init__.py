"""A fleet through the metrics store it already has (Prometheus, VictoriaMetrics): one query a value across every
host, filling the same GPU (probes/gpu_values.py) and server (probes/server/values.py) concepts a host run fills."""
