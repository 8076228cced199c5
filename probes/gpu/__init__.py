"""GPUs on this host: NVML (nvidia-ml-py) for inventory, power and clocks, topology and activity, and a
dcgm-exporter endpoint when the host runs one. They fill the GPU concepts of probes/gpu_values.py."""
