"""How the simulated GPUs follow the simulated server's load, and how throttling slows the server.

The fake NVML asks `LoadCoupling.reading(gpu, now)` for every dynamic value; the answer is derived from
the server's live `SimState` (requests running, last step time) and the scenario's curves and faults:

* busy = requests are running and the scheduler stepped recently (a hung server goes idle);
* load fraction f = 1 - exp(-running / batch_scale): draw, memory util, PCIe traffic and GPM follow it;
* util is `loaded_util_pct` times the share of the step a kernel runs: an eager step (graphs off, or a
  batch above the graph cap) leaves `eager_gap_ms` of launch gaps, a graph replay `graph_gap_ms`, so
  small batches (short steps) show less than 100 % (NVML util is "a kernel ran");
* PCIe bytes follow the TP all-reduce volume: tokens per step x hidden x 2 B x 2 per layer x layers x
  2(N-1)/N per GPU and direction, x `host_staging_factor` when P2P is unavailable and NCCL stages
  through host memory; over NVLink the all-reduce leaves PCIe alone. The byte counters integrate the
  mean rate; the 20 ms throughput snapshot samples it with burst noise, capped by the link;
* power is reported as NVML does on Ampere+: the 1 s average (`GetPowerUsage`) plus a noisier instant;
* memory used is what SGLang preallocates (`mem_fraction_static` of the board plus context), the
  memory clock and P-state drop to `idle_mem_mhz` / P8 when idle;
* draw = idle + (loaded - idle) * f, then: a slowdown fault (thermal, power brake) lowers the clock and
  the draw with it; the enforced limit caps the draw, sets sw_power_cap and lowers the clock as
  (limit / demand) ** 0.75 (dynamic power grows faster than linearly with clock);
* the server's step time is divided by the resulting clock ratio (`step_scale`), so a throttled GPU
  also lowers token throughput, as it does on a real host.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .fake_nvml import FakeGpu, Reading
from .scenario import EVENT_REASON_BITS, Scenario, SlowdownFault
from .sim_state import SimState

try:
    import pynvml as _nv

    GPM_IDS = {
        "sm_util_pct": _nv.NVML_GPM_METRIC_SM_UTIL,
        "sm_occupancy_pct": _nv.NVML_GPM_METRIC_SM_OCCUPANCY,
        "tensor_util_pct": _nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        "dram_bw_util_pct": _nv.NVML_GPM_METRIC_DRAM_BW_UTIL,
    }
except Exception:  # pragma: no cover - the fake itself needs pynvml's constants
    GPM_IDS = {}

CAP_CLOCK_EXPONENT = 0.75


def _mask(names: list[str]) -> int:
    out = 0
    for n in names:
        out |= EVENT_REASON_BITS[n]
    return out


def _jitter(index: int, now: float, salt: int) -> float:
    """Deterministic noise in [-1, 1], changing ten times a second, different per GPU and quantity."""
    x = (index * 7919 + int(now * 10) * 104729 + salt * 31337) % 2003
    return x / 1001.5 - 1.0


class LoadCoupling:
    """The scenario's physics over the live scheduler state. Thread-safe: it only reads plain attributes."""

    def __init__(self, scenario: Scenario, state: SimState, t0: float | None = None) -> None:
        self.scenario = scenario
        self.state = state
        self.t0 = time.monotonic() if t0 is None else t0
        g = scenario.gpu
        self.limit_w = scenario.enforced_limit_w
        self.idle_mask = _mask(list(g.event_reasons.idle))
        self.loaded_mask = _mask(list(g.event_reasons.loaded))
        gen = g.pcie.gen_current or g.pcie.gen
        width = g.pcie.width_current or g.pcie.width
        from gpu_runbook.probes.gpu_values import pcie_link_gbps  # noqa: PLC0415 - the probe's own link arithmetic

        self.link_kbps = (pcie_link_gbps(gen, width) or 0.0) * 1e6  # KB/s, 1 KB = 1000 B as the probe reads it
        self.allreduce_on_pcie = not g.peer_fabric
        self.staging = g.pcie.host_staging_factor if g.p2p != "OK" else 1.0
        self._index: dict[int, int] = {}

    def bind(self, gpus: list[FakeGpu]) -> None:
        for i, gpu in enumerate(gpus):
            self._index[id(gpu)] = i
            gpu.reading_fn = self.reading

    # -- load ------------------------------------------------------------------------------------
    def busy(self, now: float) -> bool:
        st = self.state
        if st.running <= 0:
            return False
        if st.last_step_at == 0.0:
            return True  # the first step is under way
        return now - st.last_step_at < max(3.0, 4.0 * st.step_time_s)  # a CPU-starved step is not an idle GPU

    def load_fraction(self, now: float) -> float:
        if not self.busy(now):
            return 0.0
        return 1.0 - math.exp(-self.state.running / self.scenario.gpu.power.batch_scale)

    def _fault_active(self, fault: SlowdownFault | None, now: float) -> bool:
        if fault is None:
            return False
        t = now - self.t0 - fault.after_s
        if t < 0:
            return False
        return fault.duty >= 1.0 or (t % 1.0) < fault.duty

    def _cap_shows(self, now: float) -> bool:
        duty = self.scenario.faults.power_cap_duty
        return duty >= 1.0 or (int(now * 10) % 20) / 20.0 < duty

    # -- what NVML reads -------------------------------------------------------------------------
    def physics(self, now: float) -> dict[str, Any]:
        """GPU-independent state at `now`: draw, clock, reasons, util, temperature (before jitter)."""
        sc, g = self.scenario, self.scenario.gpu
        busy = self.busy(now)
        f = self.load_fraction(now)
        p, c = g.power, g.clocks
        reasons = self.loaded_mask if busy else self.idle_mask
        sm = float(c.loaded_sm_mhz if busy else c.idle_sm_mhz)
        temp = g.temperature.idle_c + (g.temperature.loaded_c - g.temperature.idle_c) * f
        demand = p.idle_w + (p.loaded_w - p.idle_w) * f
        for fault, bits in (
            (sc.faults.thermal_slowdown, EVENT_REASON_BITS["sw_thermal_slowdown"] | (EVENT_REASON_BITS["hw_thermal_slowdown"] if sc.faults.thermal_slowdown and sc.faults.thermal_slowdown.hw else 0)),
            (sc.faults.power_brake, EVENT_REASON_BITS["hw_power_brake_slowdown"]),
        ):
            if fault is not None and self._fault_active(fault, now):
                reasons |= bits
                clock = c.max_sm_mhz * fault.sm_clock_ratio
                if busy and clock < sm:
                    demand = p.idle_w + (demand - p.idle_w) * clock / c.loaded_sm_mhz
                sm = min(sm, clock)
                if fault.temperature_c is not None:
                    temp = float(fault.temperature_c)
        power = demand
        ceiling = self.limit_w * 0.985
        if busy and demand > ceiling:
            power = ceiling
            sm = sm * (self.limit_w / demand) ** CAP_CLOCK_EXPONENT
            if self._cap_shows(now):
                reasons |= EVENT_REASON_BITS["sw_power_cap"]
        clock_ratio = sm / c.loaded_sm_mhz if busy else 1.0
        return {"busy": busy, "f": f, "power_w": power, "sm_mhz": sm, "reasons": reasons, "temp_c": temp, "clock_ratio": clock_ratio}

    def allreduce_bytes_per_s(self, now: float) -> float:
        """Per GPU and direction: the ring all-reduce bytes of the last step over its duration (0 when idle or TP1)."""
        st = self.state
        n = max(1, st.tp_size)
        if n < 2 or not self.allreduce_on_pcie or not self.busy(now) or st.step_time_s <= 0:
            return 0.0
        per_step = st.step_tokens * st.allreduce_bytes_per_token * 2 * (n - 1) / n * self.staging
        return per_step / st.step_time_s

    def util_share(self, now: float) -> float:
        """Share of the step with a kernel running: launch gaps (eager or graph) are idle time on the GPU."""
        st, t = self.state, self.scenario.server.throughput
        # the decode pass's share: an EXTEND pass of a few prompt tokens is too short to stand for the GPU's load
        step_ms = (st.decode_step_time_s or st.step_time_s) * 1000
        if step_ms <= 0:
            return 1.0
        gap = t.eager_gap_ms if st.step_eager else t.graph_gap_ms
        return max(0.0, min(1.0, 1.0 - gap / step_ms))

    def reading(self, gpu: FakeGpu, now: float) -> Reading:
        g = self.scenario.gpu
        i = self._index.get(id(gpu), 0)
        ph = self.physics(now)
        f, busy = ph["f"], ph["busy"]
        jit = g.power.jitter_pct / 100.0
        power = ph["power_w"] * (1.0 + jit * _jitter(i, now, 1))
        if busy and power > self.limit_w:
            power = self.limit_w * 0.995
        instant = ph["power_w"] * (1.0 + 4 * jit * _jitter(i, now * 7.3, 5)) if busy else power
        share = g.pcie.idle_link_share + (g.pcie.loaded_link_share - g.pcie.idle_link_share) * f
        mean_bps = min(self.link_kbps * 1000 * 0.9, self.link_kbps * 1000 * share + self.allreduce_bytes_per_s(now))
        pcie = int(min(self.link_kbps * 0.95, mean_bps / 1000 * (1.0 + 0.3 * _jitter(i, now * 50, 2))))
        util_pct = int(round(g.loaded_util_pct * self.util_share(now))) if busy else g.idle_util_pct
        st = self.state
        used = int(g.memory_mib * (1 << 20) * st.mem_fraction_static + 1.5 * (1 << 30)) if st.mem_fraction_static else 0
        gpm = {}
        if g.gpm.supported:
            loaded = g.gpm.loaded.model_dump()
            scale = f * min(1.0, ph["clock_ratio"]) if busy else 0.0
            gpm = {GPM_IDS[k]: round(v * scale, 2) for k, v in loaded.items() if k in GPM_IDS}
        sm = ph["sm_mhz"]
        return Reading(
            power_w=round(power, 3),
            gpu_util_pct=util_pct,
            mem_util_pct=int(round(g.loaded_mem_util_pct * f)),
            sm_clock_mhz=int(round(sm + (0 if sm >= g.clocks.max_sm_mhz - 15 else 7 * _jitter(i, now, 3)))),
            mem_clock_mhz=(g.clocks.mem_mhz or g.clocks.max_mem_mhz) if busy else g.clocks.idle_mem_mhz,
            temperature_c=int(round(ph["temp_c"] + _jitter(i, now, 4))),
            event_reasons=ph["reasons"],
            pcie_tx_kbps=pcie,
            pcie_rx_kbps=pcie,
            pcie_tx_bytes_per_s=mean_bps,
            pcie_rx_bytes_per_s=mean_bps,
            power_instant_w=round(instant, 3),
            pstate=g.clocks.loaded_pstate if busy else 8,
            memory_used_bytes=used,
            gpm=gpm,
        )

    def step_scale(self) -> float:
        """How much longer a decode step takes than the throughput model says: loaded clock / actual clock."""
        ph = self.physics(time.monotonic())
        if not ph["busy"]:
            return 1.0
        return 1.0 / max(0.05, min(1.0, ph["clock_ratio"]))
