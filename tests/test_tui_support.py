"""Shared by the TUI tests: a tiny runbook and probe file written to tmp_path, run by the real engine.

The `test.power` probe waits on a gate the test opens, so a test can stop the run at a known
point (one verdict in, one node running) and look at the screen there.

The snapshots' log lists sibling probes in the order they finish. That order is fixed only because
`test.memory` and `test.broken` return without awaiting (a step ahead of the 10 ms and 20 ms
sleepers): give either an `await` and the snapshots start to depend on timing.
"""

from __future__ import annotations

import asyncio
import textwrap
import time
from pathlib import Path
from typing import Callable

from gpu_runbook.loader import load
from gpu_runbook.probe import Target
from gpu_runbook.registry import Registry
from gpu_runbook.runner import Runner

PROBES = '''
import asyncio
from typing import ClassVar

from gpu_runbook.evidence import Bars, Evidence, Series, Table
from gpu_runbook.probe import Probe


class Info(Probe):
    name = "test.info"
    description = "host facts, at once"

    async def run(self, ctx, params):
        await asyncio.sleep(0.01)
        return Evidence(
            summary="vm: kvm, 2 CPUs",
            values={"virtual": True, "cpu_count": 2},
            blocks=[Table(title="Host", columns=["field", "value"], rows=[["virtualization", "kvm"], ["cpus", 2]])],
        )


class Power(Probe):
    name = "test.power"
    description = "GPU power against the limit; waits for the test's gate"
    gate: ClassVar = None

    async def run(self, ctx, params):
        if Power.gate is not None:
            await Power.gate.wait()
        await asyncio.sleep(0.01)
        return Evidence(
            summary="2 GPUs at 97% of their 600 W limit",
            values={"draw_ratio": 0.97, "gpu_count": 2},
            blocks=[
                Bars(title="Power draw vs limit", unit="W", bars=[("GPU0", 585.0, 600.0), ("GPU1", 580.0, 600.0)]),
                Series(title="Power, GPU0", unit="W", points=[(i * 0.5, 400.0 + (i % 8) * 25.0) for i in range(40)]),
            ],
        )


class Psu(Probe):
    name = "test.psu"
    description = "PSU rating"

    async def run(self, ctx, params):
        await asyncio.sleep(0.02)
        return Evidence(summary="PSU 2400 W", values={"watts": 2400.0})


class Broken(Probe):
    name = "test.broken"
    description = "always raises"

    async def run(self, ctx, params):
        raise RuntimeError("sensor went away")


class Memory(Probe):
    name = "test.memory"
    description = "free GPU memory"

    async def run(self, ctx, params):
        return Evidence(summary="12% free", values={"free_ratio": 0.12})
'''

RUNBOOK = """
name: tui-demo
title: Are the demo GPUs starved of power?
description: A small tree for the TUI tests, run by the real engine with test probes.
hypotheses:
  - id: virtualized
    title: The server runs inside a virtual machine
    why: Passthrough GPUs usually lose peer-to-peer.
    probes:
      host: { probe: test.info }
    confirm: host.virtual
    refute: "!host.virtual"
    severity: info
    next_steps: Check GPU peer-to-peer with `nvidia-smi topo -p2p r`.
  - id: power-capped
    title: The GPUs run at their power limit
    why: A GPU drawing its enforced limit throttles its clocks; throughput stops scaling with load.
    probes:
      power: { probe: test.power }
    confirm: power.draw_ratio > 0.9
    refute: power.draw_ratio <= 0.9
    severity: critical
    next_steps: Raise the limit with `nvidia-smi -pl`, or check the PSU and cooling.
    children:
      - id: psu-undersized
        title: The PSU cannot feed every GPU at full power
        probes:
          psu: { probe: test.psu }
        confirm: psu.watts < 3000.0
        refute: psu.watts >= 3000.0
        severity: warning
        next_steps: Fit a PSU rated for the GPUs' total board power.
      - id: sensor-broken
        title: The power sensor reads garbage
        probes:
          sensor: { probe: test.broken }
        confirm: sensor.bad
        severity: warning
  - id: memory-tight
    title: KV cache memory is nearly full
    probes:
      mem: { probe: test.memory }
    confirm: mem.free_ratio < 0.05
    refute: mem.free_ratio >= 0.05
    severity: warning
    children:
      - id: cache-evictions
        title: The server evicts KV cache under load
        probes:
          mem2: { probe: test.memory }
        confirm: mem2.free_ratio < 0.01
        severity: warning
"""


def write_demo(tmp: Path) -> tuple[Path, Path]:
    probes = tmp / "probes"
    probes.mkdir(exist_ok=True)
    (probes / "tui_test_probes.py").write_text(textwrap.dedent(PROBES), encoding="utf-8")
    runbook = tmp / "tui-demo.yaml"
    runbook.write_text(RUNBOOK, encoding="utf-8")
    return runbook, probes


def make_runner(tmp: Path, *, gated: bool = False) -> tuple[Runner, Registry]:
    """A Runner over the demo runbook; with `gated`, test.power waits until `open_gate(registry)`."""
    runbook, probes = write_demo(tmp)
    registry = Registry.discover([probes])
    loaded = load(runbook, registry)
    registry.probes["test.power"].gate = asyncio.Event() if gated else None
    return Runner(loaded, registry, Target()), registry


def open_gate(registry: Registry) -> None:
    gate = registry.probes["test.power"].gate
    if gate is not None:
        gate.set()


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Let the app and the runner work until `condition` holds (the runner shares the app's loop)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)
