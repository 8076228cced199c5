"""Issue 33, acceptance 1: the seeds' box on vLLM, under the SGLang main command's load, is told to run data-parallel
attention with expert parallelism in its release's flags, with a gain from the fitted step model; below the wall the
replicated latent KV is a fact of the configuration, reported as true, not limiting at this load.

Both runs go through the CLI on the simulated host (the seed twin: vLLM 0.34.0, GLM-5-NVFP4 at TP8, the KV pool the
SGLang twin's memory gives at fp8_ds_mla). The DP step's factor is worked out from what was measured (the server's KV
tokens x the latent KV bytes per token: the pool each GPU has) and model.config's weights, so the test checks it
against the same arithmetic, not against a number written here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpu_runbook import findings
from gpu_runbook.cli import main
from gpu_runbook.results import Results
from gpu_runbook.model import Verdict

FLAGS = json.loads((Path(__file__).parents[1] / "engine" / "sim" / "data" / "vllm_cli_flags_0.34.0.json").read_text())


def run(out: Path, *settings: str) -> Results:
    argv = ["run", "power-starvation", "--simulate", "seed-rtx-pro-6000-tp8-vllm", "--no-tui", "--json", str(out / "r.json")]
    for item in settings:
        argv += ["--set", item]
    assert main(argv) == 0
    return Results.model_validate(json.loads((out / "r.json").read_text()))


@pytest.fixture(scope="module")
def at_the_wall(tmp_path_factory) -> Results:
    # the README's command: 2,048 concurrent requests of 256 + 128 tokens (the SGLang main command's load)
    return run(tmp_path_factory.mktemp("wall"), "load_concurrency=2048", "load_input_len=256")


@pytest.fixture(scope="module")
def below_the_wall(tmp_path_factory) -> Results:
    # 256 requests of 128 + 32 tokens hold ~41k of 495,488 KV tokens: no wall
    return run(tmp_path_factory.mktemp("below"), "load_concurrency=256", "load_output_len=32", "sample_seconds=3",
               "warmup_seconds=1", "steady_seconds=60")


def test_dp_attention_with_ep_is_done_first_at_the_wall(at_the_wall: Results) -> None:
    r = at_the_wall
    verdicts = {h.id: h.verdict for h in r.hypotheses}
    assert verdicts["kv-cache-wall"] is Verdict.confirmed and verdicts["kv-replicated-across-tp"] is Verdict.confirmed
    first = findings.do_first(r)
    assert first is not None and first.finding.id == "kv-replicated-across-tp", first
    text = first.step.text
    # GLM-5-NVFP4 on 8x 96 GB: DP 8 at TP 1 would put ~79.5 GiB of weights on each GPU and leave almost no KV, so the
    # step is DP 4 at TP 2 with EP over all 8 GPUs
    assert "--data-parallel-size 4 --tensor-parallel-size 2 --enable-expert-parallel" in text, text
    for flag in re.findall(r"--[a-z0-9-]+", text):
        assert flag in FLAGS["flags"], f"{flag} is not a flag of vllm serve 0.34.0"
    g = first.step.gain
    assert g is not None and g.throughput_x is not None and g.model and not g.upper_bound, g
    assert 1.0 < g.throughput_x <= 1.5, g
    # the factor is the measured pool's arithmetic: n x (1 - (n - 1)/TP x other weights / pool)
    model = next(ev.values for h in r.hypotheses for ev in h.evidence if ev.probe == "model.config")
    server = next(ev.values for h in r.hypotheses for ev in h.evidence if ev.probe == "vllm.server")
    pool = server["kv_capacity_tokens"] * model["latent_kv_bytes_per_token_fp8"] / 2**30
    assert g.factor == pytest.approx(4 * (1 - model["dense_weights_gib"] * 3 / (8 * pool)), rel=1e-6)
    assert 2.0 < g.factor < 2.6  # ~2.3: the KV capacity DP 4 gives
    # no step offered names a refuted hypothesis
    refuted = {h.id for h in r.hypotheses if h.verdict is Verdict.refuted}
    for step in findings.ranked_steps(r):
        named = set(re.findall(r"`([a-z0-9-]+)`", step.step.text))
        assert not (named & refuted), (step.step.text, named & refuted)


def test_replicated_latent_kv_is_true_not_limiting_below_the_wall(below_the_wall: Results) -> None:
    r = below_the_wall
    hyps = {h.id: h for h in r.hypotheses}
    assert hyps["kv-cache-wall"].verdict is Verdict.refuted
    fact = hyps["kv-replicated-across-tp"]
    assert fact.verdict is Verdict.confirmed and fact.limiting is False, (fact.verdict, fact.reason)
    assert "kv-cache-wall" in (fact.not_limiting_note or "")
    assert "kv-replicated-across-tp" in [h.id for h in findings.not_limiting(r)]
    # a fact that limits nothing here is no root cause and offers no step
    assert "kv-replicated-across-tp" not in [f.id for f in findings.walk(findings.findings(r))]
    assert all(s.finding.id != "kv-replicated-across-tp" for s in findings.ranked_steps(r))
