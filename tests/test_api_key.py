"""The API key goes to the SGLang server and nowhere else, and never into results."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpu_runbook.probe import Target
from gpu_runbook.runner import Runner
from gpu_runbook.sim.sglang_server import SimServer, SimServerConfig

SEEN: list[dict[str, str]] = []


class Exporter(BaseHTTPRequestHandler):
    """A stand-in dcgm-exporter on 127.0.0.1 that records the headers it was sent."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        SEEN.append(dict(self.headers))
        body = b'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-1",modelName="H200"} 650.0\n'
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_key_reaches_sglang_but_not_other_endpoints(load_runbook, registry, tmp_path):
    exporter = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    SEEN.clear()
    try:
        loaded = load_runbook(f"""
            name: keys
            title: t
            hypotheses:
              - id: both
                title: both endpoints answer
                probes:
                  server: {{ probe: sglang.server }}
                  dcgm: {{ probe: gpu.dcgm, with: {{ url: "http://127.0.0.1:{exporter.server_port}/metrics" }} }}
                confirm: server.tp_size >= 1.0 && dcgm.gpu_count == 1.0
        """)
        with SimServer(SimServerConfig(api_key="sk-secret")) as server:
            results = asyncio.run(Runner(loaded, registry, Target(sglang_url=server.url, api_key="sk-secret")).run())
    finally:
        exporter.shutdown()
    assert results.by_id("both").verdict.value == "confirmed", results.by_id("both").reason
    assert SEEN and all("Authorization" not in headers for headers in SEEN)
    assert "sk-secret" not in results.model_dump_json()
