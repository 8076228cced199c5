"""`runbook calibrate` (issue 36 item 1) without a GPU: the real NVML fails here, a fake NVML and a fake load
stand in for the GPU and PyTorch. The fake load sets what the fake GPU reads while it runs (the draws an H200
SXM showed, shared/reference/nvml.md §5.x), so what is written must be what NVML read beside each load."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from gpu_runbook import calibration
from gpu_runbook.calibrate import EXIT_BUSY, EXIT_NO_GPU, UsageProblem, calibrate_main, parse_batches, read_identity
from gpu_runbook.calibrate_torch import TorchLoad, _pci_key
from gpu_runbook.gpu_load import LoadUnavailable, Window
from gpu_runbook.cli import _parser, main
from gpu_runbook.sim import fake_nvml
from gpu_runbook.sim.fake_nvml import FakeGpu, FakeHost, Reading

SW_POWER_CAP = int(pynvml.nvmlClocksEventReasonSwPowerCap)
BOARD = "692-2G520-0280-000"
JITTER_W = 1.5


def h200_box(**host: object) -> FakeHost:
    """One H200 SXM as nvml.md §5.x measured it: 700 W limit, driver 580.159.04, idle."""
    box = fake_nvml.h100_sxm_nvlink_box(1, load=Reading(power_w=75.0, sm_clock_mhz=345, mem_clock_mhz=3201, event_reasons=0x1))
    box.gpus[0] = replace(box.gpus[0], name="NVIDIA H200", memory_total_bytes=143771 << 20, max_mem_clock_mhz=3201)
    box.driver_version = "580.159.04"
    for key, value in host.items():
        setattr(box, key, value)
    return box


def nvml_module(box: FakeHost, board: str | None = BOARD):
    mod = fake_nvml.make_module(box)
    if board is not None:  # the fake has no board part number: nvmlDeviceGetBoardPartNumber raises FunctionNotFound
        mod.nvmlDeviceGetBoardPartNumber = lambda handle: board
    return mod


def h200_reading(kind: str, dtype: str | None, batch: int | None) -> Reading:
    """What the H200 read under each load: the copy 488 W, decode bf16 517 / 546 / 650 W at batch 1 / 8 / 32,
    its 700 W limit from batch 64 (sw_power_cap, SM clock held down), the compute GEMM 692 W."""
    if kind == "copy":
        return Reading(power_w=488.0, gpu_util_pct=100, sm_clock_mhz=1980, mem_clock_mhz=3201)
    rows = 8192 if kind == "compute-gemm" else (batch or 1) * (2 if dtype == "fp8" else 1)
    for upto, watts in ((1, 517.0), (8, 546.0), (32, 650.0)):
        if rows <= upto:
            return Reading(power_w=watts, gpu_util_pct=100, sm_clock_mhz=1980, mem_clock_mhz=3201)
    sm = 1680 if rows <= 64 else 1410
    return Reading(power_w=692.0 if kind == "compute-gemm" else 695.0, gpu_util_pct=100, sm_clock_mhz=sm, mem_clock_mhz=3201,
                   event_reasons=SW_POWER_CAP)


class FakeLoad:
    """A GpuLoad that runs nothing: it sets what the fake GPU reads (± jitter), then waits out the window."""

    def __init__(self, gpu: FakeGpu, dtypes: tuple[str, ...] = ("bf16", "fp8"), fail: set[str] = frozenset()) -> None:
        self.gpu = gpu
        self._dtypes = list(dtypes)
        self.fail = fail
        self.ran: list[str] = []
        self.closed = False
        self.current = gpu.load
        self.reads = 0
        gpu.reading_fn = self._reading

    def _reading(self, gpu: FakeGpu, now: float) -> Reading:
        self.reads += 1
        return replace(self.current, power_w=self.current.power_w + (JITTER_W if self.reads % 2 else -JITTER_W))

    def _run(self, label: str, kind: str, dtype: str | None, batch: int | None, window: Window) -> None:
        if label in self.fail:
            raise RuntimeError(f"CUDA out of memory in {label}")
        self.ran.append(label)
        self.current = h200_reading(kind, dtype, batch)
        window.started()
        deadline = time.monotonic() + window.warmup_s + window.seconds
        while time.monotonic() < deadline:
            time.sleep(0.01)

    def describe(self) -> str:
        return "fake load 1.0"

    def dtypes(self) -> list[str]:
        return list(self._dtypes)

    def notes(self) -> list[str]:
        return ["fp4: left out: compute capability 9.0 has no FP4 tensor cores (Blackwell, 10.0 and later, does)"]

    def copy(self, window: Window) -> dict[str, float]:
        self._run("copy", "copy", None, None, window)
        return {"gbps": 4291.0, "seconds": window.seconds}

    def decode_gemm(self, dtype: str, batch: int, window: Window) -> dict[str, float]:
        self._run(f"decode {dtype} x{batch}", "decode-gemm", dtype, batch, window)
        return {"gbps": 3748.0 if batch == 1 else 3601.0, "tflops": 2 * batch * 3748e9 / 2 / 1e12, "seconds": window.seconds}

    def compute_gemm(self, dtype: str, window: Window) -> dict[str, float]:
        self._run(f"compute {dtype}", "compute-gemm", dtype, None, window)
        return {"tflops": 640.0 if dtype == "bf16" else 1200.0, "rows": 8192.0, "seconds": window.seconds}

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def config_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


def args(*extra: str):
    return _parser().parse_args(["calibrate", "--seconds", "0.2", "--warmup", "0.05", "--batches", "1,8,32,64", *extra])


def written(config_home: Path) -> list[Path]:
    return sorted(config_home.rglob("*")) if config_home.exists() else []


# -- no GPU: one line, exit 3, nothing written -------------------------------------------------------


def test_no_gpu_here_says_so_in_one_line_and_exits_3(config_home, capsys):
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - a machine with a driver would really calibrate
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver: the real NVML works")
    assert main(["calibrate"]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1
    assert "no GPU here" in err and "NVML" in err and "nothing measured" in err
    assert written(config_home) == []


@pytest.mark.parametrize(
    ("box", "said"),
    [
        (fake_nvml.no_driver_box(), "NVMLError_LibraryNotFound"),
        (fake_nvml.no_driver_box(pynvml.NVML_ERROR_DRIVER_NOT_LOADED), "NVMLError_DriverNotLoaded"),
        (FakeHost(gpus=[]), "NVML sees no device"),
    ],
)
def test_no_driver_or_no_device_exits_3_naming_which(box, said, config_home, capsys):
    load = FakeLoad(h200_box().gpus[0])
    assert calibrate_main(args(), nvml_module=fake_nvml.make_module(box), load=load) == EXIT_NO_GPU
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and said in err
    assert load.ran == [] and written(config_home) == []


def test_no_pytorch_exits_3_naming_pytorch(config_home, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert calibrate_main(args(), nvml_module=nvml_module(h200_box())) == EXIT_NO_GPU
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert "PyTorch is not importable here" in err and "pip install torch" in err
    assert written(config_home) == []


def test_pytorch_without_a_cuda_device_exits_3(config_home, capsys, monkeypatch):
    fake_torch = SimpleNamespace(__version__="2.11.0+cpu", version=SimpleNamespace(cuda=None),
                                 cuda=SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert calibrate_main(args(), nvml_module=nvml_module(h200_box())) == EXIT_NO_GPU
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "PyTorch 2.11.0+cpu sees no CUDA device" in err and "CPU-only build" in err


def test_pytorch_not_seeing_nvmls_gpu_is_said(monkeypatch):
    """CUDA_VISIBLE_DEVICES or CUDA's own order can hide NVML's GPU: it is matched by UUID or PCI bus id, never by index."""
    props = SimpleNamespace(uuid="00000000-1111-2222-3333-444444444444", pci_domain_id=0, pci_bus_id=0x99, pci_device_id=0)
    fake_torch = SimpleNamespace(__version__="2.11.0", cuda=SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                                                                            get_device_properties=lambda i: props))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    mod = nvml_module(h200_box())
    mod.nvmlInit()
    ident = read_identity(mod, mod.nvmlDeviceGetHandleByIndex(0), 0)
    with pytest.raises(LoadUnavailable, match="is not one PyTorch sees here"):
        TorchLoad.open(ident)
    assert TorchLoad._find(fake_torch, replace(ident, pci_bus_id="00000000:99:00.0")) == 0
    assert TorchLoad._find(fake_torch, replace(ident, uuid="GPU-" + props.uuid, pci_bus_id=None)) == 0
    assert _pci_key("00000000:18:00.0") == (0, 0x18, 0) and _pci_key("garbage") is None


# -- a busy GPU is refused -----------------------------------------------------------------------------


def test_a_gpu_held_by_compute_processes_is_refused_naming_them(config_home, capsys):
    gone = 4194305  # above Linux's largest pid_max: never in /proc
    box = h200_box(compute_pids=[1, gone])
    load = FakeLoad(box.gpus[0])
    assert calibrate_main(args(), nvml_module=nvml_module(box), load=load, busy_grace_s=0.3) == EXIT_BUSY
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert "GPU 0 (NVIDIA H200) is not idle" in err
    comm = Path("/proc/1/comm").read_text().strip() if Path("/proc/1/comm").exists() else "name not readable here"
    assert f"pid 1 ({comm})" in err and f"pid {gone} (name not readable here)" in err
    assert load.ran == [] and written(config_home) == []


def test_a_process_that_leaves_the_gpu_within_the_grace_is_not_a_reason_to_refuse(config_home, capsys):
    """NVML can list a process that has just exited for a moment (a server stopped just before)."""
    box = h200_box(compute_pids=[1])
    mod = nvml_module(box)
    listed = mod.nvmlDeviceGetComputeRunningProcesses
    asked: list[int] = []

    def leaving(handle):
        asked.append(1)
        if len(asked) > 1:
            box.compute_pids = []
        return listed(handle)

    mod.nvmlDeviceGetComputeRunningProcesses = leaving
    load = FakeLoad(box.gpus[0], ("bf16",))
    assert calibrate_main(args("--batches", "1"), nvml_module=mod, load=load, interval_s=0.02, busy_grace_s=30) == 0
    assert "not idle" not in capsys.readouterr().err and load.ran


def test_this_process_on_the_gpu_is_not_a_reason_to_refuse(config_home, capsys):
    box = h200_box(compute_pids=[os.getpid()])
    assert calibrate_main(args("--batches", "1"), nvml_module=nvml_module(box), load=FakeLoad(box.gpus[0], ("bf16",)), interval_s=0.02) == 0


# -- with the fake NVML and a fake load: the calibration written ------------------------------------


def test_calibration_records_what_nvml_read_beside_each_load(config_home, capsys):
    box = h200_box()
    load = FakeLoad(box.gpus[0])
    assert calibrate_main(args(), nvml_module=nvml_module(box), load=load, interval_s=0.02) == 0
    out, err = capsys.readouterr()
    assert err == ""
    files = list((config_home / "gpu-runbook" / "calibration").glob("*.json"))
    assert len(files) == 1 and files[0].name == "nvidia-h200-692-2g520-0280-000-580.159.04-700w.json"
    assert out.splitlines()[-1] == f"Calibration: {files[0]}"
    assert "fp4: left out" in out
    cal = calibration.read(files[0])

    assert (cal.gpu_name, cal.board_part_number, cal.driver_version, cal.power_limit_w) == ("NVIDIA H200", BOARD, "580.159.04", 700.0)
    assert cal.serial is None  # the fake has no serial number: an unsupported field is left out, not invented
    assert cal.host == socket.gethostname() and cal.gpu_index == 0 and cal.library == "fake load 1.0"
    assert cal.measured_at.endswith("+00:00") and cal.measured_at[:4].isdigit()
    assert load.ran == ["copy"] + [f"decode {d} x{b}" for d in ("bf16", "fp8") for b in (1, 8, 32, 64)] + ["compute bf16", "compute fp8"]
    assert load.closed
    assert len(cal.loads) == len(load.ran)
    assert sum("FLOP/B" in line for line in out.splitlines()) == len(load.ran)  # one line per load as it finished

    by = {(p.kind, p.dtype, p.batch): p for p in cal.loads}
    for (kind, dtype, batch), point in by.items():
        want = h200_reading(kind, dtype, batch)
        assert abs(point.draw_w - want.power_w) <= JITTER_W, (kind, dtype, batch, point.draw_w)
        assert point.draw_p95_w is not None and point.draw_p95_w >= point.draw_w
        assert point.sm_mhz == want.sm_clock_mhz and point.mem_mhz == 3201 and point.util_pct == 100
        assert point.samples and point.samples >= 1
        assert point.clock_event_reasons == ({"sw_power_cap": 1.0} if want.event_reasons else {})
    copy = by[("copy", None, None)]
    assert copy.flops_per_byte == 0 and copy.gbps == 4291.0 and copy.tflops is None
    for b in (1, 8, 32, 64):
        assert by[("decode-gemm", "bf16", b)].flops_per_byte == b  # 2 FLOPs per bf16 weight of 2 bytes, per row
        assert by[("decode-gemm", "fp8", b)].flops_per_byte == 2 * b
    assert by[("compute-gemm", "bf16", None)].flops_per_byte == 8192 and by[("compute-gemm", "bf16", None)].tflops == 640.0
    assert by[("compute-gemm", "fp8", None)].flops_per_byte == 16384
    assert [x for x, _ in cal.curve()] == sorted(x for x, _ in cal.curve()) and cal.copy_draw_w == copy.draw_w

    found, problems = calibration.find(calibration.default_dir(), "NVIDIA H200", 700)
    assert problems == [] and found == cal
    assert calibration.find(calibration.default_dir(), "NVIDIA H200", 600)[0] is None  # measured at another limit


def test_json_goes_to_stdout_and_progress_to_stderr(config_home, tmp_path, capsys):
    box = h200_box()
    target = tmp_path / "out" / "h200.json"
    rc = calibrate_main(args("--batches", "1,64", "--json", "--out", str(target)), nvml_module=nvml_module(box, board=None),
                        load=FakeLoad(box.gpus[0], ("bf16",)), interval_s=0.02)
    assert rc == 0
    out, err = capsys.readouterr()
    data = json.loads(out)  # nothing but the JSON on standard output
    assert data["gpu_name"] == "NVIDIA H200" and data["board_part_number"] is None and len(data["loads"]) == 4
    assert calibration.read(target).model_dump(mode="json") == data
    assert f"Calibration: {target}" in err and "decode bf16 x64" in err
    assert written(config_home) == []  # --out named the file: nothing in the default directory


def test_a_failing_load_is_said_and_the_others_are_written(config_home, capsys):
    box = h200_box()
    load = FakeLoad(box.gpus[0], ("bf16",), fail={"decode bf16 x8", "compute bf16"})
    assert calibrate_main(args("--batches", "1,8"), nvml_module=nvml_module(box), load=load, interval_s=0.02) == 0
    err = capsys.readouterr().err
    assert "decode bf16 x8" in err and "not measured: RuntimeError: CUDA out of memory in decode bf16 x8" in err
    cal, _ = calibration.find(calibration.default_dir(), "NVIDIA H200", 700)
    assert cal is not None and [(p.kind, p.batch) for p in cal.loads] == [("copy", None), ("decode-gemm", 1)]


def test_every_load_failing_writes_nothing_and_exits_3(config_home, capsys):
    box = h200_box()
    load = FakeLoad(box.gpus[0], ("bf16",), fail={"copy", "decode bf16 x1", "compute bf16"})
    assert calibrate_main(args("--batches", "1"), nvml_module=nvml_module(box), load=load, interval_s=0.02) == EXIT_NO_GPU
    assert "nothing measured: every load failed" in capsys.readouterr().err
    assert written(config_home) == []


def test_a_gpu_without_a_power_reading_is_not_calibrated(config_home, capsys):
    box = h200_box()
    box.gpus[0].not_supported = {"nvmlDeviceGetPowerUsage"}
    load = FakeLoad(box.gpus[0])
    assert calibrate_main(args(), nvml_module=nvml_module(box), load=load) == EXIT_NO_GPU
    assert "reports no power draw" in capsys.readouterr().err
    assert load.ran == [] and written(config_home) == []


# -- bad input: one line, exit 2 ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--batches", "1,x"], "--batches 1,x: 'x' is not a batch"),
        (["--batches", "0"], "--batches 0: '0' is not a batch"),
        (["--seconds", "0"], "--seconds 0: expected seconds, more than 0 to 600"),
        (["--seconds", "nan"], "--seconds nan"),
        (["--warmup", "-1"], "--warmup -1: expected seconds, 0 to 600"),
        (["--out", ""], "--out: the path is empty"),
    ],
)
def test_bad_input_is_a_one_line_usage_error(extra, said, config_home, capsys):
    assert main(["calibrate", *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and said in err
    assert written(config_home) == []


def test_out_that_is_a_plain_file_or_a_missing_gpu_is_a_usage_error(tmp_path, config_home):
    plain = tmp_path / "notes.txt"
    plain.write_text("x")
    box = h200_box()
    with pytest.raises(UsageProblem, match="not a directory and not a .json file"):
        calibrate_main(args("--out", str(plain)), nvml_module=nvml_module(box), load=FakeLoad(box.gpus[0]))
    with pytest.raises(UsageProblem, match=r"--gpu 3: NVML sees 1 GPU \(index 0\)"):
        calibrate_main(args("--gpu", "3"), nvml_module=nvml_module(box), load=FakeLoad(box.gpus[0]))


def test_batches_are_deduplicated_and_sorted():
    assert parse_batches(None) == (1, 8, 32, 64, 128, 256, 512, 1024, 2048)
    assert parse_batches("64, 1,8,64") == (1, 8, 64)


def test_a_process_arriving_while_it_measures_is_warned_of(config_home, capsys):
    box = h200_box()
    load = FakeLoad(box.gpus[0], ("bf16",))
    original = load.copy

    def copy_then_someone_arrives(window):
        result = original(window)
        box.compute_pids = [1]
        return result

    load.copy = copy_then_someone_arrives
    assert calibrate_main(args("--batches", "1"), nvml_module=nvml_module(box), load=load, interval_s=0.02) == 0
    err = capsys.readouterr().err
    assert "warning: pid 1 (" in err and "started on the GPU while it was measured" in err


def test_a_calibration_that_cannot_be_written_says_so(config_home, capsys, monkeypatch):
    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(calibration, "save", full)
    box = h200_box()
    rc = calibrate_main(args("--batches", "1"), nvml_module=nvml_module(box), load=FakeLoad(box.gpus[0], ("bf16",)), interval_s=0.02)
    assert rc == 2
    err = capsys.readouterr().err
    assert "measured, but cannot write" in err and "No space left on device" in err


def test_the_next_run_on_that_gpu_model_judges_against_the_calibration(config_home, tmp_path, capsys):
    """Issue 36's acceptance 1, end to end: calibrate the (fake) H200, then a run on a host of that GPU model, named
    the calibration, reads it and the report names it; a simulated run without the name does not."""
    box = h200_box()
    assert calibrate_main(args(), nvml_module=nvml_module(box), load=FakeLoad(box.gpus[0]), interval_s=0.02) == 0
    written_file = Path(capsys.readouterr().out.splitlines()[-1].removeprefix("Calibration: "))
    run = ["run", "power-starvation", "--simulate", "healthy-h200-nvlink", "--depth", "quick", "--no-tui", "-q",
           "--json", str(tmp_path / "r.json"), "--report", str(tmp_path / "r.md")]  # fmt: skip
    assert main([*run, "--calibration", str(written_file)]) == 0
    results = json.loads((tmp_path / "r.json").read_text())
    ref = next(ev for h in results["hypotheses"] for ev in h["evidence"] if ev["probe"] == "gpu.reference")
    assert ref["values"]["reference_kind"] == "calibration"
    assert ref["values"]["draw_curve"][-1][0] == 16384.0  # the fp8 compute GEMM's intensity: the whole curve came through
    assert f"runbook calibrate: NVIDIA H200, board {BOARD}, driver 580.159.04, 700 W limit" in (tmp_path / "r.md").read_text()
    assert main(run) == 0  # the same simulated run, the calibration in the user's directory but not named
    ref = next(ev for h in json.loads((tmp_path / "r.json").read_text())["hypotheses"] for ev in h["evidence"] if ev["probe"] == "gpu.reference")
    assert ref["values"]["reference_kind"] == "measured curve"
