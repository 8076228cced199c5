"""What a decode profile gives on every server: its params, the values from the trace analysis, NVML's PCIe
counters beside the capture, its one-line summary and its blocks. How to start, stop and find a capture is each
family's own (probes/sglang/profile.py, probes/vllm/profile.py)."""

from __future__ import annotations

import asyncio
import os
import statistics
from typing import Any, Literal

from gpu_runbook.plugin import Breakdown, Context, Table
from gpu_runbook.scrub import plain
from gpu_runbook.trace.rules import BUCKETS
from pydantic import BaseModel, ConfigDict, Field

from .. import roofline as rf

SHORT = {"moe_gemm": "moe", "dense_gemm": "gemm", "attention": "attn", "communication": "comm",
         "norm_act_rope": "norm", "quantization": "quant", "memcpy": "memcpy", "other": "other"}  # fmt: skip


class ProfileParams(BaseModel):
    """A decode profile's params, the same on every server (a runbook's `with:` holds for either)."""

    model_config = ConfigDict(extra="forbid")
    num_steps: int = Field(5, ge=1, le=50, description="Decode steps to capture.")
    output_dir: str | None = Field(None, description="Directory on the SERVER's filesystem; a fresh subdirectory is made per capture. Default: this host's temp dir.")
    local_dir: str | None = Field(None, description="Where output_dir is visible on THIS host (a container's mounted volume). Default: output_dir.")
    activities: list[Literal["CPU", "GPU"]] = Field(default_factory=lambda: ["GPU"])
    record_shapes: bool = False
    profile_by_stage: bool | None = Field(None, description=(
        "None: capture 2 x num_steps + 1 forward passes of any mode and tell the decode passes apart inside the capture "
        "(step spans, 0.5.11+; else GPU gaps and prefill-only kernels), because with profile_by_stage a prefill batch "
        "arriving during the decode capture ends it as -EXTEND with no -DECODE file (0.5.10 scheduler_profiler_mixin.py:340-362). "
        "True: ask profile_by_stage and read the -DECODE files (or, after that stop, the -EXTEND ones)."))
    wait_s: float = Field(90.0, gt=0, le=1800, description="How long to wait for every rank's trace after the request.")
    rules: list[str] = Field(default_factory=list, description="Extra bucket-rule YAML files, tried before the shipped rules.")
    gpus: list[int] = Field(default_factory=list, description="NVML indices for the PCIe counters and the GPU model; empty: all.")


def export_pause_s(prof: Any) -> float | None:
    """How long the server spent writing: file mtime minus the end of its last GPU activity (same host clock)."""
    pauses = []
    for r in prof.ranks:
        if r.base_time_ns is None or r.export_end_us is None:
            continue
        end_s = r.base_time_ns / 1e9 + r.export_end_us / 1e6
        try:
            pauses.append(os.stat(r.path).st_mtime - end_s)
        except OSError:
            continue
    return round(max(0.0, max(pauses)), 3) if pauses else None


def profile_values(s: dict[str, Any]) -> dict[str, Any]:
    """Flat names for CEL: `<bucket>_share`, idle, launch-boundness, stragglers, what ran."""
    v: dict[str, Any] = {f"{b}_share": s["shares"][b] for b in BUCKETS}
    dominant = max(BUCKETS, key=lambda b: s["shares"][b])
    v.update(
        ranks=s["ranks"], steps=s["steps"], step_source=s["step_source"], step_ms=s["step_ms"], extend_passes=s.get("extend_passes", 0),
        idle_share=s["idle_share"], idle_ms_per_step=s["idle_ms_per_step"], kernels_per_step=s["kernels_per_step"],
        median_kernel_us=s["median_kernel_us"], unclassified_share=s["unclassified_share"],
        straggler_spread=s["straggler_spread"], slowest_rank=s["slowest_rank"], backends=s["backends"],
        dominant_bucket=dominant, dominant_share=s["shares"][dominant],
        top_kernel=s["top"][0]["name"] if s["top"] else None, top_kernel_share=s["top"][0]["share"] if s["top"] else None,
        per_rank=[{k: p[k] for k in ("rank", "step_ms", "shares", "idle_share", "non_comm_ms_per_step")} for p in s["per_rank"]],
    )  # fmt: skip
    return v


async def gpu_name(ctx: Context, gpus: list[int]) -> str | None:
    def read(lib: Any) -> str | None:
        n = lib.nvmlDeviceGetCount()
        idx = gpus[0] if gpus else 0
        if idx >= n:
            return None
        name = lib.nvmlDeviceGetName(lib.nvmlDeviceGetHandleByIndex(idx))
        return name.decode() if isinstance(name, bytes) else str(name)

    try:
        return await ctx.nvml.call(read)
    except Exception:  # noqa: BLE001 - no NVML: the roofline has no peak, the breakdown still stands
        return None


class PcieSampler:
    """NVML PCIe throughput (KB/s, a 20 ms sample) read every 0.5 s during the capture, mean per GPU.

    Until `gpu.sample` exports cumulative byte counters over the window, rate x window is the byte count.
    """

    def __init__(self, ctx: Context, gpus: list[int]) -> None:
        self.ctx, self.gpus = ctx, gpus
        self.tx: list[float] = []
        self.rx: list[float] = []
        self.task: asyncio.Task[None] | None = None
        self.ok = True

    def _read(self, lib: Any) -> tuple[float, float]:
        n = lib.nvmlDeviceGetCount()
        idx = [i for i in (self.gpus or range(n)) if i < n]
        tx = rx = 0.0
        for i in idx:
            h = lib.nvmlDeviceGetHandleByIndex(i)
            tx += lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_TX_BYTES)
            rx += lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_RX_BYTES)
        return tx / max(1, len(idx)), rx / max(1, len(idx))

    async def _loop(self) -> None:
        while True:
            try:
                tx, rx = await self.ctx.nvml.call(self._read)
                self.tx.append(tx)
                self.rx.append(rx)
            except Exception:  # noqa: BLE001 - no NVML / not supported: no PCIe figure
                self.ok = False
                return
            await asyncio.sleep(0.5)

    async def start(self) -> None:
        self.task = asyncio.create_task(self._loop())

    async def stop(self) -> tuple[float, float] | None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        if not self.tx:
            return None
        return statistics.fmean(self.tx) * 1000, statistics.fmean(self.rx) * 1000  # bytes/s per GPU


