"""A simulated GPU inference host for `runbook run --simulate` and `runbook test`.

One context manager starts, for exactly the duration of a run: the scenario's simulated server, SGLang or vLLM (real HTTP
on 127.0.0.1, ephemeral port), a fake NVML whose readings follow that server's load
(`gpu_runbook.sim.coupling`), and a temporary model directory holding the scenario's config.json, which
the server reports as its `model_path` so the `model.config` probe reads it like a local model.
Nothing else changes: the same probes, rules and renderers run against it.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Iterator

import pynvml as _nv

from ..amdsmi_lib import Amdsmi
from ..gpu_backend import GpuBackend
from ..nvml import Nvml
from ..target import Target, kind_title
from .coupling import LoadCoupling
from .dcgm_exporter import SimDcgmExporter
from . import fake_amdsmi
from .fake_nvml import FakeGpu, FakeHost, make_module, no_driver_box
from .profiler import register_scenario, unregister_scenario
from .scenario import ARCHITECTURE_IDS, P2P_IDS, TOPOLOGY_IDS, VIRTUALIZATION_IDS, Scenario, load_scenario
from .sglang_server import SimServer, SimServerConfig
from .vllm_server import VllmSimConfig, VllmSimServer
from .vllm_spec import VllmSpec


def raise_nofile_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit: 1024 streams need thousands of loopback sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        return soft, hard
    return want, hard


def build_fake_host(scenario: Scenario) -> FakeHost:
    """Static NVML facts from the scenario; dynamic readings are bound later by LoadCoupling."""
    g, n = scenario.gpu, scenario.gpu.count
    limit = scenario.enforced_limit_w
    default = g.power.limit_default_w or g.power.limit_max_w
    requested = scenario.faults.admin_power_cap_w or g.power.limit_enforced_w or default
    gpus: list[FakeGpu] = []
    for i in range(n):
        gpus.append(
            FakeGpu(
                name=g.model,
                uuid=f"GPU-5157{zlib.crc32(scenario.name.encode()) % 0xFFFF:04x}-{i:04x}-4e00-8000-00000000{i:04x}",
                pci_bus_id=f"00000000:{(0x18 + i * 0x11) % 0x100:02X}:00.0",
                compute_capability=g.cc,
                architecture=ARCHITECTURE_IDS[g.architecture],
                memory_total_bytes=g.memory_mib * 1024 * 1024,
                power_limit_enforced_w=limit,
                power_limit_requested_w=requested,
                power_limit_default_w=default,
                power_limit_min_w=g.power.limit_min_w,
                power_limit_max_w=g.power.limit_max_w,
                max_sm_clock_mhz=g.clocks.max_sm_mhz,
                max_mem_clock_mhz=g.clocks.max_mem_mhz,
                pcie_gen_max=g.pcie.gen,
                pcie_width_max=g.pcie.width,
                pcie_gen_current=g.pcie.gen_current or g.pcie.gen,
                pcie_width_current=g.pcie.width_current or g.pcie.width,
                nvlink_links=g.nvlink_links,
                nvlink_active=g.nvlink_active,
                virtualization_mode=VIRTUALIZATION_IDS[g.virtualization],
                gpm_supported=g.gpm.supported,
                not_supported=set(g.unsupported_calls),
            )
        )
    status = P2P_IDS[g.p2p]
    ok, ns = _nv.NVML_P2P_STATUS_OK, _nv.NVML_P2P_STATUS_NOT_SUPPORTED

    def matrix(off: int) -> list[list[int]]:
        return [[ok if i == j else off for j in range(n)] for i in range(n)]

    nvlink_status = status if g.nvlink_links > 0 and g.nvlink_active else ns
    p2p = {0: matrix(status), 1: matrix(status), 2: matrix(nvlink_status), 3: matrix(status), 4: matrix(status)}
    topo = g.topology
    levels = [
        [0 if i == j else TOPOLOGY_IDS[topo.across if topo.group_size and i // topo.group_size != j // topo.group_size else topo.level]
         for j in range(n)]
        for i in range(n)
    ]  # fmt: skip
    return FakeHost(gpus=gpus, driver_version=g.driver_version, cuda_driver_version=g.cuda_driver_version, p2p=p2p, topology=levels)


def build_fake_amd_host(scenario: Scenario) -> fake_amdsmi.FakeAmdHost:
    """Static amdsmi facts from an AMD scenario; dynamic readings are bound later by LoadCoupling (one per physical GPU)."""
    g = scenario.gpu
    assert g.amd is not None
    default = g.power.limit_default_w or g.power.limit_max_w
    gpus = [
        fake_amdsmi.FakeAmdGpu(
            index=i, market_name=g.model, gfx_target=g.amd.gfx_target, device_id=g.amd.device_id,
            memory_total_bytes=g.memory_mib * 1024 * 1024, power_cap_w=scenario.enforced_limit_w, default_power_cap_w=default,
            min_power_cap_w=g.power.limit_min_w, max_power_cap_w=g.power.limit_max_w, max_gfx_mhz=g.clocks.max_sm_mhz,
            max_mem_mhz=g.clocks.max_mem_mhz, idle_gfx_mhz=g.clocks.idle_sm_mhz, pcie_gen=g.pcie.gen, pcie_width=g.pcie.width,
            pcie_gen_current=g.pcie.gen_current or g.pcie.gen, pcie_width_current=g.pcie.width_current or g.pcie.width,
            compute_partition=g.amd.compute_partition, memory_partition=g.amd.memory_partition, driver_version=g.amd.driver_version,
        )
        for i in range(g.count)
    ]  # fmt: skip
    server = "vllm" if scenario.server.kind == "vllm" else "sglang::scheduler"
    used = g.device_memory_mib * 1024 * 1024 * 9 // 10
    procs = [{"name": server, "pid": 4242, "mem": used, "engine_usage": {"gfx": 0, "enc": 0},
              "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": used}, "cu_occupancy": "N/A"}]  # fmt: skip
    return fake_amdsmi.FakeAmdHost(gpus=gpus, xgmi=g.amd.xgmi, processes=procs, not_supported=set(g.unsupported_calls))


def server_config(scenario: Scenario, model_dir: Path) -> SimServerConfig:
    s = scenario.server
    return SimServerConfig(
        version=s.version,
        model_path=str(model_dir),
        served_model_name=s.served_model_name or s.model_path,
        model_type=s.model_type or scenario.hf_config.get("model_type"),
        architectures=s.architectures or scenario.hf_config.get("architectures"),
        context_len=s.context_len,
        server_args=dict(s.server_args),
        api_key=s.api_key,
        enable_metrics=s.enable_metrics,
        max_running_requests=s.max_running_requests,
        report_max_running_requests=s.report_max_running_requests,
        max_total_num_tokens=s.max_total_num_tokens,
        step_base_ms=s.throughput.step_base_ms,
        step_per_req_ms=s.throughput.step_per_req_ms,
        prefill_ms_per_1k_tokens=s.throughput.prefill_ms_per_1k_tokens,
        num_continuous_decode_steps=s.num_continuous_decode_steps,
        hf_config=dict(scenario.hf_config),
        hf_quant_config=scenario.hf_quant_config,
        gpu_compute_major=scenario.gpu.cc[0],
        gpu_memory_mib=scenario.gpu.device_memory_mib,
        env=dict(s.env),
        faults=scenario.faults.server,
    )


def vllm_server_config(scenario: Scenario, model_dir: Path, port: int = 0) -> VllmSimConfig:
    """The simulated vLLM server of a `kind: vllm` scenario: the common server fields and its `vllm:` launch settings."""
    s, g = scenario.server, scenario.gpu
    return VllmSimConfig(
        version=s.version, model_root=str(model_dir), served_model_name=s.served_model_name or s.model_path,
        max_model_len=s.context_len, kv_tokens=s.max_total_num_tokens, spec=s.vllm or VllmSpec(),
        gpu_memory_mib=g.device_memory_mib, gpu_name=g.model, nvlink=g.peer_fabric,
        hf_config=dict(scenario.hf_config), hf_quant_config=scenario.hf_quant_config,
        step_base_ms=s.throughput.step_base_ms, step_per_req_ms=s.throughput.step_per_req_ms,
        prefill_ms_per_1k_tokens=s.throughput.prefill_ms_per_1k_tokens, api_key=s.api_key, faults=scenario.faults.server, port=port,
    )  # fmt: skip


class SimulatedHost:
    """A running simulated host. Create it with `SimulatedHost.start(name_or_path)`."""

    def __init__(self, scenario: Scenario, server: SimServer, nvml: Nvml, fake: FakeHost, coupling: LoadCoupling, model_dir: Path,
                 amdsmi: Amdsmi | None = None, fake_amd: fake_amdsmi.FakeAmdHost | None = None) -> None:
        self.scenario = scenario
        self.server = server
        self.nvml = nvml  # an AMD scenario's NVML finds no library, as on a ROCm host
        self.amdsmi = amdsmi or Amdsmi(module=_no_amdsmi())  # an NVIDIA scenario's amdsmi is not installed
        self.gpu = GpuBackend(nvml=self.nvml, amdsmi=self.amdsmi)
        self.fake = fake
        self.fake_amd = fake_amd
        self.coupling = coupling
        self.model_dir = model_dir
        self.started = time.monotonic()
        self.dcgm_url: str | None = None  # the simulated dcgm-exporter's /metrics, when the scenario has one

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def api_key(self) -> str | None:
        return self.scenario.server.api_key

    @property
    def state(self) -> Any:
        return self.server.state

    @classmethod
    @contextlib.contextmanager
    def start(cls, name_or_path: str | Path | Scenario, port: int = 0) -> Iterator["SimulatedHost"]:
        """Start server + NVML for the `with` block; stop them and delete the model dir after.

        `port`: where the server listens on 127.0.0.1 (0: an ephemeral one; `runbook simulate --port`).

        Raises `gpu_runbook.loader.LoadError` (FILE:LINE:COL errors) when the scenario does not validate.
        """
        scenario = name_or_path if isinstance(name_or_path, Scenario) else load_scenario(name_or_path)
        raise_nofile_limit()
        model_dir = Path(tempfile.mkdtemp(prefix=f"runbook-sim-{scenario.name}-"))
        server: SimServer | None = None
        nvml: Nvml | None = None
        amdsmi: Amdsmi | None = None
        dcgm: SimDcgmExporter | None = None
        try:
            (model_dir / "config.json").write_text(json.dumps(scenario.hf_config, indent=2), encoding="utf-8")
            if scenario.hf_quant_config is not None:
                (model_dir / "hf_quant_config.json").write_text(json.dumps(scenario.hf_quant_config, indent=2), encoding="utf-8")
            server = (VllmSimServer(vllm_server_config(scenario, model_dir, port))) if scenario.server.kind == "vllm" \
                else SimServer(server_config(scenario, model_dir).model_copy(update={"port": port}))
            register_scenario(server.state, scenario)
            amd = scenario.gpu.vendor == "amd"
            fake = no_driver_box() if amd else build_fake_host(scenario)
            fake_amd = build_fake_amd_host(scenario) if amd else None
            coupling = LoadCoupling(scenario, server.state)
            coupling.bind(fake_amd.gpus if fake_amd is not None else fake.gpus)  # type: ignore[arg-type]
            server.state.step_scale_fn = coupling.step_scale
            nvml = Nvml(module=make_module(fake))
            amdsmi = Amdsmi(module=fake_amdsmi.make_module(fake_amd)) if fake_amd is not None else None
            server.start()
            coupling.t0 = time.monotonic()  # faults' after_s count from when the host answers
            if scenario.dcgm_exporter is not None:
                dcgm = SimDcgmExporter(lambda: dcgm_rows(scenario, fake, coupling), scenario.dcgm_exporter.interval_s)
                dcgm.start()
            host = cls(scenario, server, nvml, fake, coupling, model_dir, amdsmi, fake_amd)
            host.dcgm_url = dcgm.url if dcgm is not None else None
            yield host
        finally:
            if dcgm is not None:
                dcgm.stop()
            if server is not None:
                server.stop()
                unregister_scenario(server.state)
            if nvml is not None:
                with contextlib.suppress(Exception):
                    nvml.shutdown()
            if amdsmi is not None:
                with contextlib.suppress(Exception):
                    amdsmi.shutdown()
            shutil.rmtree(model_dir, ignore_errors=True)

    def target(self) -> Target:
        """The target a run investigates: this host's server (and dcgm-exporter), its simulated GPUs."""
        vendor = self.scenario.gpu.vendor
        return Target(server_url=self.url, api_key=self.api_key, label=f"simulated: {self.name}", simulated=True,
                      gpu_backend="simulated", dcgm_url=self.dcgm_url, server_kind=self.scenario.server.kind,
                      server_found=f"the simulated {kind_title(self.scenario.server.kind)} server of scenario {self.name}",
                      gpu_vendor=vendor,
                      gpu_found=f"the simulated {'amdsmi' if vendor == 'amd' else 'NVML'} of scenario {self.name}")  # fmt: skip

    def report(self) -> dict[str, Any]:
        """What the simulator did and what it cost (its CPU is not the host's: acceptance 4)."""
        st = self.server.state
        return {
            "scenario": self.scenario.name,
            "title": self.scenario.title,
            "server_cpu_seconds": round(self.server.cpu_seconds(), 3),
            "wall_seconds": round(time.monotonic() - self.started, 3),
            "requests_served": st.completed_requests,
            "requests_aborted": st.aborted_requests,
            "generation_tokens": st.generation_tokens_total,
            "peak_running": st.peak_running,
            "peak_queued": st.peak_queued,
            "retracted_requests": st.retracted_requests_total,
        }


