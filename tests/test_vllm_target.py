"""One target, either server: the server kind is detected from what it answers, a runbook's server probes
resolve to the family that speaks its API, and a server that is neither says so and measures nothing.

Real servers only, on 127.0.0.1 with ephemeral ports: the simulated SGLang and vLLM servers, and a plain
aiohttp server that is neither.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.probe import Context
from gpu_runbook.registry import NOT_FOR_SERVER, Registry
from gpu_runbook.server_kind import detect
from gpu_runbook.sim.sglang_server import SimServer
from gpu_runbook.sim.vllm_server import VllmSimConfig, VllmSimServer
from gpu_runbook.target import Target

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "gpu_runbook.cli"]


class PlainServer:
    """Any HTTP server: `/` answers a page, everything else 404 (aiohttp's own)."""

    def __init__(self) -> None:
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        app = web.Application()
        async def page(request: web.Request) -> web.Response:
            return web.Response(text="<html>hello</html>", content_type="text/html")

        app.router.add_get("/", page)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = "http://127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> "PlainServer":
        self._thread.start()
        assert self._ready.wait(15)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)


def test_detects_sglang_vllm_and_neither():
    with SimServer() as sglang, VllmSimServer(VllmSimConfig()) as vllm, PlainServer() as plain:
        assert detect(sglang.url).kind == "sglang"
        found = detect(vllm.url)
        assert found.kind == "vllm" and "owned_by vllm" in found.found
        neither = detect(plain.url)
        assert neither.kind == "unknown"
        assert "neither as SGLang nor as vLLM" in neither.found and "/v1/models HTTP 404" in neither.found
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert detect(f"http://127.0.0.1:{port}").found.startswith("nothing answered")


def test_a_probe_resolves_to_its_role_for_the_server_kind():
    reg = Registry.discover([])
    assert reg.for_target("sglang.metrics", "vllm") is reg.probes["vllm.metrics"]
    assert reg.for_target("sglang.sweep", "vllm") is reg.probes["vllm.sweep"]
    assert reg.for_target("vllm.server", "sglang") is reg.probes["sglang.server"]
    assert reg.for_target("sglang.metrics", None) is reg.probes["sglang.metrics"]
    assert reg.for_target("gpu.sample", "vllm") is reg.probes["gpu.sample"]  # not a server probe: itself
    assert reg.for_target("sglang.profile", "vllm") is reg.probes["vllm.profile"]

    class OnlySglang(reg.probes["sglang.health"]):  # a role no vLLM probe has
        name, role = "sglang.only", "server.only"

    reg.add(OnlySglang, "test")
    stand_in = reg.for_target("sglang.only", "vllm")
    assert stand_in.name == "sglang.only" and stand_in.Params is OnlySglang.Params
    ev = asyncio.run(stand_in().run(None, None))  # type: ignore[arg-type]
    assert ev.status is ProbeStatus.unavailable and ev.reason.startswith(NOT_FOR_SERVER)
    # a server that is neither: the probes the runbook names run, and say themselves what they could not read
    assert reg.for_target("sglang.metrics", "unknown") is reg.probes["sglang.metrics"]


def test_load_goes_to_v1_completions_on_vllm():
    from gpu_runbook.load import LoadConfig, LoadGenerator

    async def go(url: str) -> tuple[str, int]:
        gen = LoadGenerator(Target(sglang_url=url, server_kind="vllm"), LoadConfig(concurrency=4, input_len=16, output_len=8, max_requests=8))
        rep = await gen.run()
        return gen.config.endpoint, rep.completed

    with VllmSimServer(VllmSimConfig(step_base_ms=5)) as vllm:
        endpoint, completed = asyncio.run(go(vllm.url))
    assert endpoint == "completions" and completed == 8


