"""The GPU backend: which library a run reads (NVML, amdsmi or neither), the guarded amdsmi import, and a runbook's
GPU jobs resolving to the vendor found (issue 37, acceptance 3)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_runbook.amdsmi_lib import Amdsmi, AmdsmiUnavailable, import_amdsmi
from gpu_runbook.gpu_backend import GpuBackend, detect
from gpu_runbook.nvml import Nvml
from gpu_runbook.registry import NOT_FOR_GPU
from gpu_runbook.sim import fake_amdsmi, fake_nvml

# What `import amdsmi` does without ROCm (amd.md §1.2, reproduced with amdsmi 7.0.2, 6.4.3 and 6.2.4): two lines on
# stdout, then KeyError from amdsmi_wrapper.py. This double does the same, from the first place Python looks.
BROKEN_AMDSMI = textwrap.dedent('''
    print("/opt/rocm/lib/libamd_smi.so: cannot open shared object file: No such file or directory")
    print("Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager")
    raise KeyError("libamd_smi.so")
''')


@pytest.fixture
def broken_amdsmi_dir(tmp_path: Path) -> Path:
    pkg = tmp_path / "broken" / "amdsmi"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(BROKEN_AMDSMI, encoding="utf-8")
    return tmp_path / "broken"


def test_a_broken_amdsmi_import_prints_nothing_and_says_what_it_printed(broken_amdsmi_dir, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(broken_amdsmi_dir))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    with pytest.raises(AmdsmiUnavailable) as caught:
        import_amdsmi()
    assert capsys.readouterr().out == ""  # the two lines went to the report, not to stdout
    assert caught.value.cause == "KeyError"
    assert caught.value.found.startswith("KeyError: 'libamd_smi.so' (it printed: /opt/rocm/lib/libamd_smi.so: cannot open")
    assert "amdsmi" not in sys.modules


def test_a_failed_import_is_tried_once(broken_amdsmi_dir, monkeypatch):
    init = broken_amdsmi_dir / "amdsmi" / "__init__.py"
    init.write_text("open(__file__ + '.tries', 'a').write('x')\n" + BROKEN_AMDSMI, encoding="utf-8")
    monkeypatch.syspath_prepend(str(broken_amdsmi_dir))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    amd = Amdsmi()
    for _ in range(3):
        with pytest.raises(AmdsmiUnavailable, match="KeyError"):
            amd.ensure_init()
    assert (broken_amdsmi_dir / "amdsmi" / "__init__.py.tries").read_text() == "x"


def test_neither_library_says_which_were_looked_for():
    found = detect(GpuBackend(nvml=Nvml(fake_nvml.make_module(fake_nvml.no_driver_box())), amdsmi=Amdsmi()))
    assert found.vendor is None
    assert found.words.startswith("no GPU library answered; looked for NVML (NVMLError_LibraryNotFound) and amdsmi (")


def test_amdsmi_answers_where_nvml_does_not():
    host = fake_amdsmi.FakeAmdHost(gpus=[_gpu(0), _gpu(1)])
    found = detect(GpuBackend(nvml=Nvml(fake_nvml.make_module(fake_nvml.no_driver_box())), amdsmi=Amdsmi(fake_amdsmi.make_module(host))))
    assert (found.vendor, found.words) == ("amd", "2 AMD GPUs through amdsmi (NVML: NVMLError_LibraryNotFound)")


def test_gpu_jobs_resolve_to_the_vendor_found(registry):
    assert registry.for_target("gpu.sample", "sglang", "amd").name == "amd.sample"
    assert registry.for_target("gpu.inventory", "vllm", "amd").name == "amd.inventory"
    assert registry.for_target("gpu.sample", "sglang", "nvidia").name == "gpu.sample"
    assert registry.for_target("gpu.sample", "sglang", None).name == "gpu.sample"  # none found: NVML's reasons say more
    assert registry.for_target("amd.sample", "sglang", "nvidia").name == "gpu.sample"  # and back
    activity = registry.for_target("gpu.activity", "sglang", "amd")
    assert activity.name == "gpu.activity" and activity is not registry.probes["gpu.activity"]  # a stand-in


async def test_a_job_with_no_probe_for_the_vendor_says_so(registry):
    ev = await registry.for_target("gpu.dcgm", "sglang", "amd")().run(None, None)
    assert ev.status.value == "unavailable"
    assert ev.reason == f"{NOT_FOR_GPU}: gpu.dcgm reads NVIDIA GPUs only and no AMD probe does its job"


def _gpu(i: int) -> fake_amdsmi.FakeAmdGpu:
    return fake_amdsmi.FakeAmdGpu(index=i, market_name="AMD Instinct MI300X", gfx_target="gfx942", device_id="0x74a1",
                                  memory_total_bytes=192 << 30, power_cap_w=750, default_power_cap_w=750, min_power_cap_w=0,
                                  max_power_cap_w=750, max_gfx_mhz=2100, max_mem_mhz=1300, idle_gfx_mhz=142, pcie_gen=5,
                                  pcie_width=16, pcie_gen_current=5, pcie_width_current=16)  # fmt: skip


# --- acceptance 3: the CLI on this machine, with and without a broken amdsmi first on PYTHONPATH -----------------

def _run_cli(tmp_path: Path, name: str, pythonpath: str | None) -> tuple[list[str], dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RUNBOOK_PATH")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    where = tmp_path / f"run-{name}"
    where.mkdir()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "runbook"), "run", "host-sanity", "--server-url", "http://127.0.0.1:9", "--no-tui",
         "--json", "out.json", "--report", "out.md"],
        env=env, cwd=where, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = [line.replace(str(where), "<dir>") for line in proc.stdout.splitlines()]
    return lines, json.loads((where / "out.json").read_text(encoding="utf-8"))


def _steady(lines: list[str]) -> list[str]:
    """The lines without their clock and durations (two runs differ in those only)."""
    return [re.sub(r"\d+(\.\d+)?s\b", "Ns", re.sub(r"^\[\s*[\d.]+s\]\s*", "", line)) for line in lines]


def _judged(results: dict) -> dict:
    """Verdicts, reasons, evidence and probe records without their times."""
    def scrub(x):
        if isinstance(x, dict):
            return {k: scrub(v) for k, v in x.items() if k not in ("started_at", "finished_at", "duration_s")}
        return [scrub(v) for v in x] if isinstance(x, list) else x
    return {"hypotheses": scrub(results["hypotheses"]), "probes": scrub(results["probes"])}


def test_a_broken_amdsmi_changes_nothing_but_the_gpu_line(tmp_path, broken_amdsmi_dir):
    if Path("/dev/nvidia0").exists() or Path("/dev/kfd").exists():
        pytest.skip("this machine has GPUs: the run would find them")
    clean_lines, clean = _run_cli(tmp_path, "clean", None)
    broken_lines, broken = _run_cli(tmp_path, "broken", str(broken_amdsmi_dir))
    gpu_clean = [x for x in clean_lines if "] gpus: " in x]
    gpu_broken = [x for x in broken_lines if "] gpus: " in x]
    assert len(gpu_clean) == len(gpu_broken) == 1
    assert "looked for NVML (" in gpu_clean[0] and "amdsmi (not installed)" in gpu_clean[0]
    assert "amdsmi (KeyError: 'libamd_smi.so' (it printed: /opt/rocm/lib/libamd_smi.so" in gpu_broken[0]
    assert not any("Unable to find libamd_smi.so" in x for x in broken_lines if x not in gpu_broken)  # nothing printed raw
    assert [x for x in _steady(clean_lines) if "gpus: " not in x] == [x for x in _steady(broken_lines) if "gpus: " not in x]
    assert _judged(clean) == _judged(broken)
    assert clean["target"]["gpu_found"] != broken["target"]["gpu_found"]
    assert {k: v for k, v in clean["target"].items() if k != "gpu_found"} == {k: v for k, v in broken["target"].items() if k != "gpu_found"}
