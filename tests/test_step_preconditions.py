"""Acceptance: no step offered on any bundled scenario names a flag its server's release does not read, a DP size
that does not divide TP, a TP change whose weights do not fit, an FP8 KV cache where the KV is FP8 already, or
`--num-continuous-decode-steps`.

Each SGLang scenario's simulated server answers `/server_info` (no load, no GPUs); the probes' own parsers turn it
and the scenario's model config into the values rules read, and every step of both runbooks is judged on them at a
small and at a KV-wall batch. The flags a release reads come from the ServerArgs fields extracted from its wheel
(engine/sim/data). Each vLLM scenario runs on its simulated host and the runbooks' server probe (`sglang.server`,
which the runner resolves to `vllm.server` for a vLLM target) reads it; the flags a vLLM release reads are those its
`vllm serve` registers (engine/sim/data/vllm_cli_flags_<version>.json, scripts/extract-vllm-cli-flags).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpu_runbook.headlines import render
from gpu_runbook.loader import load_path_or_name
from gpu_runbook.model import headline_parts
from gpu_runbook.probe import Context
from gpu_runbook.probes.model import config_values
from gpu_runbook.probes.sglang.config import config_concepts
from gpu_runbook.registry import Registry
from gpu_runbook.rules import evaluate, to_cel_data
from gpu_runbook.sim.host import SimulatedHost, server_config
from gpu_runbook.sim.scenario import load_scenario
from gpu_runbook.sim.sglang_info import default_server_args, version_tuple
from gpu_runbook.sim.sglang_server import SimServer


def _scenarios(kind: str) -> list[str]:
    return sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "runbooks" / "scenarios").glob("*.yaml")
                  if (yaml.safe_load(p.read_text()).get("server") or {}).get("kind", "sglang") == kind)


# SGLang scenarios: their flags are checked against each release's ServerArgs fields (vLLM's steps carry
# `server: vllm` and are left out here, as the runner leaves them out for an SGLang server)
SCENARIOS = _scenarios("sglang")
# vLLM scenarios: steps with `server: vllm` or none, their flags checked against what the release's `vllm serve` reads
VLLM_SCENARIOS = _scenarios("vllm")
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]+)")
# CLI aliases a release reads without a ServerArgs field of that name (0.5.22+: the legacy graph flags)
# the classic flags 0.5.14 kept as deprecated aliases of the per-phase ones (sglang-versions.md "Corrections")
ALIASES = {"cuda-graph-max-bs": "cuda_graph_max_bs_decode", "disable-cuda-graph": "disable_decode_cuda_graph"}
DATA = Path(__file__).resolve().parent.parent / "engine" / "sim" / "data"


def release_fields(version: str) -> set[str]:
    """The ServerArgs fields a release reads. The simulator renders 0.5.14-0.5.21 from 0.5.13's data and 0.5.23's
    layout; 0.5.14's own fields (extracted from its wheel, engine/sim/data/README.md) stand for that range here."""
    t = version_tuple(version)
    if (0, 5, 14) <= t < (0, 5, 22):
        return set(json.loads((DATA / "server_args_0.5.14.json").read_text())["fields"])
    return set(default_server_args(version))


@pytest.fixture(scope="module")
def runbooks():
    reg = Registry.discover()
    return [load_path_or_name(n, reg) for n in ("power-starvation", "throughput-plateau")]


def server_flags(text: str) -> list[str]:
    """The flags of a step's backtick spans that start with a flag (the server's; not `runbook ... --set`)."""
    return [f for span in re.findall(r"`([^`]+)`", text) if span.lstrip().startswith("--") for f in FLAG.findall(span)]


def fp8_offered_again(scope: dict[str, Any], text: str) -> bool:
    """A step offering an FP8 KV cache where the KV is FP8 already (set, or chosen from the checkpoint)."""
    if "--kv-cache-dtype fp8" not in text:
        return False
    kv = str(scope["server"].get("kv_dtype") or "")
    return kv.startswith("fp8") or (kv == "auto" and scope["model"].get("kv_dtype_from_checkpoint") is not None)


def stats(v: float) -> dict[str, float]:
    return {"mean": v, "min": v, "max": v, "p50": v, "p95": v, "last": v}


