"""Scenario files: every bundled one validates, broken ones fail with FILE:LINE:COL, the host lives for a `with`."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import httpx
import pytest

from gpu_runbook.loader import LoadError
from gpu_runbook.sim.host import SimulatedHost
from gpu_runbook.sim.scenario import available_scenarios, load_scenario

BROKEN = Path(__file__).parent / "scenarios_broken"
BUNDLED = {"seed-rtx-pro-6000-tp8", "seed-rtx-pro-6000-tp8-vm", "healthy-h200-nvlink", "admin-power-cap", "thermal-slowdown", "running-cap-64", "idle-gpus"}


def test_bundled_scenarios_are_listed_and_valid():
    found = available_scenarios()
    assert BUNDLED <= set(found)
    for name in found:
        sc = load_scenario(name)
        assert sc.name == name, f"{found[name]}: name differs from the file name"


@pytest.mark.parametrize(
    ("file", "expected"),
    [
        ("01-unknown-key.yaml", ["01-unknown-key.yaml:8:3: unknown key 'powr'"]),
        (
            "02-bad-values.yaml",
            [
                "02-bad-values.yaml:5:23: gpu.compute_capability:",
                "02-bad-values.yaml:9:5: gpu.power: limit_enforced_w 900.0 is outside [200.0, 700.0]",
                "02-bad-values.yaml:15:8: gpu.p2p:",
                "02-bad-values.yaml:18:25: server.max_total_num_tokens:",
            ],
        ),
        ("03-yaml-syntax.yaml", ["03-yaml-syntax.yaml:3:4: YAML syntax error"]),
    ],
)
def test_broken_scenarios_report_positions(file, expected):
    with pytest.raises(LoadError) as info:
        load_scenario(BROKEN / file)
    lines = [str(e) for e in info.value.errors]
    assert len(lines) == len(expected), lines
    for line, want in zip(lines, expected):
        assert want in line, (line, want)


def test_unknown_scenario_name_lists_the_available_ones():
    with pytest.raises(LoadError, match="no scenario named 'nope'.*seed-rtx-pro-6000-tp8"):
        load_scenario("nope")


def test_admin_cap_must_be_within_board_limits(tmp_path):
    text = (Path(available_scenarios()["admin-power-cap"])).read_text().replace("admin_power_cap_w: 350", "admin_power_cap_w: 150")
    f = tmp_path / "cap.yaml"
    f.write_text(text)
    with pytest.raises(LoadError, match=r"cap.yaml:\d+:\d+: .*admin_power_cap_w 150.0 is outside"):
        load_scenario(f)


def test_host_serves_the_model_dir_and_cleans_up():
    with SimulatedHost.start("seed-rtx-pro-6000-tp8") as host:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert soft == hard or soft >= 4096  # raised for 1024+ streams (to the hard limit where it can)
        info = httpx.get(host.url + "/get_server_info", timeout=5).json()
        model_dir = Path(info["model_path"])
        cfg = json.loads((model_dir / "config.json").read_text())
        assert cfg["n_routed_experts"] == 256 and cfg["num_experts_per_tok"] == 8
        assert info["tp_size"] == 8 and info["quantization"] == "modelopt_fp4" and info["max_total_num_tokens"] == 495488
        models = httpx.get(host.url + "/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == "zai-org/GLM-5-NVFP4"
        lib = host.nvml.ensure_init()
        h = lib.nvmlDeviceGetHandleByIndex(0)
        assert lib.nvmlDeviceGetCount() == 8
        assert lib.nvmlDeviceGetName(h) == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
        assert lib.nvmlDeviceGetCudaComputeCapability(h) == (12, 0)
        assert lib.nvmlDeviceGetEnforcedPowerLimit(h) == 600_000
        # The 235 W state is the LXC container, where P2P works (the KVM guest's NS is the -vm scenario).
        assert lib.nvmlDeviceGetP2PStatus(h, lib.nvmlDeviceGetHandleByIndex(1), 0) == lib.NVML_P2P_STATUS_OK
        assert lib.nvmlDeviceGetVirtualizationMode(h) == lib.NVML_GPU_VIRTUALIZATION_MODE_NONE
        assert 80_000 < lib.nvmlDeviceGetPowerUsage(h) < 90_000  # idle
        report = host.report()
        assert report["scenario"] == "seed-rtx-pro-6000-tp8" and "server_cpu_seconds" in report
        assert host.api_key is None
    assert not model_dir.exists()
