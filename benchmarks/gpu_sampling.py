"""CPU cost of gpu.sample per GPU per sample, against a bare loop of the same raw fake NVML calls.

Run: python benchmarks/gpu_sampling.py [--gpus 8] [--ticks 2000]
The baseline and the measured paths run in the same process on the same fake, so the ratio is
what the probe's bookkeeping (error mapping, dead-call cache, tracks) costs on top of NVML itself.
The last line runs the whole probe (asyncio, one thread hop per tick) at 10 Hz-like spacing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_runbook.nvml import Nvml, open_devices  # noqa: E402
from gpu_runbook.probe import Context
from gpu_runbook.target import Target  # noqa: E402
from gpu_runbook.sim import fake_nvml as F  # noqa: E402
from gpu_runbook.probes.gpu.sample import GpuSample, SampleParams, _Sampler  # noqa: E402


def bare_loop(mod, handles, ticks: int) -> None:
    """The same NVML calls a tick makes, with nothing around them."""
    sm, mem, tx, rx, temp = mod.NVML_CLOCK_SM, mod.NVML_CLOCK_MEM, mod.NVML_PCIE_UTIL_TX_BYTES, mod.NVML_PCIE_UTIL_RX_BYTES, mod.NVML_TEMPERATURE_GPU
    for _ in range(ticks):
        for h in handles:
            mod.nvmlDeviceGetPowerUsage(h)
            mod.nvmlDeviceGetUtilizationRates(h)
            mod.nvmlDeviceGetClockInfo(h, sm)
            mod.nvmlDeviceGetClockInfo(h, mem)
            mod.nvmlDeviceGetTemperatureV(h, temp)
            mod.nvmlDeviceGetCurrentClocksEventReasons(h)
            mod.nvmlDeviceGetPcieThroughput(h, tx)
            mod.nvmlDeviceGetPcieThroughput(h, rx)
            mod.nvmlDeviceGetTotalEnergyConsumption(h)
            time.monotonic()
            time.monotonic()


def cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


async def whole_probe(mod, duration: float, interval: float) -> tuple[float, int]:
    ctx = Context(target=Target(), http=None, nvml=Nvml(mod))  # type: ignore[arg-type]
    t0 = time.process_time()
    ev = await GpuSample().run(ctx, SampleParams(duration_s=duration, interval_s=interval))
    return time.process_time() - t0, ev.values["sample_count"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=2000)
    args = ap.parse_args()
    mod = F.make_module(F.rtx_pro_6000_pcie_box(args.gpus))
    mod.nvmlInit()
    devs = open_devices(mod).devices
    handles = [d.handle for d in devs]
    n = args.gpus * args.ticks

    bare_loop(mod, handles, 50)  # warm up
    base = min(cpu(lambda: bare_loop(mod, handles, args.ticks)) for _ in range(3))
    sampler_cost = []
    for _ in range(3):
        s = _Sampler(mod, devs)
        sampler_cost.append(cpu(lambda s=s: [s.tick() for _ in range(args.ticks)]))
    probe = min(sampler_cost)

    print(f"{args.gpus} fake GPUs x {args.ticks} ticks, CPU time per GPU per sample:")
    print(f"  baseline (bare raw fake calls): {base / n * 1e6:8.2f} us")
    print(f"  gpu.sample tick (_Sampler)    : {probe / n * 1e6:8.2f} us   ratio {probe / base:.2f}x baseline")
    total, samples = asyncio.run(whole_probe(mod, duration=2.0, interval=0.02))
    per = total / (samples * args.gpus)
    print(f"  whole probe (asyncio + thread hop + stats, {samples} samples over 2 s): {per * 1e6:8.2f} us"
          f"   ratio {per / (base / n):.2f}x baseline")
    print(f"  -> {args.gpus} GPUs at 10 Hz cost about {per * args.gpus * 10 * 100:.2f}% of one CPU core")


if __name__ == "__main__":
    main()
