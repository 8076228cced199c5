"""One vocabulary: runbooks name roles, each server reads its own variant of a hypothesis, and what was written
before the roles (a runbook naming `sglang.*` probes and fields, a results file recorded then) keeps working."""

from __future__ import annotations

import gzip
import json
import textwrap
from pathlib import Path

import pytest

from gpu_runbook import cli
from gpu_runbook.loader import LoadError, load
from gpu_runbook.registry import Registry
from gpu_runbook.rules import compile_rule, evaluate, to_cel_data

DATA = Path(__file__).parent / "data"
OLD_RUNBOOK = DATA / "power-starvation-before-roles.yaml"  # the bundled runbook as it was before the roles
OLD_RESULTS = DATA / "results-before-roles-vllm.json.gz"  # a vLLM run recorded then: evidence under `sglang.*` names

RUNBOOK = """
name: variants
title: per-server text
hypotheses:
  - id: allreduce
    title: the all-reduce path
    why: neutral words
    probes:
      server: { probe: server.config }
    confirm: server.tp > 2.0
    next_steps:
      - text: neutral step
      - text: sglang-only step
        server: sglang
      - text: a step with a number {{ server.tp | x }}
        when: server.tp > 4.0
    servers:
      vllm:
        why: vLLM's own words
        confirm: server.custom_all_reduce_disabled == true
        next_steps:
          - text: vLLM step one
          - text: vLLM step two at TP {{ server.tp | x }}
            when: server.tp >= 2.0
        references:
          - { title: vLLM source, url: "https://example.invalid/vllm" }
"""


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.discover([])


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_server_reads_its_own_variant_and_never_another_servers_step(tmp_path, registry):
    loaded = load(write(tmp_path, RUNBOOK), registry)
    vllm = loaded.for_server("vllm").runbook.hypotheses[0]
    assert vllm.why == "vLLM's own words" and [s.text for s in vllm.steps] == ["vLLM step one", "vLLM step two at TP {{ server.tp | x }}"]
    assert [r.title for r in vllm.references] == ["vLLM source"] and vllm.servers == {}
    sglang = loaded.for_server("sglang").runbook.hypotheses[0]
    assert sglang.why == "neutral words" and [s.text for s in sglang.steps][:2] == ["neutral step", "sglang-only step"]
    # a kind the runbook has no variant for reads the neutral text, without SGLang's step
    other = loaded.for_server("tgi").runbook.hypotheses[0]
    assert [s.text for s in other.steps][:1] == ["neutral step"] and "sglang-only step" not in [s.text for s in other.steps]
    # not found: asked through the default family (SGLang's probes), so read as SGLang reads it
    assert [s.text for s in loaded.for_server(None).runbook.hypotheses[0].steps] == [s.text for s in sglang.steps]


def test_the_rules_follow_the_variant_and_the_steps_new_places(tmp_path, registry):
    loaded = load(write(tmp_path, RUNBOOK), registry)
    vllm, sglang = loaded.for_server("vllm"), loaded.for_server("sglang")
    assert vllm.rule("allreduce", "confirm").source == "server.custom_all_reduce_disabled == true"
    assert sglang.rule("allreduce", "confirm").source == "server.tp > 2.0"
    # the vLLM list's second step is index 1 there; SGLang's third step (index 2) keeps its rules at its index
    assert vllm.rule("allreduce", "next_steps.1.when").source == "server.tp >= 2.0"
    assert vllm.rule("allreduce", "next_steps.2.when") is None
    assert sglang.rule("allreduce", "next_steps.2.when").source == "server.tp > 4.0"
    # on another kind the SGLang step is gone, so the numbered step moves up to index 1 with its rules
    other = loaded.for_server("tgi")
    assert other.rule("allreduce", "next_steps.1.when").source == "server.tp > 4.0"
    assert other.rule("allreduce", "next_steps.1.text.0").source == "server.tp"


def test_a_variant_rule_is_checked_against_its_own_familys_values(tmp_path, registry):
    bad = RUNBOOK.replace("confirm: server.custom_all_reduce_disabled == true", "confirm: server.sglang_enable_pcie_ipc_allreduce == true")
    with pytest.raises(LoadError) as err:
        load(write(tmp_path, bad), registry)
    text = str(err.value)
    assert "rb.yaml:" in text and "servers.vllm: confirm" in text and "vllm.server has no value 'sglang_enable_pcie_ipc_allreduce'" in text
    # the same field in the neutral rule is valid: SGLang's family returns it
    load(write(tmp_path, RUNBOOK.replace("confirm: server.tp > 2.0", "confirm: server.sglang_enable_pcie_ipc_allreduce == true")), registry)


