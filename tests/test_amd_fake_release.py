"""The fake amdsmi follows the released amdsmi 7.0.2: every function it offers exists there with as many
parameters, and returns exactly the keys the release's function builds (engine/sim/data/amdsmi_interface_7.0.2.json,
extracted from the wheel by scripts/extract-amdsmi-interface)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from gpu_runbook.sim import fake_amdsmi as A
from gpu_runbook.sim import fake_nvml as F

RELEASE = json.loads((Path(A.__file__).parent / "data" / f"amdsmi_interface_{A.RELEASE}.json").read_text(encoding="utf-8"))
FUNCTIONS = RELEASE["functions"]


def _gpu(i: int) -> A.FakeAmdGpu:
    g = A.FakeAmdGpu(index=i, market_name="AMD Instinct MI300X", gfx_target="gfx942", device_id="0x74a1", memory_total_bytes=192 << 30,
                     power_cap_w=750, default_power_cap_w=750, min_power_cap_w=0, max_power_cap_w=750, max_gfx_mhz=2100,
                     max_mem_mhz=1300, idle_gfx_mhz=142, pcie_gen=5, pcie_width=16, pcie_gen_current=5, pcie_width_current=16)  # fmt: skip
    g.load = F.Reading(power_w=500.0, gpu_util_pct=90, sm_clock_mhz=2100, mem_clock_mhz=1300)
    return g


def _module():
    process = {"name": "python3", "pid": 1, "mem": 0, "engine_usage": {"gfx": 0, "enc": 0},
               "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 0}, "cu_occupancy": "N/A"}  # fmt: skip
    m = A.make_module(A.FakeAmdHost(gpus=[_gpu(0), _gpu(1)], processes=[process]))
    m.amdsmi_init(m.AmdSmiInitFlags.INIT_AMD_GPUS)
    return m


FAKE = sorted(n for n in dir(_module()) if n.startswith("amdsmi_"))


def test_the_data_is_the_release_the_fake_names():
    assert RELEASE["release"] == A.RELEASE and RELEASE["file"] == "amdsmi/amdsmi_interface.py"
    assert len(FUNCTIONS) > 150 and "amdsmi_get_violation_status" in FUNCTIONS  # the whole interface was read


@pytest.mark.parametrize("name", FAKE)
def test_each_function_exists_in_the_release_with_as_many_parameters(name):
    m = _module()
    assert name in FUNCTIONS, f"{name} is not in amdsmi {A.RELEASE}"
    ours = [p for p in inspect.signature(getattr(m, name)).parameters.values() if p.kind is not p.VAR_POSITIONAL]
    assert len(ours) == len(FUNCTIONS[name]["params"]), (name, FUNCTIONS[name]["params"])


def _keys(x) -> list[str]:
    out: list[str] = []
    items = x if isinstance(x, list) else [x]
    for item in items:
        if isinstance(item, dict):
            for k, v in item.items():
                out.append(k)
                out += _keys(v)
    return list(dict.fromkeys(out))


@pytest.mark.parametrize("name", [n for n in FAKE if FUNCTIONS.get(n, {}).get("keys")])
def test_each_result_has_exactly_the_releases_keys(name):
    m = _module()
    h0, h1 = m.amdsmi_get_processor_handles()
    args = {1: (h0,), 2: (h0, h1)}[len(FUNCTIONS[name]["params"])]
    if name == "amdsmi_get_clock_info":
        args = (h0, m.AmdSmiClkType.GFX)
    assert set(_keys(getattr(m, name)(*args))) == set(FUNCTIONS[name]["keys"])
