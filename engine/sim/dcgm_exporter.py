"""A dcgm-exporter for the simulated host: DCGM fields per GPU, refreshed at its collect interval.

dcgm-exporter serves what it last collected and collects every `-c` milliseconds, 30000 by default
(shared/reference/nvml.md §4.2): a 15 s window scraped every second sees one reading, maybe two.
The simulated one keeps exactly that behaviour, so a rule that decides on one stale reading fails
here as it would on a real host. Its values follow the same coupling as the fake NVML: power,
clocks and utilization from the GPU readings, the PROF activity ratios from the scenario's GPM
figures scaled by the load.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

FIELDS = (  # (name, type, help) as dcgm-exporter's default counters file names them
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active sending or receiving data."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
)


def render(rows: list[dict[str, Any]]) -> str:
    """Prometheus text with dcgm-exporter's labels (gpu, UUID, pci_bus_id, device, modelName, Hostname)."""
    out: list[str] = []
    for name, kind, help_ in FIELDS:
        out.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}\n")
        for r in rows:
            labels = (f'gpu="{r["gpu"]}",UUID="{r["uuid"]}",pci_bus_id="{r["pci_bus_id"]}",device="nvidia{r["gpu"]}",'
                      f'modelName="{r["model"]}",Hostname="sim"')  # fmt: skip
            out.append(f"{name}{{{labels}}} {r[name]}\n")
    return "".join(out)


class SimDcgmExporter:
    """Serves `/metrics` on 127.0.0.1 (ephemeral port); `collect()` is called at most every `interval_s`."""

    def __init__(self, collect: Callable[[], list[dict[str, Any]]], interval_s: float) -> None:
        self.collect, self.interval_s = collect, interval_s
        self._text, self._at = "", float("-inf")
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    def text(self) -> str:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.interval_s:  # a new collection; between them the last one is served
                self._text, self._at = render(self.collect()), now
            return self._text

    def start(self) -> str:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="dcgm-sim", daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/metrics"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
