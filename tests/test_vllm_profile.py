"""vLLM's profiler as the simulated vLLM server serves it per release, the traces it writes, and vllm.profile end to end.

Facts (read in the released wheels; engine/sim/profiler.py's vLLM section cites file:line): /start_profile exists only
with the profiler on (VLLM_TORCH_PROFILER_DIR through 0.12, --profiler-config from 0.13, the variable still read by
0.13-0.15); the worker annotates each execute_model (none <= 0.11.0, execute_new_N_cached_M 0.11.1-0.13,
execute_context_N(T)_generation_M(T) 0.14+); the sampler runs after the annotated span; FULL_AND_PIECEWISE graphs.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.load import LoadConfig, LoadGenerator
from gpu_runbook.loader import LoadError
from gpu_runbook.probe import Context
from gpu_runbook.probes.vllm.profile import VllmProfile, _dir_from_flags
from gpu_runbook.sim.host import SimulatedHost
from gpu_runbook.sim.profiler import Physics, VllmPass, vllm_annotation, vllm_physics, vllm_worker_names, write_vllm_traces
from gpu_runbook.sim.vllm_profiler_config import vllm_profiler_problem, vllm_profiler_setting, vllm_release
from gpu_runbook.sim.scenario import Scenario, find_scenario, load_scenario
from gpu_runbook.sim.vllm_server import VllmSimConfig, VllmSimServer
from gpu_runbook.sim.vllm_spec import VllmSpec
from gpu_runbook.values import contract_errors

SCENARIO = "healthy-h200-vllm-profiler"


def _with(version: str, **spec: Any) -> Scenario:
    """The profiler scenario on another release, launched with other vLLM settings."""
    sc = load_scenario(SCENARIO)
    vspec = sc.server.vllm.model_copy(update=spec)  # type: ignore[union-attr]
    return sc.model_copy(update={"server": sc.server.model_copy(update={"version": version, "vllm": vspec})})


# ---- which releases register the routes ------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "spec", "routes"), [
    ("0.11.0", {}, False),
    ("0.11.0", {"env": {"VLLM_TORCH_PROFILER_DIR": "/tmp/p"}}, True),
    ("0.12.0", {"env": {"VLLM_TORCH_CUDA_PROFILE": "1"}}, True),  # the CUDA profiler: routes, no torch trace
    ("0.13.0", {"env": {"VLLM_TORCH_PROFILER_DIR": "/tmp/p"}}, True),  # deprecated, still read (0.13-0.15)
    ("0.16.0", {"env": {"VLLM_TORCH_PROFILER_DIR": "/tmp/p"}}, False),  # no longer read
    ("0.34.0", {"profiler_config": {"profiler": "torch", "torch_profiler_dir": "/tmp/p"}}, True),
    ("0.34.0", {}, False),
])  # fmt: skip
async def test_start_profile_is_registered_only_where_the_release_turns_the_profiler_on(version, spec, routes):
    cfg = VllmSimConfig(version=version, spec=VllmSpec(**spec))
    async with VllmSimServer(cfg) as srv, httpx.AsyncClient() as http:
        r = await http.get(srv.url + "/start_profile")
        assert r.status_code == (405 if routes else 404)  # POST only, as vLLM's router registers it
        r = await http.get(srv.url + "/stop_profile")
        assert r.status_code == (405 if routes else 404)


def test_the_profiler_setting_and_what_a_release_refuses():
    spec = VllmSpec(profiler_config={"torch_profiler_dir": "rel"}, env={"VLLM_PROFILER_MAX_ITERS": "7"})
    s = vllm_profiler_setting("0.13.0", spec, cwd="/srv")  # 0.13-0.15: a directory alone means torch; the env's max iters read
    assert s is not None and (s.kind, s.directory, s.max_iterations) == ("torch", "/srv/rel", 7)
    assert vllm_profiler_setting("0.16.0", spec) is None  # 0.16+: no profiler named, none on
    assert "only applicable" in (vllm_profiler_problem("0.16.0", spec) or "")
    old = VllmSpec(profiler_config={"profiler": "torch", "torch_profiler_dir": "/x"})
    assert "0.13" in (vllm_profiler_problem("0.12.0", old) or "")
    assert "must be set" in (vllm_profiler_problem("0.34.0", VllmSpec(profiler_config={"profiler": "torch"})) or "")
    assert vllm_profiler_problem("0.34.0", old) is None


def test_a_scenario_whose_release_cannot_read_its_profiler_setting_does_not_load(tmp_path):
    src = find_scenario(SCENARIO).read_text().replace("version: 0.34.0", "version: 0.12.0")
    bad = tmp_path / "old-profiler.yaml"
    bad.write_text(src)
    with pytest.raises(LoadError) as exc:
        load_scenario(bad)
    line = next(i for i, t in enumerate(src.splitlines(), 1) if "profiler_config:" in t)
    assert f"{bad}:{line}:" in str(exc.value) and "--profiler-config is read from vLLM 0.13" in str(exc.value)


# ---- what the traces hold ------------------------------------------------------------------------------------


def _pass(ctx=(0, 0), gen=(0, 0), new=0, graph="NONE", kv=4096.0) -> VllmPass:
    p = VllmPass(time.time(), 0.05, ctx[0] + gen[0], kv, "DECODE", ctx[1] + gen[1], 0)
    p.new_reqs, p.cached_reqs = new, ctx[0] + gen[0] - new
    p.ctx_reqs, p.ctx_tokens, p.gen_reqs, p.gen_tokens, p.graph = ctx[0], ctx[1], gen[0], gen[1], graph
    p.ctx_sk, p.ctx_sqsq, p.ctx_sqsk = ctx[1], ctx[1] ** 2, ctx[1] ** 2
    p.gen_sk, p.gen_sqsq, p.gen_sqsk = gen[0] * 300, gen[1], gen[0] * 300
    return p


def test_the_annotation_follows_the_release():
    mixed = _pass(ctx=(2, 300), gen=(30, 30), new=1)
    assert vllm_annotation(vllm_release("0.11.0"), mixed) is None
    assert vllm_annotation(vllm_release("0.11.1"), mixed) == "execute_new_1_cached_31"
    assert vllm_annotation(vllm_release("0.13.0"), mixed) == "execute_new_1_cached_31"
    assert vllm_annotation(vllm_release("0.14.0"), mixed) == "execute_context_2(300)_generation_30(30)"
    assert vllm_annotation(vllm_release("0.34.0"), mixed) == "execute_context_2(300)_generation_30(30)"
    assert vllm_annotation(vllm_release("0.25.0"), mixed, detailed=True) == "execute_context_2(300)_generation_30(30)"  # before 0.26
    assert vllm_annotation(vllm_release("0.34.0"), mixed, detailed=True) == (
        "execute_330_context_2(sq300sk300sqsq90000sqsk90000)_generation_30(sq30sk9000sqsq30sqsk9000)")


def test_worker_trace_names_follow_the_release():
    assert vllm_worker_names((0, 11, 0), 2, "p", "17", "host", 100) == ["host_101", "host_102"]
    assert vllm_worker_names((0, 16, 0), 2, "p", "17", "host", 100) == ["17-rank-0", "17-rank-1"]
    assert vllm_worker_names((0, 34, 0), 2, None, "17", "host", 100) == ["dp0_pp0_tp0_dcp0_ep0_rank0", "dp0_pp0_tp1_dcp0_ep1_rank1"]
    assert vllm_worker_names((0, 34, 0), 1, "rb", "17", "host", 100) == ["rb_dp0_pp0_tp0_dcp0_ep0_rank0"]


def _physics(tp: int = 2, nvlink: bool = True) -> Physics:
    sc = load_scenario(SCENARIO)
    cfg = VllmSimConfig(version="0.34.0", spec=VllmSpec(tensor_parallel_size=tp), hf_config=dict(sc.hf_config))
    gpu = sc.gpu.model_copy(update={"nvlink_links": 18 if nvlink else 0})
    return vllm_physics(cfg, sc.model_copy(update={"gpu": gpu}), graph_max=512)


def _events(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            doc = json.loads(f.read())
    else:
        doc = json.loads(path.read_text())
    return doc, [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def test_traces_hold_the_annotation_graph_replays_and_the_sampler_after_the_span(tmp_path):
    ph = _physics()
    passes = [_pass(gen=(64, 64), graph="FULL"), _pass(ctx=(1, 200), gen=(63, 63), new=1, graph="PIECEWISE"),
              _pass(ctx=(4, 2000), gen=(60, 60), new=4, graph="NONE")]  # fmt: skip
    paths = write_vllm_traces(tmp_path, ["rb_dp0_pp0_tp0_dcp0_ep0_rank0", "rb_dp0_pp0_tp1_dcp0_ep1_rank1"], passes, ph, "0.34.0")
    assert [p.name.split(".")[0] for p in paths] == ["rb_dp0_pp0_tp0_dcp0_ep0_rank0", "rb_dp0_pp0_tp1_dcp0_ep1_rank1"]
    assert all(p.name.endswith(".pt.trace.json.gz") for p in paths)
    doc, evs = _events(paths[1])
    assert doc["distributedInfo"]["rank"] == 1 and doc["vllm_version"] == "0.34.0"  # 0.28+ stamps the version
    cpu = [e for e in evs if e["cat"] == "user_annotation"]
    gpu = [e for e in evs if e["cat"] == "gpu_user_annotation"]
    names = ["execute_context_0(0)_generation_64(64)", "execute_context_1(200)_generation_63(63)", "execute_context_4(2000)_generation_60(60)"]
    assert [e["name"] for e in cpu] == [e["name"] for e in gpu] == names
    assert [e["args"]["External id"] for e in cpu] == [e["args"]["External id"] for e in gpu]  # one record_function each
    kernels = [e for e in evs if e["cat"] in ("kernel", "gpu_memcpy")]
    launches = {e["args"]["correlation"]: e["name"] for e in evs if e["cat"] == "cuda_runtime"}
    for span in gpu:  # the span covers the kernels launched in execute_model; the sampler's kernel comes after it
        inside = [k for k in kernels if span["ts"] <= k["ts"] and k["ts"] + k["dur"] <= span["ts"] + span["dur"]]
        after = [k for k in kernels if k["ts"] >= span["ts"] + span["dur"] and "Sampling" in k["name"]]
        assert inside and not any("Sampling" in k["name"] for k in inside) and after
        corrs = {k["args"]["correlation"] for k in inside}
        graphs = [c for c in corrs if launches[c] == "cudaGraphLaunch"]
        eager = [k for k in inside if launches[k["args"]["correlation"]] == "cudaLaunchKernel"]
        if span["name"] == names[0]:  # decode-only: one full-graph replay, its kernels without External id
            assert len(graphs) == 1 and not eager and not any("External id" in k["args"] for k in inside)
        elif span["name"] == names[1]:  # mixed, within the capture size: piecewise, attention launched eagerly between pieces
            layers = ph.layers
            assert layers <= len(graphs) <= layers + 2
            assert eager and all("FlashAttn" in k["name"] for k in eager)
        else:  # above the largest capture size: eager
            assert not graphs and len(eager) == len(inside)
    # custom all-reduce on NVLink at TP2 is vLLM's own kernel
    assert any(k["name"].startswith("void vllm::cross_device_reduce_") and "<__nv_bfloat16, 2>" in k["name"] for k in kernels)
    assert any(k["name"].startswith("triton_red_fused_") for k in kernels)  # compiled: Inductor norms (custom ops off)


def test_releases_before_the_annotation_write_kernels_only(tmp_path):
    paths = write_vllm_traces(tmp_path, ["host_7"], [_pass(gen=(8, 8), graph="FULL")], _physics(tp=1), "0.11.0", use_gzip=False)
    assert paths[0].name.startswith("host_7.") and paths[0].name.endswith(".pt.trace.json")
    doc, evs = _events(paths[0])
    assert "vllm_version" not in doc
    assert not [e for e in evs if e["cat"] in ("user_annotation", "gpu_user_annotation")]
    assert [e for e in evs if e["cat"] == "kernel"]


def test_the_launch_dir_is_read_from_the_profiler_config_flag():
    assert _dir_from_flags({"profiler_config": '{"profiler": "torch", "torch_profiler_dir": "/d"}'}) == "/d"
    assert _dir_from_flags({"profiler_config.torch_profiler_dir": "/e"}) == "/e"
    assert _dir_from_flags({"profiler_config": "not json"}) is None


# ---- the probe end to end ------------------------------------------------------------------------------------


async def _profile(scenario: Scenario, concurrency: int, input_len: int, output_len: int, settle_s: float, ratio: float = 1.0,
                   **params: Any) -> tuple[Any, SimulatedHost]:
    with SimulatedHost.start(scenario) as host:
        target = host.target()
        async with httpx.AsyncClient() as http:
            load = LoadGenerator(target, LoadConfig(concurrency=concurrency, input_len=input_len, output_len=output_len, ignore_eos=True,
                                                    output_range_ratio=ratio), client=http)  # fmt: skip
            await load.start()
            try:
                await asyncio.sleep(settle_s)
                ctx = Context(target=target, http=http, nvml=host.nvml, load=load)
                ev = await VllmProfile().run(ctx, VllmProfile.Params(**{"num_steps": 3, "wait_s": 30, **params}))
            finally:
                await load.stop()
        return ev, host


async def test_a_034_server_launched_with_its_profiler_gives_the_decode_breakdown():
    ev, host = await _profile(load_scenario(SCENARIO), 256, 128, 1024, 4.0)
    assert ev.ok, ev.reason
    v = ev.values
    assert not contract_errors(VllmProfile.Values, v, complete=True)
    # the decode passes by their execute_context_0(0)_generation_N(N) annotation (needs the analysis that reads it)
    assert v["breakdown_of"] == "decode" and v["steps"] >= 3 and v["ranks"] == 8 and v["trace_files"] == 8
    assert "max_iterations" in v["capture"] and "profiler_config.torch_profiler_dir" in v["capture"]
    assert Path(v["trace_dir_server"]).name == "vllm-profile" and str(host.model_dir) in v["trace_dir_server"]  # relative: the server's cwd
    assert 40 < v["step_ms"] < 90  # 50 ms + 0.04 ms x 256 running
    assert "custom-allreduce" in v["backends"] and v["moe_gemm_share"] > v["communication_share"] > 0.01
    assert v["bandwidth_share"] is not None and v["weight_gb"] and v["weight_gb_source"].startswith("model config")
    assert v["pcie_to_allreduce_ratio"] is not None and "ROCm MI300" in v["finding_allreduce"]
    assert v["idle_share"] < 0.05  # a full-graph replay per decode pass


@pytest.mark.parametrize(("version", "told"), [
    ("0.11.0", "annotates no pass"),  # the GPU timeline: full-graph decode replays among piecewise mixed passes
    ("0.13.0", "cached request decodes or continues a chunked prompt"),  # new/cached, and the launches tell
])  # fmt: skip
async def test_older_releases_give_the_breakdown_and_say_how_the_passes_were_told(version, told, tmp_path):
    # 32 running requests of 64-128 tokens: about one in three passes admits a request (a mixed pass, piecewise graphs),
    # the others are decode-only (one full-graph replay each)
    d = tmp_path / "vllm-traces"
    spec = {"profiler_config": None, "env": {"VLLM_TORCH_PROFILER_DIR": str(d)}, "dev_mode": False}
    ev, _ = await _profile(_with(version, **spec), 32, 128, 128, 5.0, ratio=0.5, output_dir=str(d))
    assert ev.ok, ev.reason
    v = ev.values
    assert not contract_errors(VllmProfile.Values, v, complete=True)
    assert v["breakdown_of"] == "decode" and v["steps"] >= 1 and told in v["capture"]
    assert "no request fields before 0.32" in v["capture"]
    assert len(list(d.glob("*.async_llm.*.pt.trace.json.gz"))) >= 1  # the API server's trace is beside them, not read


async def test_013_without_an_arrival_cannot_tell_decodes_from_chunks_and_says_so(tmp_path):
    # every request running and none finishing: every pass is execute_new_0_cached_64, one full-graph replay, and no
    # pass with a new request ran piecewise beside them: a cached request may be a chunk, nothing tells
    d = tmp_path / "vllm-traces"
    spec = {"profiler_config": None, "env": {"VLLM_TORCH_PROFILER_DIR": str(d)}, "dev_mode": False}
    ev, _ = await _profile(_with("0.13.0", **spec), 64, 128, 2048, 3.0, output_dir=str(d), num_steps=1)
    assert ev.status is ProbeStatus.unavailable
    assert "no decode step" in ev.reason and "decode-or-chunk" in ev.reason and "execute_new_0_cached" in ev.reason


async def test_without_the_directory_the_probe_says_which_setting_to_pass(tmp_path):
    spec = {"profiler_config": None, "env": {"VLLM_TORCH_PROFILER_DIR": str(tmp_path)}}
    ev, _ = await _profile(_with("0.11.0", **spec), 8, 32, 64, 0.5)  # 0.11's dev mode /server_info has no profiler config
    assert ev.status is ProbeStatus.unavailable and "output_dir" in ev.reason and "VLLM_TORCH_PROFILER_DIR" in ev.reason


async def test_a_capture_of_mixed_passes_only_says_there_is_no_decode_step():
    # long prompts, a 512-token budget: a prompt is always being chunked beside the decodes, so every pass is mixed
    sc = _with("0.34.0", max_num_batched_tokens=512)
    ev, _ = await _profile(sc, 64, 4096, 16, 3.0, num_steps=1)
    assert ev.status is ProbeStatus.unavailable, ev.values
    assert "no decode step" in ev.reason and "mixed" in ev.reason


def test_eager_passes_run_vllm_own_norm_and_rotary_ops(tmp_path):
    sc = load_scenario(SCENARIO)
    cfg = VllmSimConfig(version="0.34.0", spec=VllmSpec(tensor_parallel_size=2, enforce_eager=True), hf_config=dict(sc.hf_config))
    ph = vllm_physics(cfg, sc, graph_max=0)
    paths = write_vllm_traces(tmp_path, ["r0"], [_pass(gen=(8, 8))], ph, "0.34.0")
    names = {e["name"] for e in _events(paths[0])[1] if e["cat"] == "kernel"}
    assert any("vllm::fused_add_rms_norm_kernel<c10::BFloat16" in n for n in names)  # custom_ops "all" without compilation
    assert any(n.startswith("void vllm::rotary_embedding_kernel<") for n in names)
    assert not any(n.startswith("triton_") for n in names)