def test_a_role_runs_the_family_of_the_server_found(registry):
    assert registry.for_target("server.metrics", "vllm").name == "vllm.metrics"
    assert registry.for_target("server.metrics", "sglang").name == "sglang.metrics"
    assert registry.for_target("server.profile", "vllm").name == "vllm.profile"
    assert registry.for_target("server.metrics", None).name == "sglang.metrics"  # not found: its errors say more
    # an old name is the role too
    assert registry.for_target("sglang.server", "vllm").name == "vllm.server"
    assert registry.role_of("vllm.sweep") == registry.role_of("sglang.sweep") == "server.sweep"
    assert registry.role_of("gpu.sample") == "gpu.sample"


def test_release_facts_are_read_from_the_table_of_the_server_found():
    has = compile_rule("has_feature(server, 'pcie-ipc-allreduce')")
    first_vllm = compile_rule("feature_release(server, 'pcie-ipc-allreduce') == '0.30.0'")
    first_sglang = compile_rule("feature_release(server, 'pcie-ipc-allreduce') == '0.5.21'")

    def run(rule, kind, version):
        return evaluate(rule, to_cel_data({"server": {"server_kind": kind, "version": version}})).value

    # vLLM 0.11.0 is later than SGLang's 0.5.21, and still has no PCIe-IPC all-reduce: it came in vLLM 0.30.0
    assert [run(has, "vllm", v) for v in ("0.11.0", "0.29.0", "0.30.0")] == [False, False, True]
    assert [run(has, "sglang", v) for v in ("0.5.20", "0.5.21")] == [False, True]
    assert run(first_vllm, "vllm", "0.11.0") is True and run(first_sglang, "sglang", "0.5.9") is True
    # a bare version reads SGLang's table, as rules written before vLLM did
    assert evaluate(compile_rule("has_feature(server.version, 'pcie-ipc-allreduce')"),
                    to_cel_data({"server": {"version": "0.5.21"}})).value is True


def test_the_runbook_from_before_the_roles_validates_and_runs(tmp_path, capsys):
    assert cli.main(["validate", str(OLD_RUNBOOK)]) == 0
    out = tmp_path / "old.json"
    code = cli.main(["run", str(OLD_RUNBOOK), "--simulate", "seed-rtx-pro-6000-tp8-vllm", "--depth", "quick", "--no-tui", "-q",
                     "--json", str(out), "--report", str(tmp_path / "old.md")])
    assert code == 0
    results = json.loads(out.read_text())
    ran = {p["probe"] for p in results["probes"]}
    assert {"vllm.server", "vllm.metrics"} <= ran and not any(name.startswith("sglang.") for name in ran), ran
    verdicts = {h["id"]: h["verdict"] for h in results["hypotheses"]}
    assert verdicts["p2p-unavailable"] == "refuted" and len(verdicts) == 20


def test_a_results_file_from_before_the_roles_renders_rejudges_and_diffs(tmp_path, capsys):
    old = tmp_path / "before.json"
    old.write_bytes(gzip.decompress(OLD_RESULTS.read_bytes()))
    recorded = json.loads(old.read_text())
    assert "sglang_url" in recorded["target"] and any(p["probe"] == "sglang.metrics" for p in recorded["probes"])
    assert cli.main(["report", str(old), "--out", str(tmp_path / "r.md")]) == 0
    assert "p2p-unavailable" in (tmp_path / "r.md").read_text()
    # re-judged by today's bundled runbook, which names roles: the evidence recorded under sglang.* answers them
    again = tmp_path / "again.json"
    assert cli.main(["rejudge", str(old), "--runbook", "power-starvation", "--json", str(again), "--report", str(tmp_path / "a.md")]) == 0
    before = {h["id"]: h for h in recorded["hypotheses"]}
    after = {h["id"]: h for h in json.loads(again.read_text())["hypotheses"]}
    for hid in ("p2p-unavailable", "low-concurrency", "gpus-underfed", "kv-cache-bf16"):
        assert after[hid]["verdict"] == before[hid]["verdict"], (hid, after[hid]["reason"])
        assert "not recorded" not in after[hid]["reason"]
    assert after["p2p-unavailable"]["verdict"] == "refuted"
    capsys.readouterr()
    assert cli.main(["diff", str(old), str(again)]) == 0
    out = capsys.readouterr().out
    assert "p2p-unavailable" in out or "no verdict changed" in out.lower() or "verdict" in out.lower()


def test_only_the_alias_handling_reads_the_old_url_name():
    """`sglang_url` is an alias: Target accepts and exposes it, the CLI takes `--sglang-url`; nothing else reads it."""
    root = Path(__file__).resolve().parent.parent
    allowed = {Path("engine/target.py"), Path("engine/cli.py")}
    readers = [str(f.relative_to(root)) for folder in ("engine", "probes") for f in sorted((root / folder).rglob("*.py"))
               if "sglang_url" in f.read_text(encoding="utf-8") and f.relative_to(root) not in allowed]
    assert not readers, readers
