"""A simulated fleet: several simulated hosts, each with its server's `/metrics` (SGLang or vLLM, as its scenario's
`server.kind` says) and a GPU exporter on its own port of 127.0.0.1 (dcgm-exporter on NVIDIA hosts, the AMD Device
Metrics Exporter on AMD ones, in the compute partition mode the host spec names: `amd_exporter.py`), in different
states, under production-like traffic, for a real Prometheus or VictoriaMetrics to scrape.

Each host is a `SimulatedHost` (the same server, fake NVML and coupling as `runbook run --simulate`) plus a
dcgm-exporter that serves that host's GPU readings with the labels a real one has (`Hostname` = the host's
name) and either the stock counters (`default-counters.csv`: no limits, no max clocks, no violation
counters) or the extended ones `runbook fleet --dcgm-counters` prints. The violation counters integrate
the coupling's clock-event reasons over time, in ns (DCGM's header) or µs (older exporters). A host whose
exporter is "down" gets a port nothing listens on: its scrape fails, as a crashed exporter's does.
Traffic comes from the engine's own load generator, one per host, on one background event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..load import LoadConfig, LoadGenerator
from .scenario import scenario_with
from .amd_exporter import SimAmdExporter
from .dcgm_exporter import SimDcgmExporter
from .host import SimulatedHost
from .scenario import EVENT_REASON_BITS

STOCK = "stock"
EXTENDED = "extended"
DOWN = "down"
# dcgm-exporter's etc/default-counters.csv, the fields of it this simulator computes (vllm-and-fleet.md §5.1)
STOCK_CSV = """# stock dcgm-exporter default-counters.csv (the fields the simulated exporter can compute)
DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).
DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_DRAM_ACTIVE, gauge, Ratio of cycles the device memory interface is active sending or receiving data.
DCGM_FI_PROF_PCIE_TX_BYTES, gauge, The rate of data transmitted over the PCIe bus.
DCGM_FI_PROF_PCIE_RX_BYTES, gauge, The rate of data received over the PCIe bus.
"""


def counters_fields(csv_text: str) -> set[str]:
    """The fields a dcgm-exporter counters file enables: the first column of every line that is not a comment."""
    out = set()
    for line in csv_text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.add(line.split(",", 1)[0].strip())
    return out
THERMAL_BITS = EVENT_REASON_BITS["sw_thermal_slowdown"] | EVENT_REASON_BITS["hw_thermal_slowdown"]
STEP_S = 0.02  # how finely the violation counters integrate the reasons (they flicker at 10 Hz)


@dataclass
class HostSpec:
    name: str  # the host's name: dcgm-exporter's Hostname label and the scrape's `host` label
    scenario: str
    scenario_set: dict[str, Any] = field(default_factory=dict)
    concurrency: int = 64  # the traffic it serves (0: idle)
    input_len: int = 128
    output_len: int = 32
    counters: str = EXTENDED  # stock | extended (what `runbook fleet --dcgm-counters` prints) | down | a counters file's text
    violation_unit: str = "ns"  # ns (DCGM's header) | us (older exporters)
    collect_interval_s: float = 1.0
    gpu_exporter: str = "auto"  # dcgm | amd | auto: by the scenario's GPU (an AMD one: the AMD exporter)
    compute_partition: str = "auto"  # AMD: spx | dpx | qpx | cpx, or auto: the scenario's (else spx)


def exporter_kind(spec: HostSpec, host: SimulatedHost) -> str:
    """Which exporter a simulated host runs: as its spec says, else the AMD one for an AMD GPU."""
    if spec.gpu_exporter != "auto":
        return spec.gpu_exporter
    gpu = host.scenario.gpu
    return "amd" if getattr(gpu, "vendor", None) == "amd" or gpu.model.upper().startswith("AMD") else "dcgm"


def partition_modes(spec: HostSpec, host: SimulatedHost) -> tuple[str, str]:
    """The compute and memory partition modes an AMD host's exporter lists its GPUs in: the spec's compute mode,
    else the scenario's (SPX, NPS1 where it names none)."""
    amd = getattr(host.scenario.gpu, "amd", None)
    compute = spec.compute_partition if spec.compute_partition != "auto" else getattr(amd, "compute_partition", None) or "spx"
    return str(compute).lower(), str(getattr(amd, "memory_partition", None) or "nps1").lower()


@dataclass
class FleetMember:
    spec: HostSpec
    host: SimulatedHost
    dcgm_target: str  # host:port Prometheus scrapes for the GPU exporter (dcgm-exporter, or the AMD one)
    server_target: str  # host:port of the server (SGLang or vLLM)
    load: LoadGenerator | None = None  # its traffic
    gpu_exporter: str = "dcgm"  # dcgm | amd: the scrape job its exporter goes in

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def server_kind(self) -> str:
        return self.host.scenario.server.kind


