"""What every server family shares: the HTTP calls, the metrics window by concept, the load sweep, the
profile capture's GPU-side readings and the values models. A family folder (probes/sglang, probes/vllm) fills these
from its own names and imports nothing from another family."""
