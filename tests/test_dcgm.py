"""gpu.dcgm against a real HTTP server on 127.0.0.1 serving dcgm-exporter text (nvml.md §4.2 layout)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from gpu_runbook.nvml import Nvml
from gpu_runbook.probe import Context
from gpu_runbook.target import Target
from gpu_runbook.probes.gpu.dcgm import DcgmExporter, DcgmParams, parse_dcgm


def _labels(gpu: int, host_label: str = "Hostname", uuid_label: str = "UUID") -> str:
    return (f'gpu="{gpu}",{uuid_label}="GPU-e588912b-1368-6b4f-0e2a-0d08f8afb3{gpu:02x}",'
            f'pci_bus_id="00000000:{0x06 + gpu * 0x10:02X}:00.0",device="nvidia{gpu}",'
            f'modelName="NVIDIA RTX PRO 6000 Blackwell Server Edition",{host_label}="inference-01",'
            f'DCGM_FI_DRIVER_VERSION="595.58.03"')


def exporter_text() -> str:
    # GPU 0 in the old label spelling, GPU 1 in the new one (lower-case hostname, -o uuid).
    l0, l1 = _labels(0), _labels(1, "hostname", "uuid")
    rows = {
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."): ("235.412000", "245.588000"),
        ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "Enforced power limit (in W)."): ("600.000000", "600.000000"),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "gauge", "Max power limit (in W)."): ("600.000000", "600.000000"),
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."): ("2400", "2385"),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."): ("100", "100"),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."):
            ("0.041200", "0.038800"),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."):
            ("0.610000", "0.590000"),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus."):
            ("6300000000", "6100000000"),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."):
            ("129931554972", "129931554000"),
    }
    out = []
    for (name, kind, help_), (v0, v1) in rows.items():
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{l0}}} {v0}", f"{name}{{{l1}}} {v1}"]
    out.append("# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 12")
    return "\n".join(out) + "\n"


class _Server:
    def __init__(self, body: str, status: int = 200) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_a) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        outer.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers: list[_Server] = []

    def start(body: str, status: int = 200) -> str:
        servers.append(_Server(body, status))
        return servers[-1].url

    yield start
    for s in servers:
        s.close()


async def run(url: str):
    async with httpx.AsyncClient() as http:
        ctx = Context(target=Target(), http=http, nvml=Nvml())
        return await DcgmExporter().run(ctx, DcgmParams(url=url, request_timeout_s=2))


async def test_scrape_per_gpu_values_and_aggregates(serve):
    ev = await run(serve(exporter_text()))
    v = ev.values
    assert ev.ok, ev.reason
    assert v["gpu_count"] == 2
    assert v["prof_available"] is True
    g0, g1 = v["gpus"]
    assert g0["uuid"].startswith("GPU-e588912b") and g1["uuid"].startswith("GPU-e588912b")  # UUID and uuid
    assert g0["hostname"] == g1["hostname"] == "inference-01"  # Hostname and hostname
    assert g0["pci_bus_id"] == "00000000:06:00.0" and g0["driver_version"] == "595.58.03"
    assert g0["power_usage_w"] == 235.412 and g0["power_limit_enforced_w"] == 600.0
    assert g0["draw_to_enforced_limit"] == pytest.approx(0.392353, abs=1e-6)
    assert g1["sm_clock_mhz"] == 2385.0
    assert g0["total_energy_mj"] == 129931554972
    assert g0["prof_pcie_tx_bytes_per_s"] == 6.3e9
    # (235.412 + 245.588) / 2 = 240.5 W; p95 of two values = 235.412 + 0.95 x 10.176
    assert v["power_usage_w"]["mean"] == pytest.approx(240.5)
    assert v["power_usage_w"]["p95"] == pytest.approx(245.0792)
    assert v["draw_to_enforced_limit"]["mean"] == pytest.approx(240.5 / 600, abs=1e-6)
    assert v["prof_pipe_tensor_active"]["mean"] == pytest.approx(0.04)
    assert v["prof_dram_active"]["max"] == pytest.approx(0.61)
    assert v["prof_sm_active"] is None and v["prof_sm_occupancy"] is None  # disabled by default in dcgm-exporter
    assert v["power_limit_enforced_w"] == 600.0
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in v["metrics"] and "go_goroutines" not in v["metrics"]
    assert ev.blocks[0].kind == "bars" and ev.blocks[0].bars[1] == ("GPU 1", 245.588, 600.0)
    assert "tensor pipe active 4.0%" in ev.summary


async def test_unreachable_is_unavailable(refused_port: int):
    port = refused_port
    ev = await run(f"http://127.0.0.1:{port}/metrics")
    assert ev.status.value == "unavailable"
    assert "not reachable" in ev.reason and str(port) in ev.reason


async def test_http_error_and_non_dcgm_text_are_unavailable(serve):
    ev = await run(serve("nope", status=503))
    assert ev.status.value == "unavailable" and "HTTP 503" in ev.reason
    ev = await run(serve("# TYPE up gauge\nup 1\n"))
    assert ev.status.value == "unavailable" and "no per-GPU DCGM_FI_*" in ev.reason


def test_parse_mig_rows_are_kept_apart():
    text = ('DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-63bc",device="nvidia2",modelName="NVIDIA A30",'
            'GPU_I_PROFILE="1g.6gb",GPU_I_ID="3",hostname="h"} 2207\n'
            'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="2",UUID="GPU-63bc",GPU_I_ID="3"} 0.5\n'
            'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="2",UUID="GPU-63bc",GPU_I_ID="4"} 0.25\n')
    gpus, seen = parse_dcgm(text)
    assert set(gpus) == {"2/3", "2/4"}
    assert gpus["2/3"]["prof_gr_engine_active"] == 0.5 and gpus["2/4"]["gpu_instance_id"] == "4"
    assert seen == ["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]  # FB_FREE is not one this probe reads
