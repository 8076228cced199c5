"""The results of a run: the one model the JSON file, the report and the TUI all read.

The JSON is the boundary to other tools (diffs between runs, dashboards), so it is versioned
(`schema_version`) and its field names are a contract.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .evidence import Block, ProbeStatus
from .model import Reference, Severity, Verdict

SCHEMA_VERSION = "1"
SEVERITY_ORDER = {Severity.critical: 0, Severity.warning: 1, Severity.info: 2}


def load_outcome(report: dict[str, Any]) -> str:
    """One line for every renderer: what the load generator got through, including the requests still
    streaming when the window closed (at high concurrency that can be all of them)."""
    running = int(report.get("cancelled") or 0)
    parts = [f"{int(report.get('completed') or 0):,} requests completed"]
    if running:
        parts.append(f"{running:,} still in flight at the end")
    parts.append(f"{int(report.get('failed') or 0):,} failed")
    parts.append(f"{float(report.get('output_tokens_per_s') or 0):,.0f} output tokens/s")
    return ", ".join(parts)


class EvidenceRecord(BaseModel):
    alias: str
    probe: str
    status: ProbeStatus
    reason: str | None = None
    summary: str = ""
    values: dict[str, Any] = Field(default_factory=dict)
    blocks: list[Block] = Field(default_factory=list)
    under_load: bool = False


class HypothesisResult(BaseModel):
    id: str
    parent: str | None
    depth: int = 0
    title: str
    verdict: Verdict
    reason: str
    severity: Severity
    why: str = ""
    rule: str | None = None  # the rule source that decided, when one did
    rule_values: dict[str, Any] = Field(default_factory=dict)  # the values that rule read
    evidence: list[EvidenceRecord] = Field(default_factory=list)
    next_steps: str = ""
    references: list[Reference] = Field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    rerun: str | None = None  # "rejudged" or "remeasured" when a re-run decided it again; None: the run did


class RerunRecord(BaseModel):
    """One re-run of a branch (the TUI's `r` / `R`), so a file written after it says what changed and how."""

    hypothesis: str
    mode: str  # "rejudge": the rules again on the evidence recorded before; "remeasure": the probes run again
    rejudged: list[str] = Field(default_factory=list)  # decided again on recorded evidence
    remeasured: list[str] = Field(default_factory=list)  # decided on evidence measured in the re-run
    kept: list[str] = Field(default_factory=list)  # not re-decided (the re-run was stopped): the earlier verdict stands
    interrupted: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None


class ProbeCallRecord(BaseModel):
    probe: str
    params: dict[str, Any] = Field(default_factory=dict)
    under_load: bool = False
    status: ProbeStatus
    reason: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_s: float = 0.0
    used_by: list[str] = Field(default_factory=list)  # "hypothesis-id:alias"


class Results(BaseModel):
    schema_version: str = SCHEMA_VERSION
    runbook: str
    title: str = ""
    runbook_path: str = ""
    started_at: datetime
    finished_at: datetime | None = None
    duration_s: float = 0.0
    interrupted: bool = False
    target: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    hypotheses: list[HypothesisResult] = Field(default_factory=list)
    probes: list[ProbeCallRecord] = Field(default_factory=list)
    load: dict[str, Any] | None = None  # the load generator's report, when the run generated load
    timings: dict[str, float] = Field(default_factory=dict)  # load window, probe time summed, wall time
    engine_version: str = ""
    reruns: list[RerunRecord] = Field(default_factory=list)  # branch re-runs after the run, in order

    def by_id(self, hypothesis_id: str) -> HypothesisResult | None:
        return next((h for h in self.hypotheses if h.id == hypothesis_id), None)

    def confirmed(self) -> list[HypothesisResult]:
        """Confirmed findings, most severe first, then in tree order."""
        found = [h for h in self.hypotheses if h.verdict is Verdict.confirmed]
        return sorted(found, key=lambda h: SEVERITY_ORDER[h.severity])

    def causes(self) -> list[HypothesisResult]:
        """Confirmed findings with no confirmed descendant: the deepest explanations, where the fixes are."""
        confirmed = {h.id for h in self.hypotheses if h.verdict is Verdict.confirmed}
        parents = {h.id: h.parent for h in self.hypotheses}
        has_confirmed_child = set()
        for hid in confirmed:
            parent = parents.get(hid)
            while parent is not None:
                has_confirmed_child.add(parent)
                parent = parents.get(parent)
        return [h for h in self.confirmed() if h.id not in has_confirmed_child]

    def counts(self) -> dict[str, int]:
        out = {v.value: 0 for v in Verdict}
        for h in self.hypotheses:
            out[h.verdict.value] += 1
        return out

    def unmeasured(self) -> list[ProbeCallRecord]:
        """The first call of each probe that did not return evidence (unavailable or failed): what the
        run could not see, which is what an inconclusive verdict needs to be read against."""
        seen: dict[str, ProbeCallRecord] = {}
        for call in self.probes:
            if call.status is not ProbeStatus.ok and call.probe not in seen:
                seen[call.probe] = call
        return list(seen.values())

    def no_gpu_seen(self) -> bool:
        """NVML itself was missing: on a machine without a GPU, --simulate is what works."""
        return not self.target.get("simulated") and any("NVMLError_LibraryNotFound" in (c.reason or "") for c in self.unmeasured())

    def inventory(self) -> dict[str, Any]:
        """What the run learned about the target: the first ok evidence of the inventory-like probes."""
        out: dict[str, Any] = {}
        wanted = {"host.info": "host", "gpu.inventory": "gpus", "sglang.server": "server", "model.config": "model"}
        for h in self.hypotheses:
            for ev in h.evidence:
                key = wanted.get(ev.probe)
                if key and key not in out and ev.status is ProbeStatus.ok:
                    out[key] = ev.values
        return out

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read_json(cls, path: str | Path) -> "Results":
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))
