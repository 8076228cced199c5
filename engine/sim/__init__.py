"""The simulated GPU inference host: a fake NVML and an SGLang-like HTTP server, driven by scenarios."""