def evidence(name: str, tmp_path: Path) -> tuple[dict[str, Any], set[str]]:
    scenario = load_scenario(name)
    with SimServer(server_config(scenario, tmp_path)) as srv:
        version = scenario.server.version
        info = httpx.get(srv.url + ("/get_server_info" if version.startswith("0.5.5") else "/server_info"), timeout=10).json()
    return scenario_scope(scenario, config_concepts(info)), release_fields(version)


def scenario_scope(scenario: Any, server: dict[str, Any]) -> dict[str, Any]:
    """What steps are decided on: the server's values as its probe read them, the model's config, the GPUs."""
    g = scenario.gpu
    return {
        "server": server,
        "model": config_values(dict(scenario.hf_config), scenario.hf_quant_config),
        "inv": {"memory_total_bytes": g.memory_mib * 1024 * 1024, "gpu_count": g.count, "compute_capability_major": g.cc[0],
                "nvlink_active_links_total": g.nvlink_links},
        "topo": {"any_pair_without_p2p": g.p2p != "OK"},
    }  # fmt: skip


def vllm_flags(version: str) -> set[str]:
    """The option strings a vLLM release's `vllm serve` registers (extracted from its sdist, engine/sim/data/README.md)."""
    path = DATA / f"vllm_cli_flags_{version}.json"
    assert path.exists(), f"no {path.name}: run scripts/extract-vllm-cli-flags {version}"
    return set(json.loads(path.read_text())["flags"])


def vllm_env_vars(version: str) -> set[str]:
    """The environment variables a vLLM release reads (its vllm/envs.py, extracted from its sdist by
    scripts/extract-vllm-env-vars)."""
    path = DATA / f"vllm_env_vars_{version}.json"
    assert path.exists(), f"no {path.name}: run scripts/extract-vllm-env-vars {version}"
    return set(json.loads(path.read_text())["variables"])


ENV_VAR = re.compile(r"\b(VLLM_[A-Z0-9_]+)=")


def vllm_evidence(name: str) -> tuple[dict[str, Any], set[str]]:
    """The scope a run on a vLLM scenario decides steps on: the runbooks' server probe as the runner resolves it for a
    vLLM target, run against the scenario's simulated host (its server and its GPUs' NVML)."""
    scenario = load_scenario(name)
    probe = Registry.discover([]).for_target("sglang.server", "vllm")
    assert probe.name == "vllm.server"

    async def read(host: SimulatedHost) -> Any:
        async with httpx.AsyncClient() as http:
            return await probe().run(Context(target=host.target(), http=http, nvml=host.nvml), probe.Params())

    with SimulatedHost.start(scenario) as host:
        ev = asyncio.run(read(host))
    assert ev.ok, (name, ev.reason)
    return scenario_scope(scenario, ev.values), vllm_flags(scenario.server.version)


def offered_steps(loaded, scope: dict[str, Any], kind: str = "sglang") -> list[tuple[str, str]]:
    """The steps a run on a `kind` server offers (LoadedRunbook.for_server: a step naming another server kind is left out). On vLLM a
    hypothesis whose precondition is false on this scope is skipped with its subtree, as the runner skips it (SGLang-only
    hypotheses say `server.server_kind == 'sglang'` there); one that cannot be told is walked."""
    loaded = loaded.for_server(kind)  # the runbook as that server reads it: its own variants, another's steps left out
    params = {n: p.default for n, p in loaded.runbook.params.items()}
    data = to_cel_data({**scope, "params": params, "load": {}})
    out = []
    skipped: set[str] = set()
    for hyp, parent in loaded.runbook.walk():
        if kind == "vllm":
            when = loaded.rule(hyp.id, "when") if hyp.when is not None else None
            if (parent is not None and parent.id in skipped) or (when is not None and evaluate(when, data).value is False):
                skipped.add(hyp.id)
                continue
        for i, step in enumerate(hyp.steps):
            if step.server not in (None, kind):
                continue
            if step.when is not None and evaluate(loaded.rule(hyp.id, f"next_steps.{i}.when"), data).value is not True:
                continue
            text = step.text
            if "{{" in text:
                fields = [loaded.rule(hyp.id, f"next_steps.{i}.text.{j}") for j in range(len(headline_parts(text)))]
                text = render(text, fields, data)[0]
            out.append((hyp.id, text))
    return out


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_offered_step_applies_to_its_scenarios_server(name, runbooks, tmp_path):
    scope, fields = evidence(name, tmp_path)
    server = scope["server"]
    tp, version = int(server["tp"]), server["version"]
    checked = 0
    for running in (8.0, 2000.0):  # a small batch and one at a KV wall
        scope["metrics"] = {"running_per_dp": stats(running)}
        for loaded in runbooks:
            for hid, text in offered_steps(loaded, scope):
                checked += 1
                assert "--num-continuous-decode-steps" not in text, (hid, text)
                for flag in server_flags(text):
                    field = ALIASES.get(flag, flag.replace("-", "_"))
                    assert field in fields or flag.replace("-", "_") in fields, f"{name} ({version}): `{hid}` names --{flag}: {text}"
                assert not fp8_offered_again(scope, text), f"{name}: `{hid}` offers an FP8 KV cache where it is FP8 already: {text}"
                for n in re.findall(r"--(?:attn-)?dp-size (\d+)", text):
                    assert tp % int(n) == 0, f"{name}: `{hid}` offers DP {n} at TP{tp}: {text}"
                for n in re.findall(r"--tp-size (\d+)", text):
                    weights = (server["weight_gb_per_gpu"] or 0) * tp / int(n) * 2**30
                    assert server["weight_gb_per_gpu"] is not None and weights <= 0.75 * scope["inv"]["memory_total_bytes"], (
                        f"{name}: `{hid}` offers TP{n} with {weights / 2**30:.0f} GiB of weights per GPU: {text}")
    assert checked > 0


