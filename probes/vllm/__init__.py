"""vLLM: its OpenAI-compatible API, its /metrics and its profiler, filling the server concepts (probes/server)."""