class FleetExporter(SimDcgmExporter):
    """dcgm-exporter for one simulated host: its Hostname, stock or extended fields, violation counters."""

    def __init__(self, member: HostSpec, host: SimulatedHost) -> None:
        self.spec, self.sim = member, host
        self._viol = [[0.0, 0.0] for _ in host.fake.gpus]  # per GPU: power, thermal (s)
        self._last = time.monotonic()
        from gpu_runbook.probes.prometheus.gpu import counters_csv  # noqa: PLC0415 - what --dcgm-counters prints

        text = {STOCK: STOCK_CSV, EXTENDED: counters_csv()}.get(member.counters, member.counters)
        self.fields = counters_fields(text)
        super().__init__(self._collect, member.collect_interval_s)

    def _integrate(self, now: float) -> None:
        t = self._last
        coupling = self.sim.coupling
        while t < now:
            dt = min(STEP_S, now - t)
            reasons = coupling.physics(t)["reasons"]
            for acc in self._viol:
                if reasons & EVENT_REASON_BITS["sw_power_cap"]:
                    acc[0] += dt
                if reasons & THERMAL_BITS:
                    acc[1] += dt
            t += dt
        self._last = now

    def _collect(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        self._integrate(now)
        sc = self.sim.scenario
        spec = sc.dcgm_exporter
        f = self.sim.coupling.load_fraction(now)
        scale = 1e9 if self.spec.violation_unit == "ns" else 1e6
        gpm = sc.gpu.gpm.loaded if spec is None and sc.gpu.gpm.supported else None
        ph = self.sim.coupling.physics(now)
        # PROF activity: the scenario's dcgm-exporter figures, else its GPM figures (the same counters), scaled by the load
        scale_prof = f * min(1.0, ph["clock_ratio"]) if ph["busy"] else 0.0
        dram = (gpm.dram_bw_util_pct / 100.0 if gpm else spec.dram_active if spec else None)
        tensor = (gpm.tensor_util_pct / 100.0 if gpm else spec.pipe_tensor_active if spec else None)
        rows = []
        for i, gpu in enumerate(self.sim.fake.gpus):
            r = gpu.reading(now)
            row: dict[str, Any] = {
                "gpu": i, "uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id, "model": gpu.name,
                "DCGM_FI_DEV_SM_CLOCK": r.sm_clock_mhz, "DCGM_FI_DEV_MEM_CLOCK": r.mem_clock_mhz,
                "DCGM_FI_DEV_GPU_TEMP": r.temperature_c, "DCGM_FI_DEV_POWER_USAGE": round(r.power_w, 3),
                "DCGM_FI_DEV_GPU_UTIL": r.gpu_util_pct,
                "DCGM_FI_PROF_PCIE_TX_BYTES": int(r.pcie_tx_bytes_per_s or 0),
                "DCGM_FI_PROF_PCIE_RX_BYTES": int(r.pcie_rx_bytes_per_s or 0),
            }  # fmt: skip
            if dram is not None and tensor is not None:  # no PROF fields where the GPU has no profiling counters
                row["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] = round(tensor * scale_prof, 4)
                row["DCGM_FI_PROF_DRAM_ACTIVE"] = round(dram * scale_prof, 4)
            row.update({
                "DCGM_FI_DEV_MAX_SM_CLOCK": gpu.max_sm_clock_mhz, "DCGM_FI_DEV_MAX_MEM_CLOCK": gpu.max_mem_clock_mhz,
                "DCGM_FI_DEV_POWER_MGMT_LIMIT": gpu.power_limit_requested_w,
                "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": gpu.power_limit_max_w,
                "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": gpu.power_limit_enforced_w,
                "DCGM_FI_DEV_POWER_VIOLATION": int(self._viol[i][0] * scale),
                "DCGM_FI_DEV_THERMAL_VIOLATION": int(self._viol[i][1] * scale),
            })  # fmt: skip
            rows.append({k: v for k, v in row.items() if not k.startswith("DCGM_") or k in self.fields})
        return rows

    def text(self) -> str:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.interval_s:
                self._text, self._at = render_rows(self.collect(), self.spec.name), now
            return self._text


class FleetAmdExporter(SimAmdExporter):
    """The AMD Device Metrics Exporter for one simulated host: its readings, the violation residencies (the share
    of each collection interval the coupling held the GPU at its power cap or a thermal limit), its partitions."""

    def __init__(self, member: HostSpec, host: SimulatedHost) -> None:
        self.spec, self.sim = member, host
        self._last = time.monotonic()
        super().__init__(self._collect, member.collect_interval_s, member.name, *partition_modes(member, host))

    def _residency(self, now: float) -> tuple[float, float]:
        """% of the time since the last collection under the power cap, and under a thermal limit."""
        t, start, held = self._last, self._last, [0.0, 0.0]
        while t < now:
            dt = min(STEP_S, now - t)
            reasons = self.sim.coupling.physics(t)["reasons"]
            held[0] += dt if reasons & EVENT_REASON_BITS["sw_power_cap"] else 0.0
            held[1] += dt if reasons & THERMAL_BITS else 0.0
            t += dt
        self._last = now
        span = now - start
        return (round(100.0 * held[0] / span, 3), round(100.0 * held[1] / span, 3)) if span > 0 else (0.0, 0.0)

    def _collect(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        ppt, thermal = self._residency(now)
        rows = []
        # the host's physical GPUs: its fake amdsmi's on an AMD scenario, else the fake NVML's (an AMD model on them)
        amd_gpus = getattr(getattr(self.sim, "fake_amd", None), "gpus", None)
        for i, gpu in enumerate(amd_gpus if amd_gpus else self.sim.fake.gpus):
            r = gpu.reading(now)
            rows.append({
                "name": getattr(gpu, "market_name", None) or gpu.name, "serial": f"SIM{self.spec.name[:8].upper()}{i:04d}",
                "gpu_package_power": round(r.power_w, 3), "gpu_power_usage": round(r.power_w, 3),
                "gpu_gfx_activity": r.gpu_util_pct, "gpu_umc_activity": r.mem_util_pct,
                "gpu_junction_temperature": r.temperature_c,
                "gfx_clock_mhz": r.sm_clock_mhz, "mem_clock_mhz": r.mem_clock_mhz,
                "max_gfx_clock_mhz": getattr(gpu, "max_gfx_mhz", None) or gpu.max_sm_clock_mhz,
                "max_mem_clock_mhz": getattr(gpu, "max_mem_mhz", None) or gpu.max_mem_clock_mhz,
                "gpu_violation_ppt_residency_percentage": ppt, "gpu_violation_socket_thermal_residency_percentage": thermal,
            })  # fmt: skip
        return rows


def render_rows(rows: list[dict[str, Any]], hostname: str) -> str:
    """Prometheus text as dcgm-exporter writes it: one family per field, the labels it puts on each GPU."""
    from gpu_runbook.probes.prometheus.gpu import FIELDS  # noqa: PLC0415 - the field table, with its types

    out: list[str] = []
    names = [n for n in FIELDS if rows and n in rows[0]]
    for name in names:
        f = FIELDS[name]
        out.append(f"# HELP {name} {f.help}\n# TYPE {name} {f.kind}\n")
        for r in rows:
            labels = (f'gpu="{r["gpu"]}",UUID="{r["uuid"]}",pci_bus_id="{r["pci_bus_id"]}",device="nvidia{r["gpu"]}",'
                      f'modelName="{r["model"]}",Hostname="{hostname}"')  # fmt: skip
            out.append(f"{name}{{{labels}}} {r[name]}\n")
    return "".join(out)


@contextlib.contextmanager
def _dead_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections for as long as the fleet runs: bound, never listening.
    Released at once, the port could be handed to the next server started on this machine (a Prometheus, a
    simulated host), which then answers the dead exporter's scrapes with its own metrics (`up` 1, no GPU series)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


class _Traffic:
    """The fleet's production traffic: one load generator per host, on one event loop in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fleet-traffic", daemon=True)
        self.thread.start()
        self.gens: list[LoadGenerator] = []

    def add(self, host: SimulatedHost, spec: HostSpec) -> LoadGenerator:
        config = LoadConfig(concurrency=spec.concurrency, input_len=spec.input_len, output_len=spec.output_len)
        gen = LoadGenerator(host.target(), config)
        asyncio.run_coroutine_threadsafe(gen.start(), self.loop).result(timeout=60)
        self.gens.append(gen)
        return gen

    def stop(self) -> None:
        for gen in self.gens:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(gen.stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@contextlib.contextmanager
def simulated_fleet(specs: list[HostSpec]) -> Iterator[list[FleetMember]]:
    """Start every host, its exporter and its traffic; stop them all after the `with` block."""
    members: list[FleetMember] = []
    traffic = _Traffic()
    with contextlib.ExitStack() as stack:
        try:
            for spec in specs:
                scenario = scenario_with(spec.scenario, spec.scenario_set)
                host = stack.enter_context(SimulatedHost.start(scenario))
                server_target = host.url.split("://", 1)[1].rstrip("/")
                kind = exporter_kind(spec, host)
                if spec.counters == DOWN:
                    dcgm_target = f"127.0.0.1:{stack.enter_context(_dead_port())}"
                else:
                    exporter = FleetAmdExporter(spec, host) if kind == "amd" else FleetExporter(spec, host)
                    url = exporter.start()
                    stack.callback(exporter.stop)
                    dcgm_target = url.split("://", 1)[1].split("/", 1)[0]
                members.append(FleetMember(spec, host, dcgm_target, server_target,
                                           traffic.add(host, spec) if spec.concurrency > 0 else None, kind))
            yield members
        finally:
            traffic.stop()


AMD_JOB = "amd-device-metrics-exporter"


def prometheus_config(members: list[Any], interval_s: float = 1.0) -> str:
    """A scrape config with a job for the dcgm-exporters (dcgm), one for the AMD exporters where there are AMD hosts,
    and one per server kind (sglang, vllm: each server's /metrics), each target given its host's `host` label by
    static config (what relabelling does on a real fleet: vllm-and-fleet.md §5.3). A member without `server_kind`
    is an SGLang host; one without `gpu_exporter` an NVIDIA host."""
    lines = ["global:", f"  scrape_interval: {interval_s:g}s", f"  scrape_timeout: {min(interval_s, 10):g}s", "scrape_configs:"]
    kinds = [k for k in ("sglang", "vllm") if any(getattr(m, "server_kind", "sglang") == k for m in members)] or ["sglang"]
    exporters = [("dcgm", "dcgm_target")] + ([(AMD_JOB, "dcgm_target")] if any(getattr(m, "gpu_exporter", "dcgm") == "amd" for m in members) else [])
    for job, attr in (*exporters, *((kind, "server_target") for kind in kinds)):
        lines += [f"  - job_name: {job}", "    static_configs:"]
        for m in members:
            if attr == "server_target" and getattr(m, "server_kind", "sglang") != job:
                continue
            if attr == "dcgm_target" and (getattr(m, "gpu_exporter", "dcgm") == "amd") != (job == AMD_JOB):
                continue
            lines += [f"      - targets: ['{getattr(m, attr)}']", f"        labels: {{host: '{m.name}'}}"]
    return "\n".join(lines) + "\n"


# -- one host per process --------------------------------------------------------------------------
# Several simulated hosts in one process share one GIL: on a busy machine their schedulers stall each other
# and a GPU looks idle between steps. `spawn_host` runs each host in its own process instead.


def _serve_one(spec_json: str) -> None:
    """Child process: start one host, print its targets, then `steady` once its first requests finished;
    run until stdin closes."""
    import json  # noqa: PLC0415
    import sys  # noqa: PLC0415

    spec = HostSpec(**json.loads(spec_json))
    with simulated_fleet([spec]) as (member,):
        print(json.dumps({"dcgm_target": member.dcgm_target, "server_target": member.server_target,
                          "server_kind": member.server_kind, "gpu_exporter": member.gpu_exporter}), flush=True)  # fmt: skip
        deadline = time.monotonic() + 300
        while member.load is not None and member.load.stats().completed == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        print(json.dumps({"steady": member.load is None or member.load.stats().completed > 0}), flush=True)
        sys.stdin.read()  # until the parent closes it (or exits)


@dataclass
class HostProcess:
    spec: HostSpec
    proc: Any
    dcgm_target: str
    server_target: str
    server_kind: str = "sglang"  # the scenario's server: which scrape job reads its /metrics
    gpu_exporter: str = "dcgm"  # dcgm | amd: which scrape job reads its GPU exporter

    @property
    def name(self) -> str:
        return self.spec.name

    def wait_steady(self, timeout_s: float = 300.0) -> bool:
        import json  # noqa: PLC0415
        import select  # noqa: PLC0415

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            return False
        line = self.proc.stdout.readline()
        return bool(line) and bool(json.loads(line).get("steady"))


@contextlib.contextmanager
def fleet_processes(specs: list[HostSpec]) -> Iterator[list[HostProcess]]:
    """Each host of `specs` in its own process (see `_serve_one`); all stopped after the `with` block."""
    import dataclasses  # noqa: PLC0415
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    procs: list[HostProcess] = []
    try:
        for spec in specs:
            proc = subprocess.Popen([sys.executable, "-c", "import sys; from gpu_runbook.sim.fleet import _serve_one; _serve_one(sys.argv[1])",
                                     json.dumps(dataclasses.asdict(spec))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    bufsize=0)  # fmt: skip
            # unbuffered bytes: a line read takes only that line, so `wait_steady`'s select sees the next one (an idle
            # host prints it at once; a buffered reader would have taken it with the first and the select waits in vain)
            line = proc.stdout.readline() if proc.stdout else ""
            if not line:
                raise RuntimeError(f"simulated host {spec.name} did not start (exit {proc.poll()})")
            targets = json.loads(line)
            procs.append(HostProcess(spec, proc, targets["dcgm_target"], targets["server_target"], targets.get("server_kind", "sglang"),
                                     targets.get("gpu_exporter", "dcgm")))
        yield procs
    finally:
        for hp in procs:
            with contextlib.suppress(Exception):
                hp.proc.stdin.close()
        for hp in procs:
            try:
                hp.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001
                hp.proc.kill()