def pcie_values(rates: tuple[float, float] | None, window_s: float, s: dict[str, Any], hf: dict[str, Any], tp: int,
                batch: float | None, passes: tuple[float, float] | None = None, passes_source: str = "") -> dict[str, Any]:  # fmt: skip
    """Bytes over the window / decode steps in it: counted passes where exported, else window / step time."""
    step_s = s["step_ms"] / 1000 if s.get("step_ms") else None
    if passes is not None:
        steps, window_s = passes
    else:
        steps = None
    tx = rates[0] * window_s if rates else None
    rx = rates[1] * window_s if rates else None
    out = rf.pcie_per_step(tx_bytes_window=tx, rx_bytes_window=rx, window_s=window_s, decode_steps=steps, step_s=step_s,
                           tokens=batch, hidden=hf.get("hidden_size"), layers=hf.get("num_hidden_layers"), tp=tp)  # fmt: skip
    out["pcie_reading"] = rf.pcie_reading(out["pcie_to_allreduce_ratio"])
    out["decode_steps_source"] = passes_source if passes else "window / measured step time"
    out["pcie_source"] = "nvmlDeviceGetPcieThroughput x window (mean per GPU)" if rates else None
    return out


def summary(v: dict[str, Any]) -> str:
    parts = [f"{SHORT[b]} {v[f'{b}_share'] * 100:.0f}%" for b in ("moe_gemm", "communication", "attention", "dense_gemm") if v[f"{b}_share"] >= 0.01]
    parts.append(f"idle {v['idle_share'] * 100:.0f}%")
    line = f"decode step {v['step_ms']:.1f} ms over {v['ranks']} ranks: " + ", ".join(parts)
    if v.get("roofline_ratio"):
        line += f"; {v['roofline_ratio']:g}x the DRAM roofline"
    if v.get("pcie_to_allreduce_ratio") is not None:
        line += f"; PCIe {v['pcie_to_allreduce_ratio']:g}x the predicted all-reduce bytes"
    if v.get("coverage") is not None:
        line += f"; buckets cover {v['coverage'] * 100:.0f}% of kernel time"
        top = v.get("top_unclassified") or []
        if top:  # the name is data: one line, short (the summary is one line in the TUI and the report)
            name = " ".join(plain(str(top[0]["name"])).split())[:60]
            line += f" (top unclassified: {name} {top[0]['kernel_share'] * 100:.0f}%)"
    return line


def blocks(s: dict[str, Any], v: dict[str, Any]) -> list[Any]:
    segments = list(BUCKETS) + ["idle"]
    rows = [(f"TP-{p['rank']}", [p["shares"][b] for b in BUCKETS] + [p["idle_share"]]) for p in s["per_rank"]]
    blocks: list[Any] = [Breakdown(title=f"Decode step by kernel bucket ({v['step_ms']:.1f} ms per step)", segments=segments, rows=rows)]
    blocks.append(Table(title="Top kernels (mean over ranks)", columns=["kernel", "bucket", "ms/step", "share"],
                        rows=[[t["name"][:90], t["bucket"], t["ms_per_step"], t["share"]] for t in s["top"][:6]]))  # fmt: skip  (all of them in the values)
    blocks.append(Table(title="Roofline and PCIe per decode step (per GPU)", columns=["quantity", "value"], rows=[
        ["step (measured)", f"{v['step_ms']:.1f} ms"],
        ["DRAM roofline step", _fmt(v.get("roofline_step_ms"), "ms")],
        ["bytes per step (weights read + KV)", _fmt(v.get("bytes_per_step_gb"), "GB")
         + (f" (the {v['experts_touched_share']:.0%} of the experts routed to)" if v.get("experts_touched_share") is not None and v["experts_touched_share"] < 0.995 else "")],
        ["achieved DRAM bandwidth", _fmt(v.get("achieved_gbps"), "GB/s") + _share(v.get("bandwidth_share"))],
        ["achieved tensor throughput", _fmt(v.get("achieved_tflops"), "TFLOP/s") + _share(v.get("flops_share"))],
        ["PCIe TX bytes per step", _fmt(v.get("pcie_tx_bytes_per_step"), "B")],
        ["predicted all-reduce bytes per step", _fmt(v.get("allreduce_bytes_per_step_predicted"), "B")],
        ["PCIe / predicted", _fmt(v.get("pcie_to_allreduce_ratio"), "x") + (f": {v['pcie_reading']}" if v.get("pcie_reading") else "")],
        ["server paused writing traces", _fmt(v.get("export_pause_s"), "s")],
        ["backends seen", ", ".join(v.get("backends") or []) or "-"],
    ]))  # fmt: skip
    return blocks


def _fmt(x: Any, unit: str) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and abs(x) >= 1e6 or isinstance(x, int) and abs(x) >= 1e6:
        return f"{x / 1e9:.2f} G{unit}" if unit == "B" else f"{x:.3g} {unit}"
    return f"{x:g} {unit}"


def _share(x: Any) -> str:
    return f" ({x * 100:.1f}% of peak)" if x is not None else ""
