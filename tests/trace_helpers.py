"""Small Kineto-shaped traces written by hand, for the trace analysis tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def kernel(name: str, ts: float, dur: float, stream: int = 7, cat: str = "kernel") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": int(ts)}}  # fmt: skip


def span(name: str, ts: float, dur: float, cat: str = "gpu_user_annotation") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 1, "ts": ts, "dur": dur, "args": {}}


def write_trace(path: Path, events: list[dict[str, Any]], rank: int = 0, *, kineto_layout: bool = True) -> Path:
    """Kineto's layout (one event per block, "ph" and "cat" first) or json.dumps(sort_keys=True)."""
    noise = [{"ph": "X", "cat": "python_function", "name": "torch/nn/modules/module.py(1736): _call_impl {x}",
              "pid": 1, "tid": 1, "ts": 0.5, "dur": 1.0, "args": {"Python id": 3}}]  # fmt: skip
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
           "traceEvents": noise + events, "displayTimeUnit": "ms", "baseTimeNanoseconds": 1_700_000_000_000_000_000}  # fmt: skip
    if kineto_layout:
        body = ",\n".join("  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in doc["traceEvents"])
        text = ('{\n  "schemaVersion": 1,\n  "distributedInfo": {"backend": "nccl", "rank": %d, "world_size": 2},\n'
                '  "traceEvents": [\n%s\n  ],\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": 1700000000000000000\n}\n') % (rank, body)
    else:
        text = json.dumps(doc, sort_keys=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path
