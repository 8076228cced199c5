"""The AMD GPU probe family: amdsmi's readings as the GPU concepts (probes/gpu_values.py) every GPU source fills."""