def _no_amdsmi() -> Any:
    """What `import amdsmi` gives on a host without it: the backend's amdsmi says "not installed"."""
    from ..amdsmi_lib import AmdsmiUnavailable  # noqa: PLC0415

    class _Missing:
        def __getattr__(self, name: str) -> Any:
            raise AmdsmiUnavailable("ModuleNotFoundError", "not installed")

    return _Missing()


def dcgm_rows(scenario: Scenario, fake: FakeHost, coupling: LoadCoupling) -> list[dict[str, Any]]:
    """One dcgm-exporter collection: each GPU's reading now, PROF activity scaled by the load."""
    spec = scenario.dcgm_exporter
    assert spec is not None
    now = time.monotonic()
    f = coupling.load_fraction(now)
    rows = []
    for i, gpu in enumerate(fake.gpus):
        r = gpu.reading(now)
        rows.append({
            "gpu": i, "uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id, "model": gpu.name,
            "DCGM_FI_DEV_POWER_USAGE": round(r.power_w, 3), "DCGM_FI_DEV_GPU_UTIL": r.gpu_util_pct,
            "DCGM_FI_DEV_SM_CLOCK": r.sm_clock_mhz, "DCGM_FI_DEV_MEM_CLOCK": r.mem_clock_mhz,
            "DCGM_FI_PROF_DRAM_ACTIVE": round(spec.dram_active * f, 4),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(spec.pipe_tensor_active * f, 4),
        })  # fmt: skip
    return rows