def test_the_seed_box_is_offered_attention_dp_with_its_releases_flags(runbooks, tmp_path):
    """The walk above checks real steps: on the seeds' box (0.5.10, TP8, GLM-5-NVFP4) attention DP 8 with EP 8 and the
    FP4 dispatch flags is offered, in the classic flag pair 0.5.10 reads."""
    scope, fields = evidence("seed-rtx-pro-6000-tp8", tmp_path)
    scope["metrics"] = {"running_per_dp": stats(1935.0)}
    texts = [t for _, t in offered_steps(runbooks[0], scope)]
    dp = [t for t in texts if "--enable-dp-attention --dp-size 8 --ep-size 8" in t]
    assert dp and "--quantization modelopt_fp4" in dp[0] and "attn_dp_size" not in fields
    assert not any("--attn-dp-size" in t for t in texts)


@pytest.mark.parametrize("name", VLLM_SCENARIOS)
def test_every_offered_step_names_flags_its_vllm_release_reads(name, runbooks):
    scope, flags = vllm_evidence(name)
    server = scope["server"]
    version = server["version"]
    env_vars = vllm_env_vars(version)
    assert version == load_scenario(name).server.version
    checked = named = 0
    for running in (8.0, 2000.0):  # a small batch and one at a KV wall
        scope["metrics"] = {"running_per_dp": stats(running)}
        for loaded in runbooks:
            for hid, text in offered_steps(loaded, scope, "vllm"):
                checked += 1
                for flag in server_flags(text):
                    named += 1
                    assert f"--{flag}" in flags, f"{name} (vLLM {version}): `{hid}` names --{flag}: {text}"
                assert not fp8_offered_again(scope, text), f"{name}: `{hid}` offers an FP8 KV cache where it is FP8 already: {text}"
                if not text.startswith("Upgrade"):  # an upgrade step names the later release's variable, and says so
                    for var in ENV_VAR.findall(text):
                        assert var in env_vars, f"{name} (vLLM {version}): `{hid}` names {var}, which vLLM {version} does not read: {text}"
    assert checked > 0 and named > 0


def test_the_vllm_walk_reads_the_releases_flags_and_leaves_sglang_steps_out(runbooks):
    """The vLLM walk checks real steps: on the seeds' box under vLLM 0.11 (dev mode, TP8, enforce-eager) the vLLM
    launch flags are offered and checked, and no SGLang-only step is."""
    scope, flags = vllm_evidence("seed-rtx-pro-6000-tp8-vllm")
    assert scope["server"]["tp"] == 8 and "--enable-expert-parallel" in flags and "--tp-size" not in flags
    scope["metrics"] = {"running_per_dp": stats(1935.0)}
    texts = [t for loaded in runbooks for _, t in offered_steps(loaded, scope, "vllm")]
    named = {f for t in texts for f in server_flags(t)}
    assert {"data-parallel-size", "enable-expert-parallel", "enforce-eager"} <= named, named
    assert not any("--attn-dp-size" in t or "--tp-size" in t or "--cuda-graph-max-bs" in t for t in texts)
