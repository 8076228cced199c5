"""Streamed trace analysis against plain `json.load` + naive classification of the same ~100 MB trace.

Run: python benchmarks/trace_analysis.py [--mb 100] [--keep PATH]
It writes one SGLang-shaped Kineto trace (gzip; ~1/5 of the events are GPU kernels, the rest
`python_function`, `cpu_op` and `cuda_runtime` rows as a with_stack capture has), then runs each
side in its own child process so peak RSS is each one's own: the baseline loads the whole JSON and
classifies every kernel event by walking the shipped rules; ours streams it (gpu_runbook.trace).
Targets (issue 12): at least 2x faster and at most a third of the baseline's peak memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KERNELS = [
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, ...> >(...)",
    "apply_shuffle_mul_sum_kernel", "shuffleRowsKernel", "compute_problem_sizes", "_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2",
    "nvjet_tst_128x64_64x6_2x1_v_bz_TNT", "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)", "cvt_fp16_to_fp4",
    "void sglang::cross_device_reduce_2stage<__nv_bfloat16, 8>(...)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul> >(...)",
]  # fmt: skip
PY = ["python/sglang/srt/models/glm4_moe.py(512): forward", "torch/nn/modules/module.py(1736): _call_impl",
      "python/sglang/srt/layers/moe/fused_moe.py(88): fused_experts", "<built-in method empty of type object at 0x7f>"]  # fmt: skip


def block(d: dict) -> str:
    return "  {\n    " + json.dumps(d)[1:-1] + "\n  }"


def generate(path: Path, target_mb: float) -> int:
    """Kineto's layout; returns the number of kernels written."""
    rng = random.Random(1)
    written, kernels, t, corr = 0, 0, 0.0, 0
    limit = int(target_mb * 1e6)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        head = '{\n  "schemaVersion": 1,\n  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},\n  "traceEvents": [\n'
        f.write(head)
        written += len(head)
        first = True
        while written < limit:
            parts = []
            for py in rng.sample(PY, 2):
                parts.append(block({"ph": "X", "cat": "python_function", "name": py, "pid": 1, "tid": 1, "ts": round(t, 3), "dur": 20.5,
                                    "args": {"Python parent id": 11, "Python id": corr, "Ev Idx": corr}}))  # fmt: skip
            parts.append(block({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": round(t + 1, 3), "dur": 3.0,
                                "args": {"External id": corr, "Record function id": 0, "Ev Idx": corr}}))  # fmt: skip
            parts.append(block({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": round(t + 2, 3),
                                "dur": 4.0, "args": {"External id": corr, "cbid": 211, "correlation": corr}}))  # fmt: skip
            name = KERNELS[rng.randrange(len(KERNELS))]
            d = round(rng.uniform(2, 80), 3)
            parts.append(block({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": round(t + 6, 3), "dur": d,
                                "args": {"External id": corr, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": corr,
                                         "registers per thread": 128, "shared memory": 49152, "blocks per SM": 1.5,
                                         "warps per SM": 6.0, "grid": [148, 1, 1], "block": [384, 1, 1], "est. achieved occupancy %": 9}}))  # fmt: skip
            text = (",\n" if not first else "") + ",\n".join(parts)
            first = False
            f.write(text)
            written += len(text)
            kernels += 1
            corr += 1
            t += d + 8.0
        f.write('\n  ],\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": 1700000000000000000\n}\n')
    return kernels


def child(mode: str, path: str) -> None:
    """Runs in a fresh process: one side of the comparison, then its time and own peak RSS as JSON."""
    import resource

    from gpu_runbook.trace.rules import classifier

    t0 = time.perf_counter()
    if mode == "baseline":
        cls = classifier()
        with gzip.open(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
        totals: dict[str, float] = {}
        spans = []
        for ev in doc["traceEvents"]:
            if ev.get("cat") != "kernel":
                continue
            m = cls._first(ev["name"], "kernel")  # naive: every event walks the rules, no cache
            totals[m.bucket] = totals.get(m.bucket, 0.0) + ev["dur"]
            spans.append((ev["ts"], ev["ts"] + ev["dur"]))
        spans.sort()
        busy, cur = 0.0, None
        for s, e in spans:
            if cur is None or s > cur[1]:
                busy += (cur[1] - cur[0]) if cur else 0.0
                cur = [s, e]
            else:
                cur[1] = max(cur[1], e)
        busy += (cur[1] - cur[0]) if cur else 0.0
        kernels = len(spans)
    else:
        from gpu_runbook.trace.analysis import analyze_rank

        r = analyze_rank(path, classifier(), steps_hint=1)
        totals, busy, kernels = r.bucket_us, r.busy_us, r.kernels
    dt = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"seconds": dt, "peak_rss_mb": rss_mb, "kernels": kernels, "busy_us": busy,
                      "comm_us": totals.get("communication", 0.0)}))  # fmt: skip


def run_child(mode: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=100.0, help="uncompressed trace size to generate")
    ap.add_argument("--keep", type=Path, default=None, help="write the trace here and keep it")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    tmp = None
    path = a.keep
    if path is None:
        tmp = tempfile.mkdtemp(prefix="runbook-bench-trace-")
        path = Path(tmp) / "bench-TP-0-DECODE.trace.json.gz"
    t0 = time.perf_counter()
    n = generate(path, a.mb)
    print(f"trace: {a.mb:g} MB uncompressed, {path.stat().st_size / 1e6:.1f} MB gzip, {n:,} kernels; written in {time.perf_counter() - t0:.1f} s")
    try:
        base = run_child("baseline", path)
        ours = run_child("stream", path)
    finally:
        if tmp is not None:
            path.unlink(missing_ok=True)
            os.rmdir(tmp)
    assert base["kernels"] == ours["kernels"], (base, ours)
    assert abs(base["busy_us"] - ours["busy_us"]) < 1e-3 * base["busy_us"] and abs(base["comm_us"] - ours["comm_us"]) < 1e-3 * max(1, base["comm_us"])
    speed = base["seconds"] / ours["seconds"]
    mem = ours["peak_rss_mb"] / base["peak_rss_mb"]
    print(f"json.load + naive classify: {base['seconds']:.2f} s, peak RSS {base['peak_rss_mb']:.0f} MB")
    print(f"gpu_runbook.trace (streamed):    {ours['seconds']:.2f} s, peak RSS {ours['peak_rss_mb']:.0f} MB")
    print(f"speed-up {speed:.2f}x (target >= 2x) {'ok' if speed >= 2 else 'MISSED'}; "
          f"memory {mem:.2f} of baseline (target <= 0.33) {'ok' if mem <= 1 / 3 else 'MISSED'}")  # fmt: skip


if __name__ == "__main__":
    main()