def _nvml_present() -> bool:
    import ctypes.util  # noqa: PLC0415

    return ctypes.util.find_library("nvidia-ml") is not None or Path("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists()


def test_a_server_that_is_neither_says_what_it_found_and_measures_nothing(tmp_path):
    """Acceptance 4: the run says what answered and which probes it could not run, and exits 3 (README: nothing measured)."""
    if _nvml_present():
        pytest.skip("this machine has an NVIDIA driver: the GPU probes measure something")
    env = {**os.environ, "RUNBOOK_NO_TUI": "1"}
    with PlainServer() as plain:
        proc = subprocess.run(
            CLI + ["run", "power-starvation", "--no-tui", "--server-url", plain.url, "--set", "sample_seconds=1",
                   "--set", "generate_load=false", "--json", "r.json", "--report", "r.md"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    assert "nothing could be measured" in proc.stderr
    assert "neither as SGLang nor as vLLM" in out  # what it found
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["target"]["server_kind"] == "unknown"
    not_run = {c["probe"]: c["reason"] for c in results["probes"] if c["status"] != "ok"}
    assert "404" in not_run["sglang.server"] and "404" in not_run["sglang.metrics"], not_run  # what it could not read
    assert "Not measured" in proc.stdout and "sglang.server" in proc.stdout.split("Not measured")[1]  # which probes
    assert "Server: an HTTP server" in (tmp_path / "r.md").read_text()


def test_server_kind_flag_overrides_detection(tmp_path):
    from gpu_runbook.session import with_server_kind

    with PlainServer() as plain:
        forced = with_server_kind(Target(sglang_url=plain.url), "vllm")
    assert forced.server_kind == "vllm" and "--server-kind" in forced.server_found


def test_vllm_probes_on_a_vllm_server_fill_the_sglang_concepts():
    """vllm.server and vllm.metrics on the simulated server, against their declared models."""
    from gpu_runbook.values import contract_errors

    reg = Registry.discover([])

    async def go(url: str) -> dict:
        target = Target(sglang_url=url, server_kind="vllm")
        async with httpx.AsyncClient() as http:
            from gpu_runbook.nvml import Nvml

            ctx = Context(target=target, http=http, nvml=Nvml())
            server = await reg.probes["vllm.server"]().run(ctx, reg.probes["vllm.server"].Params())
            metrics_cls = reg.probes["vllm.metrics"]
            metrics = await metrics_cls().run(ctx, metrics_cls.Params(duration_s=1.0, interval_s=0.5))
            return {"server": server, "metrics": metrics}

    cfg = VllmSimConfig(version="0.11.0", spec={"tensor_parallel_size": 4, "max_num_seqs": 96, "dev_mode": True, "block_size": 32})
    with VllmSimServer(cfg) as vllm:
        ev = asyncio.run(go(vllm.url))
    s, m = ev["server"], ev["metrics"]
    assert s.ok and m.ok, (s.reason, m.reason)
    assert not contract_errors(reg.probes["vllm.server"].Values, s.values, complete=True)
    assert not contract_errors(reg.probes["vllm.metrics"].Values, m.values, complete=True)
    v = s.values
    assert (v["server_kind"], v["version"], v["tp"], v["running_cap"], v["page_size"]) == ("vllm", "0.11.0", 4, 96, 32)
    assert v["kv_capacity_tokens"] == (389120 // 32) * 32 and v["cuda_graphs_decode"] is True
    assert v["graph_max_bs_decode"] == 192  # 0.11's default: min(2 x max_num_seqs, 512)
    assert v["running_cap_source"] == v["sources"]["running_cap"] == "scheduler_config.max_num_seqs"
    assert m.values["kv_usage_series"] == "vllm:kv_cache_usage_perc" and m.values["running_cap"] == 96


VLLM_SCENARIOS = ("seed-rtx-pro-6000-tp8-vllm", "healthy-h200-vllm", "max-num-seqs-64-vllm", "vllm-085-old-kv-name")


@pytest.mark.parametrize("scenario", VLLM_SCENARIOS)
def test_vllm_probes_return_what_they_declare_on_every_release(scenario):
    """vllm.server, vllm.metrics (under load) and vllm.sweep on each simulated release, against their models."""
    from gpu_runbook.load import LoadConfig, LoadGenerator
    from gpu_runbook.sim.host import SimulatedHost
    from gpu_runbook.values import contract_errors

    reg = Registry.discover([])
    names = ("vllm.server", "vllm.health", "vllm.metrics", "vllm.profile", "vllm.sweep")
    params = {"vllm.metrics": {"duration_s": 2.0, "interval_s": 1.0},
              "vllm.sweep": {"levels": [1, 8], "seconds_per_level": 1.0, "input_len": 32, "output_len": 64}}  # fmt: skip

    async def go(host) -> dict:
        target = host.target()
        async with httpx.AsyncClient() as http:
            ctx = Context(target=target, http=http, nvml=host.nvml)
            load = LoadGenerator(target, LoadConfig(concurrency=16, input_len=64, output_len=256), client=http)
            await load.start()
            try:
                out = {n: await reg.probes[n]().run(ctx, reg.probes[n].Params.model_validate(params.get(n, {})))
                       for n in names if n != "vllm.sweep"}  # fmt: skip
            finally:
                await load.stop()
            out["vllm.sweep"] = await reg.probes["vllm.sweep"]().run(ctx, reg.probes["vllm.sweep"].Params.model_validate(params["vllm.sweep"]))
            return out

    with SimulatedHost.start(scenario) as host:
        evidence = asyncio.run(go(host))
    problems = [f"{n}: {e}" for n, ev in evidence.items() for e in contract_errors(reg.probes[n].Values, ev.values, complete=ev.ok)]
    assert not problems, problems
    assert all(ev.ok for n, ev in evidence.items() if n != "vllm.profile"), {n: ev.reason for n, ev in evidence.items()}
    # the simulated servers run without the profiler: the probe names the launch setting the release reads
    profile = evidence["vllm.profile"]
    assert profile.status is ProbeStatus.unavailable and "not launched with its profiler" in profile.reason
    assert ("VLLM_TORCH_PROFILER_DIR=" if scenario == "vllm-085-old-kv-name" else "--profiler-config") in profile.reason  # 0.13+
    server, metrics = evidence["vllm.server"].values, evidence["vllm.metrics"].values
    assert metrics["kv_usage"]["max"] is not None and metrics["running"]["max"] > 0
    if scenario == "vllm-085-old-kv-name":  # waiting by reason from 0.20; the other scenarios run 0.34
        assert metrics["waiting_by_reason"] is None and "0.20" in metrics["unknown"]["waiting_by_reason"]
    if scenario == "vllm-085-old-kv-name":  # the gauge under its old name; dev mode's server_info is text there
        assert metrics["kv_usage_series"] == "vllm:gpu_cache_usage_perc"
        assert server["tp"] is None and "text only" in server["unknown"]["tp"]
    elif scenario == "max-num-seqs-64-vllm":  # no dev mode: TP unknown, the cap is the release's default until measured
        assert set(metrics["waiting_by_reason"]) == {"capacity"}  # 0.20 exports waiting by reason
        assert server["tp"] is None and "VLLM_SERVER_DEV_MODE" in server["unknown"]["tp"]
        assert server["running_cap"] == 1024 and "estimate" in server["running_cap_source"]  # >= 70 GiB GPU
    else:
        assert metrics["kv_usage_series"] == "vllm:kv_cache_usage_perc" and server["tp"] == 8
    if server["radix_cache"]:  # prefix caching on: the counters are read; random prompts share no prefix (0 hits,
        # or null when no prompt was admitted in the window)
        assert "cache_hit_rate" not in metrics["unknown"] and metrics["cache_hit_rate"] in (0.0, None)
    else:
        assert metrics["cache_hit_rate"] is None and "prefix" in metrics["unknown"]["cache_hit_rate"]
    if scenario == "healthy-h200-vllm":  # 0.34 reports the KV size in tokens itself
        assert server["kv_capacity_tokens"] == 2400000 // 16 * 16 and server["kv_cache_max_concurrency"] is not None



def test_parse_cmdline_reads_vllm_and_sglang_launch_lines():
    from gpu_runbook.probes.server.launch_args import parse_cmdline

    v = parse_cmdline(["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "zai-org/GLM-5-NVFP4", "-tp", "8", "--max-num-seqs=2048",
                       "--enforce-eager", "--kv-cache-dtype", "fp8", "--gpu-memory-utilization", "0.88"], pid=7)  # fmt: skip
    assert v is not None and (v.kind, v.model, v.pid) == ("vllm", "zai-org/GLM-5-NVFP4", 7)
    assert v.flags == {"tensor_parallel_size": "8", "max_num_seqs": "2048", "enforce_eager": True, "kv_cache_dtype": "fp8",
                       "gpu_memory_utilization": "0.88"}  # fmt: skip
    s = parse_cmdline(["python", "-m", "sglang.launch_server", "--model-path", "m", "--tp-size", "8", "--disable-cuda-graph"])
    assert s is not None and s.kind == "sglang" and s.flags == {"model_path": "m", "tp_size": "8", "disable_cuda_graph": True}
    assert parse_cmdline(["python", "train.py", "--tp", "8"]) is None


def test_launch_args_of_the_process_on_the_gpus_fill_what_dev_mode_would():
    """Without dev mode, the launch arguments of the server process holding the GPUs (NVML's compute processes ->
    /proc/PID/cmdline) give TP, max_num_seqs and eager mode, each saying it came from that command line. The
    process is a real one carrying vLLM's command line; the GPUs are the simulated host's."""
    from gpu_runbook.sim.host import SimulatedHost

    argv = [sys.executable, "-c", "import sys, time; time.sleep(120)", "vllm", "serve", "zai-org/GLM-5-NVFP4", "-tp", "8",
            "--max-num-seqs", "64", "--enforce-eager", "--moe-backend", "marlin"]  # fmt: skip
    proc = subprocess.Popen(argv)
    try:
        with SimulatedHost.start("max-num-seqs-64-vllm") as host:
            host.fake.compute_pids = [proc.pid]
            reg = Registry.discover([])

            async def go() -> dict:
                async with httpx.AsyncClient() as http:
                    ctx = Context(target=host.target(), http=http, nvml=host.nvml)
                    return (await reg.probes["vllm.server"]().run(ctx, reg.probes["vllm.server"].Params())).values

            v = asyncio.run(go())
    finally:
        proc.kill()
        proc.wait(10)
    where = f"cmdline of PID {proc.pid}"
    assert (v["dev_mode"], v["tp"], v["running_cap"], v["cuda_graphs_decode"], v["graph_max_bs_decode"]) == (False, 8, 64, False, 0)
    assert v["sources"]["tp"] == where and v["running_cap_source"] == f"--max-num-seqs ({where})"
    assert v["moe_backend"] == "marlin" and v["moe_backend_source"] == f"--moe-backend ({where})"


@pytest.mark.parametrize(("version", "spec", "backend", "source", "fp4_var"), [
    # 0.34.0 in dev mode: kernel_config.moe_backend says the setting; VLLM_USE_FLASHINFER_MOE_FP4 is gone (0.24.0)
    ("0.34.0", {"moe_backend": "cutlass"}, "cutlass", "kernel_config.moe_backend", None),
    # 0.20.0: the variable is read from vllm_env, and unset there is its default, 0
    ("0.20.0", {"env": {"VLLM_USE_FLASHINFER_MOE_FP4": "0"}}, "auto", "kernel_config.moe_backend", False),
    # 0.11.0 has no --moe-backend (0.17.0) and its dev mode gives no vllm_env (0.14.0)
    ("0.11.0", {}, "auto", "this release has no --moe-backend: vLLM picks the MoE kernels in code (auto)", None),
])
def test_the_moe_backend_setting_and_where_it_came_from(version, spec, backend, source, fp4_var):
    reg = Registry.discover([])

    async def go(url: str) -> dict:
        async with httpx.AsyncClient() as http:
            from gpu_runbook.nvml import Nvml

            ctx = Context(target=Target(sglang_url=url, server_kind="vllm"), http=http, nvml=Nvml())
            return (await reg.probes["vllm.server"]().run(ctx, reg.probes["vllm.server"].Params())).values

    with VllmSimServer(VllmSimConfig(version=version, spec={"dev_mode": True, **spec})) as vllm:
        v = asyncio.run(go(vllm.url))
    assert (v["moe_backend"], v["moe_backend_source"], v["vllm_use_flashinfer_moe_fp4"]) == (backend, source, fp4_var)
    if fp4_var is None:
        assert "VLLM_USE_FLASHINFER_MOE_FP4" in v["unknown"]["vllm_use_flashinfer_moe_fp4"]


def test_the_seeds_box_on_vllm_confirms_the_wall_with_vllm_numbers_and_vllm_steps():
    """Acceptance 1 on the scaled-down box of the sidecar entry: gpus-underfed and the KV wall confirmed from vLLM's
    own series, and the steps offered are vLLM's flags (SGLang's are left out, not listed as not applying)."""
    from gpu_runbook.loader import load
    from gpu_runbook.runbook_test import collect_cases, run_case

    reg = Registry.discover([])
    loaded = load(REPO / "runbooks" / "power-starvation.yaml", reg)
    case = next(c for c in collect_cases(loaded) if c.test.scenario == "seed-rtx-pro-6000-tp8-vllm")
    results = run_case(loaded, reg, case)
    by_id = {h.id: h for h in results.hypotheses}
    assert results.target["server_kind"] == "vllm"
    assert by_id["gpus-underfed"].verdict.value == "confirmed" and by_id["kv-cache-wall"].verdict.value == "confirmed"
    steps = " ".join(s.text for h in results.hypotheses for s in h.steps if s.applies is not False)
    for flag in ("--gpu-memory-utilization", "--data-parallel-size", "--enforce-eager"):
        assert flag in steps, flag
    shown = " ".join(s.text for h in results.hypotheses for s in h.steps)
    for flag in ("--mem-fraction-static", "--max-running-requests", "--attn-dp-size", "--cuda-graph-max-bs"):
        assert flag not in shown, flag
