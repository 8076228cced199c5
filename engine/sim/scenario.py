"""Scenario files for the simulated host: one YAML file describes a GPU box, its SGLang server and its faults.

A scenario is data, not code, so a runbook author can describe a host they have seen (the seeds' 8x RTX
PRO 6000 in a KVM guest) and test rules against it. Files are validated by pydantic and every problem
is reported as `FILE:LINE:COL: message`, like runbooks (`gpu_runbook.loader.schema_errors`).

The dynamic physics (how power, clocks and PCIe follow the load) lives in `gpu_runbook.sim.coupling`; this
module only says what the knobs are and checks they make sense together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .. import yamlpos
from ..loader import LoadError, bundled_dir, schema_errors
from ..model import ID_PATTERN
from ..nvml import CLOCK_EVENT_REASONS
from ..yamlpos import SourceError
from .faults import SimFaults
from .sglang_info import unsupported_architecture
from .vllm_spec import VllmSpec

EVENT_REASON_BITS = CLOCK_EVENT_REASONS  # the names gpu.sample reports
ReasonName = Literal[
    "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
    "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting",
]  # fmt: skip
Architecture = Literal["kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell", "rubin"]
ARCHITECTURE_IDS: dict[str, int] = {
    "kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7, "ada": 8,
    "hopper": 9, "blackwell": 10, "rubin": 13,
}  # fmt: skip
Virtualization = Literal["none", "passthrough", "vgpu", "host_vgpu", "host_vsga"]
VIRTUALIZATION_IDS: dict[str, int] = {"none": 0, "passthrough": 1, "vgpu": 2, "host_vgpu": 3, "host_vsga": 4}
# nvidia-smi's names for nvmlDeviceGetTopologyCommonAncestor levels and nvmlDeviceGetP2PStatus results.
TopologyLevel = Literal["PIX", "PXB", "PHB", "NODE", "SYS"]
TOPOLOGY_IDS: dict[str, int] = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
P2pStatus = Literal["OK", "CNS", "GNS", "TNS", "DR", "NS", "U"]
P2P_IDS: dict[str, int] = {"OK": 0, "CNS": 1, "GNS": 2, "TNS": 3, "DR": 4, "NS": 5, "U": 6}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, protected_namespaces=())


class PowerSpec(Strict):
    """Limits as NVML reports them, and the draw curve: idle -> loaded, saturating with the batch."""

    limit_max_w: float = Field(gt=0, description="Board maximum (nvmlDeviceGetPowerManagementLimitConstraints max).")
    limit_min_w: float = Field(ge=0, description="The lowest limit the board allows (amd-smi can show 0 W).")
    limit_default_w: float | None = Field(None, description="Default: limit_max_w.")
    limit_enforced_w: float | None = Field(None, description="Default: limit_default_w (faults.admin_power_cap_w overrides).")
    idle_w: float = Field(gt=0)
    loaded_w: float = Field(gt=0, description="What the load asks for at saturation, before any power cap.")
    batch_scale: float = Field(64.0, gt=0, description="Running requests at which draw is 63 % of the way from idle to loaded.")
    jitter_pct: float = Field(0.5, ge=0, le=10)

    @model_validator(mode="after")
    def _consistent(self) -> "PowerSpec":
        if self.limit_min_w > self.limit_max_w:
            raise ValueError(f"limit_min_w {self.limit_min_w} is above limit_max_w {self.limit_max_w}")
        for name in ("limit_default_w", "limit_enforced_w"):
            v = getattr(self, name)
            if v is not None and not self.limit_min_w <= v <= self.limit_max_w:
                raise ValueError(f"{name} {v} is outside [{self.limit_min_w}, {self.limit_max_w}]")
        if self.idle_w > self.loaded_w:
            raise ValueError(f"idle_w {self.idle_w} is above loaded_w {self.loaded_w}")
        return self


class ClockSpec(Strict):
    max_sm_mhz: int = Field(gt=0)
    max_mem_mhz: int = Field(gt=0)
    idle_sm_mhz: int = Field(210, gt=0)
    idle_mem_mhz: int = Field(405, gt=0, description="Memory clock in the idle P-state (P8).")
    loaded_pstate: int = Field(0, ge=0, le=15, description="P-state under load (a Workstation card runs compute at P1).")
    loaded_sm_mhz: int = Field(gt=0, description="SM clock under load when nothing throttles.")
    mem_mhz: int | None = Field(None, description="Default: max_mem_mhz.")

    @model_validator(mode="after")
    def _consistent(self) -> "ClockSpec":
        if self.loaded_sm_mhz > self.max_sm_mhz:
            raise ValueError(f"loaded_sm_mhz {self.loaded_sm_mhz} is above max_sm_mhz {self.max_sm_mhz}")
        return self


class TemperatureSpec(Strict):
    idle_c: int = 32
    loaded_c: int = 60


class EventReasonSpec(Strict):
    """Reasons always set in each state (throttling faults and the power limit add their own)."""

    idle: list[ReasonName] = Field(default_factory=lambda: ["gpu_idle"])
    loaded: list[ReasonName] = Field(default_factory=list)


class PcieSpec(Strict):
    gen: int = Field(5, ge=1, le=6)
    width: int = Field(16, ge=1, le=32)
    gen_current: int | None = Field(None, ge=1, le=6, description="Default: gen (a degraded link reports less).")
    width_current: int | None = Field(None, ge=1, le=32)
    idle_link_share: float = Field(0.0005, ge=0, le=1, description="Fraction of the link used per direction at idle.")
    loaded_link_share: float = Field(0.01, ge=0, le=1, description="... at saturation (host<->device traffic; TP all-reduce bytes come on top).")
    host_staging_factor: float = Field(1.5, ge=1, description="All-reduce bytes on the link per payload byte when P2P is unavailable (estimate).")


class TopologySpec(Strict):
    """Common ancestor of every GPU pair; with group_size, pairs across groups get `across`."""

    level: TopologyLevel = "PHB"
    group_size: int | None = Field(None, ge=1)
    across: TopologyLevel = "SYS"


class GpmLoaded(Strict):
    sm_util_pct: float = Field(90.0, ge=0, le=100)
    sm_occupancy_pct: float = Field(40.0, ge=0, le=100)
    tensor_util_pct: float = Field(50.0, ge=0, le=100)
    dram_bw_util_pct: float = Field(50.0, ge=0, le=100)


class GpmSpec(Strict):
    supported: bool = False
    loaded: GpmLoaded = Field(default_factory=GpmLoaded)


ComputePartition = Literal["SPX", "DPX", "QPX", "CPX"]
# Partitions per GPU in each compute mode on an 8-XCD MI300X (CDNA 3 white paper: SPX 8 XCDs ... CPX 8 x 1 XCD; amd.md §1.4).
PARTITIONS_PER_GPU: dict[str, int] = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}


class AmdSpec(Strict):
    """What only an AMD Instinct box says through amdsmi: its graphics target, partition modes, XGMI and driver."""

    gfx_target: str = Field("gfx942", description="amdsmi_get_gpu_asic_info target_graphics_version (MI300X, MI325X: gfx942).")
    device_id: str = Field("0x74a1", description="PCI device id (MI300X 0x74a1, MI325X 0x74a5: amd.md §3).")
    compute_partition: ComputePartition = Field("SPX", description="amdsmi_get_gpu_compute_partition: each GPU shows as this many devices.")
    memory_partition: Literal["NPS1", "NPS4"] = Field("NPS1", description="amdsmi_get_gpu_memory_partition (NPS4 needs 4 or more partitions).")
    xgmi: bool = Field(True, description="Every GPU pair linked over XGMI (amdsmi_topo_get_link_type type 2); False: PCIe only.")
    driver_version: str = Field("6.12.12", description="amdsmi_get_gpu_driver_info driver_version (the amdgpu driver).")

    @model_validator(mode="after")
    def _nps(self) -> "AmdSpec":
        if self.memory_partition == "NPS4" and PARTITIONS_PER_GPU[self.compute_partition] < 4:
            raise ValueError(f"memory_partition NPS4 needs 4 or more compute partitions, not {self.compute_partition}")
        return self


class GpuSpec(Strict):
    vendor: Literal["nvidia", "amd"] = Field("nvidia", description="Whose library the host has: NVML (nvidia) or amdsmi (amd).")
    model: str = Field(description="nvmlDeviceGetName ('NVIDIA H200') or amdsmi's market_name ('AMD Instinct MI300X').")
    count: int = Field(8, ge=1, le=64, description="Physical GPUs (an AMD partition mode shows each as several devices).")
    compute_capability: str = Field(
        pattern=r"^\d+\.\d+$", description="e.g. '12.0'; on AMD what PyTorch on ROCm reports as the device's capability (gfx942: '9.4').")
    architecture: Architecture | None = Field(None, description="nvmlDeviceGetArchitecture, named (NVIDIA only).")
    amd: AmdSpec | None = Field(None, description="vendor: amd only: partition modes, XGMI, graphics target.")
    memory_mib: int = Field(gt=0)
    driver_version: str = "595.58.03"
    cuda_driver_version: int = 13020
    power: PowerSpec
    clocks: ClockSpec
    temperature: TemperatureSpec = Field(default_factory=TemperatureSpec)
    idle_util_pct: int = Field(0, ge=0, le=100)
    loaded_util_pct: int = Field(100, ge=0, le=100, description="Utilization whenever requests are running.")
    loaded_mem_util_pct: int = Field(50, ge=0, le=100)
    event_reasons: EventReasonSpec = Field(default_factory=EventReasonSpec)
    pcie: PcieSpec = Field(default_factory=PcieSpec)
    nvlink_links: int = Field(0, ge=0, le=18, description="0: no NVLink (nvmlDeviceGetNvLinkState says NotSupported).")
    nvlink_active: bool = True
    p2p: P2pStatus = Field("OK", description="P2P read/write status for every pair (nvidia-smi topo -p2p names).")
    topology: TopologySpec = Field(default_factory=TopologySpec)
    virtualization: Virtualization = "none"
    gpm: GpmSpec = Field(default_factory=GpmSpec)
    unsupported_calls: list[str] = Field(default_factory=list, description="NVML functions (amdsmi functions on AMD) that raise NotSupported.")

    @model_validator(mode="after")
    def _vendor(self) -> "GpuSpec":
        if self.vendor == "nvidia" and self.architecture is None:
            raise ValueError("architecture is required for an NVIDIA GPU (nvmlDeviceGetArchitecture)")
        if self.vendor == "nvidia" and self.amd is not None:
            raise ValueError("amd: is for vendor: amd only")
        if self.vendor == "amd" and self.amd is None:
            self.amd = AmdSpec()
        return self

    @property
    def cc(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def partitions(self) -> int:
        """Devices each physical GPU shows as (1 on NVIDIA and in SPX)."""
        return PARTITIONS_PER_GPU[self.amd.compute_partition] if self.amd is not None else 1

    @property
    def visible_count(self) -> int:
        """Devices the host lists: physical GPUs times their partitions."""
        return self.count * self.partitions

    @property
    def device_memory_mib(self) -> int:
        """Memory of one visible device (a partition gets its share)."""
        return self.memory_mib // self.partitions

    @property
    def peer_fabric(self) -> bool:
        """The GPUs reach each other over a fabric (NVLink, XGMI), not PCIe: all-reduce leaves the host link alone."""
        if self.amd is not None:
            return self.amd.xgmi
        return self.nvlink_links > 0 and self.nvlink_active


class ThroughputSpec(Strict):
    """The batch model: each decode step lasts step_base_ms + step_per_req_ms * batch (+ prefill)."""

    step_base_ms: float = Field(20.0, gt=0)
    step_per_req_ms: float = Field(0.05, ge=0)
    prefill_ms_per_1k_tokens: float = Field(2.0, ge=0)
    eager_gap_ms: float = Field(6.0, ge=0, description="Per-step time with no kernel running when the step runs eagerly (launch gaps).")
    graph_gap_ms: float = Field(0.3, ge=0, description="... when the decode step replays a CUDA graph.")


class ServerSpec(Strict):
    kind: Literal["sglang", "vllm"] = Field("sglang", description="The server the host runs: SGLang, or vLLM (then `vllm:` says how it was launched).")
    vllm: VllmSpec | None = Field(None, description="vLLM's launch settings (kind: vllm); version is a vLLM release.")
    version: str = "0.5.5.post3"
    model_path: str = Field(description="The model's name (served_model_name); the server reports the temp dir as model_path.")
    served_model_name: str | None = None
    model_type: str | None = None
    architectures: list[str] | None = None
    context_len: int = Field(40960, gt=0)
    api_key: str | None = None
    enable_metrics: bool = True
    max_running_requests: int = Field(1024, ge=1, description="--max-running-requests (the scheduler bounds it by its req pool).")
    report_max_running_requests: bool = Field(True, description="False: the flag is unset; the scheduler uses its default cap.")
    max_total_num_tokens: int = Field(389120, ge=1, description="KV-cache capacity in tokens.")
    num_continuous_decode_steps: int = Field(1, ge=1)
    server_args: dict[str, Any] = Field(default_factory=dict, description="The flags passed, 0.5.5 names (the server resolves the rest).")
    env: dict[str, str] = Field(default_factory=dict, description="SGLANG_* environment the server runs with.")
    throughput: ThroughputSpec = Field(default_factory=ThroughputSpec)


class SlowdownFault(Strict):
    """A clock slowdown that starts `after_s` into the run and is active `duty` of the time."""

    after_s: float = Field(0.0, ge=0)
    duty: float = Field(1.0, gt=0, le=1)
    sm_clock_ratio: float = Field(gt=0, le=1, description="SM clock while active, as a fraction of max_sm_mhz.")
    temperature_c: int | None = None
    hw: bool = Field(True, description="Thermal only: also set hw_thermal_slowdown (not only the sw one).")


class DcgmExporterSpec(Strict):
    """A dcgm-exporter beside the server (its own port on 127.0.0.1), collecting every `interval_s`."""

    interval_s: float = Field(30.0, gt=0, description="dcgm-exporter's -c / DCGM_EXPORTER_INTERVAL (default 30000 ms).")
    dram_active: float = Field(0.6, ge=0, le=1, description="DCGM_FI_PROF_DRAM_ACTIVE at full load (scaled by the load).")
    pipe_tensor_active: float = Field(0.05, ge=0, le=1, description="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE at full load.")


class Faults(Strict):
    thermal_slowdown: SlowdownFault | None = None
    power_brake: SlowdownFault | None = Field(None, description="hw_power_brake_slowdown (an external brake signal).")
    admin_power_cap_w: float | None = Field(None, gt=0, description="`nvidia-smi -pl`: the enforced and requested limit.")
    power_cap_duty: float = Field(0.85, gt=0, le=1, description="Share of capped samples that show sw_power_cap.")
    server: SimFaults = Field(default_factory=SimFaults, description="status_code, delay_s, stop_answering_after_s...")
    profile_dir_hidden: bool = Field(
        False, description="The server runs in a container: /start_profile traces land in its own filesystem, not where the probe reads.",
    )


class Scenario(Strict):
    name: str = Field(pattern=ID_PATTERN)
    title: str
    about: str = Field("", description="One line: which host (or which moment of the seeds) this is; `runbook scenarios` prints it.")
    description: str = ""
    gpu: GpuSpec
    server: ServerSpec
    hf_config: dict[str, Any] = Field(default_factory=dict, alias="model_config", description="The model's config.json.")
    hf_quant_config: dict[str, Any] | None = Field(None, description="hf_quant_config.json, when the model has one.")
    faults: Faults = Field(default_factory=Faults)
    dcgm_exporter: DcgmExporterSpec | None = Field(None, description="Serve a dcgm-exporter too (the target's dcgm_url).")

    @model_validator(mode="after")
    def _cap_within_limits(self) -> "Scenario":
        cap, p = self.faults.admin_power_cap_w, self.gpu.power
        if cap is not None and not p.limit_min_w <= cap <= p.limit_max_w:
            raise ValueError(f"faults.admin_power_cap_w {cap} is outside the board's [{p.limit_min_w}, {p.limit_max_w}] W")
        return self

    @property
    def enforced_limit_w(self) -> float:
        p = self.gpu.power
        if self.faults.admin_power_cap_w is not None:
            return self.faults.admin_power_cap_w
        return p.limit_enforced_w or p.limit_default_w or p.limit_max_w


# ---------------------------------------------------------------------------------------------


def scenario_dirs() -> list[Path]:
    """./runbooks/scenarios first (a user's own shadows the bundled one), then the bundled ones."""
    dirs: list[Path] = []
    for d in (Path.cwd() / "runbooks" / "scenarios", bundled_dir("runbooks") / "scenarios"):
        if d.is_dir() and d.resolve() not in [x.resolve() for x in dirs]:
            dirs.append(d)
    return dirs


def available_scenarios() -> dict[str, Path]:
    """Scenario name (file stem) -> file."""
    found: dict[str, Path] = {}
    for d in scenario_dirs():
        for f in sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml")):
            found.setdefault(f.stem, f)
    return found


def find_scenario(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml"} or path.exists():
        if not path.is_file():
            raise SourceError(str(name_or_path), None, "no such scenario file")
        return path
    found = available_scenarios()
    if str(name_or_path) in found:
        return found[str(name_or_path)]
    names = ", ".join(sorted(found)) or "none"
    raise SourceError(str(name_or_path), None, f"no scenario named '{name_or_path}' (available: {names})")


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A bundled scenario by name, or a file. Raises LoadError with FILE:LINE:COL errors."""
    try:
        path = find_scenario(name_or_path)
        doc = yamlpos.load(path)
    except SourceError as exc:
        raise LoadError([exc]) from None
    if not isinstance(doc.data, dict):
        raise LoadError([doc.error((), "a scenario must be a mapping with name, title, gpu and server")])
    data = dict(doc.data)
    data.setdefault("name", path.stem)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise LoadError(schema_errors(doc, exc)) from None
    archs = scenario.server.architectures or scenario.hf_config.get("architectures")
    why = unsupported_architecture(scenario.server.version, archs) if scenario.server.kind == "sglang" else None
    if why is not None:
        raise LoadError([doc.error(("server", "version"), f"server.version: {why}")])
    if scenario.server.kind == "vllm" and scenario.server.vllm is not None:
        from .vllm_profiler_config import vllm_profiler_problem  # noqa: PLC0415 - the release's profiler settings, read in its wheels

        why = vllm_profiler_problem(scenario.server.version, scenario.server.vllm)
        if why is not None:
            at = ("server", "vllm", "profiler_config") if scenario.server.vllm.profiler_config else ("server", "vllm", "env")
            raise LoadError([doc.error(at, f"server.vllm: {why}")])
    return scenario


def scenario_with(name_or_path: str, changes: dict[str, Any]) -> Any:
    """The scenario with an entry's `scenario_set` applied (dotted paths into the scenario file's fields).
    Raises ValueError naming the field when a path does not exist or the value does not validate."""
    from pydantic import ValidationError as _VE  # noqa: PLC0415

    scenario = load_scenario(name_or_path)
    if not changes:
        return scenario
    data = scenario.model_dump(by_alias=True)
    for dotted, value in changes.items():
        node, parts = data, str(dotted).split(".")
        for part in parts[:-1]:
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"scenario_set: '{dotted}': the scenario has no field '{part}'")
            node = node[part] if node[part] is not None else node.setdefault(part, {})
        if not isinstance(node, dict) or (parts[-1] not in node and parts[-1] not in ("server_args", "env")):
            raise ValueError(f"scenario_set: '{dotted}': the scenario has no field '{parts[-1]}'")
        node[parts[-1]] = value
    try:
        return Scenario.model_validate(data)
    except _VE as exc:
        first = exc.errors()[0]
        raise ValueError(f"scenario_set: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
