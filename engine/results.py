"""The results of a run: the one model the JSON file, the report and the TUI all read.

The JSON is the boundary to other tools (diffs between runs, dashboards), so it is versioned
(`schema_version`) and its field names are a contract. Version 2 added what re-judging and diffing
need: the runbook's text and hash (`runbook_source`, `runbook_sha256`), `record_all`, and
`rejudged_from`. Files of version 1 load as they are (the new fields take their defaults).
"""

from __future__ import annotations

import functools
import hashlib
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from .depth import NOT_AT_DEPTH
from .evidence import Block, ProbeStatus
from .model import Reference, Severity, Verdict
from .target import probe_role

SCHEMA_VERSION = "2"
KNOWN_VERSIONS = {"1", "2"}


class ResultsError(ValueError):
    """A file that is not (or not yet) a results file this engine can read; the message names the file."""


MAX_RESULTS_BYTES = 32 * 1024 * 1024  # a run with every probe's series is ~1 MB; parsing costs ~5x the file in memory
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(name: str, limit: int = 64) -> str:
    """A runbook name from a results file as a file-name stem: letters, digits, `.`, `_`, `-`, no leading dot,
    never a path (a crafted `../escaped/PWNED` becomes `escaped-PWNED`)."""
    stem = _UNSAFE_NAME.sub("-", name).strip("-.")[:limit].strip("-.")
    return stem or "runbook"


@functools.lru_cache(maxsize=8)  # a fleet's every host hashes the same runbook text
def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
SEVERITY_ORDER = {Severity.critical: 0, Severity.warning: 1, Severity.info: 2}


def load_outcome(report: dict[str, Any]) -> str:
    """One line for every renderer: what the load generator got through, including the requests still
    streaming when the window closed (at high concurrency that can be all of them)."""
    from .numbers import quantity  # noqa: PLC0415 - results stays importable without the renderers' helpers

    running = int(report.get("cancelled") or 0)
    completed = int(report.get("completed") or 0)
    parts = [f"{completed:,} requests completed"]
    if running:
        parts.append(f"{running:,} still in flight at the end" + (" (each outlived the window: not a failure)" if not completed else ""))
    parts.append(f"{int(report.get('failed') or 0):,} failed")
    steady = report.get("steady_output_tokens_per_s")
    if steady is not None:  # the one throughput the report and the JSON quote (Results.throughput)
        parts.append(f"{quantity(float(steady), 'tok/s')} output, steady state over the {quantity(float(report.get('steady_window_s') or 0), 's')} sampling window")
    else:
        parts.append(f"{float(report.get('output_tokens_per_s') or 0):,.0f} output tokens/s")
    return ", ".join(parts)


class GainEstimate(BaseModel):
    """An estimated effect of a next step, with the arithmetic shown: never a measurement."""

    kind: str  # "kv_capacity" or "step_share"
    factor: float | None = None  # the runbook's factor, evaluated on this run's evidence
    throughput_x: float | None = None  # estimated output throughput / measured, at this run's load, when it could be worked out
    potential_x: float | None = None  # the same with enough concurrent requests (only the server's own limits)
    arithmetic: str = ""  # the steps from the measured numbers to the estimate, in words
    assumes: str = ""
    range_x: list[float] | None = None  # [low, high] of throughput_x from the step-time model's uncertainty
    model: str = ""  # the fitted step-time model, shown with the gain
    upper_bound: bool = False  # no step-time model: throughput_x assumes a constant step, so it is an upper bound


class StepResult(BaseModel):
    text: str
    applies: bool | None = True  # False: its `when` was false, so it is not offered; None: could not tell
    when: str | None = None
    reason: str = ""  # why it does not apply (or could not be told)
    gain: GainEstimate | None = None


class Throughput(BaseModel):
    """The one output throughput every renderer quotes, with what it is."""

    output_tokens_per_s: float
    window_s: float
    definition: str  # e.g. "output tokens/s counted by the client over the 15 s sampling window, after warm-up"


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
    # Added for findings a person acts on (optional: results written before them still read).
    follows: list[str] = Field(default_factory=list)  # ids this finding is a consequence of
    headline: str = ""  # the confirmed finding's first line with its numbers, as every renderer prints it
    headline_values: dict[str, Any] = Field(default_factory=dict)  # each headline field's CEL source -> its value
    steps: list[StepResult] = Field(default_factory=list)  # next steps, each with whether it applies and its gain
    rerun: str | None = None  # "rejudged" or "remeasured" when a re-run decided it again; None: the run did
    cost: float | None = None  # share of the measured decode step this confirmed cause explains (ranks root causes)
    limiting: bool | None = None  # False: confirmed, but changes nothing at this load (not a root cause, no first step)
    not_limiting_note: str = ""  # why not, with the load at which it would start to matter
    needs: list[str] = Field(default_factory=list)  # what judging it needs beyond a look: load, profile, sweep (gpu_runbook.depth)
    depth_note: str = ""  # what this run's depth did not give it ("needs load ... at --depth quick"); "" when nothing


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
    # schema 2: the runbook that made the run, so it can be re-judged and diffed without the file
    runbook_sha256: str = ""
    runbook_source: str = ""
    record_all: bool = False  # the probes of skipped branches ran too (their evidence is on the skipped nodes)
    rejudged_from: dict[str, Any] | None = None  # set by `runbook rejudge`: the results file and runbook it re-decided
    throughput: Throughput | None = None  # steady-state output throughput (absent in results from before it)
    reruns: list[RerunRecord] = Field(default_factory=list)  # branch re-runs after the run, in order
    depth: str = "standard"  # --depth: quick (no load, no profile), standard, deep (gpu_runbook.depth)
    next_command: str | None = None  # the command for the next depth, with the same target and params
    # how the root causes are ordered (gpu_runbook.findings.ranking_basis): "profile" where a decode profile measured
    # the causes' shares of the step, "configuration" (severity, then the runbook's order) where none did, and why
    ranked_by: Literal["profile", "configuration"] | None = None
    ranked_by_reason: str = ""

    def by_id(self, hypothesis_id: str) -> HypothesisResult | None:
        return next((h for h in self.hypotheses if h.id == hypothesis_id), None)

    def scope(self, hypothesis_id: str) -> dict[str, EvidenceRecord]:
        """The evidence a rule of the hypothesis sees: its ancestors', then its own (as the runner builds it)."""
        chain: list[HypothesisResult] = []
        node = self.by_id(hypothesis_id)
        while node is not None:
            chain.append(node)
            node = self.by_id(node.parent) if node.parent else None
        out: dict[str, EvidenceRecord] = {}
        for h in reversed(chain):
            out.update({ev.alias: ev for ev in h.evidence})
        return out

    def confirmed(self) -> list[HypothesisResult]:
        """Confirmed findings, most severe first, then in tree order."""
        found = [h for h in self.hypotheses if h.verdict is Verdict.confirmed]
        return sorted(found, key=lambda h: SEVERITY_ORDER[h.severity])

    def with_confirmed_descendant(self) -> set[str]:
        """Ids of the hypotheses that have a confirmed hypothesis somewhere below them."""
        parents = {h.id: h.parent for h in self.hypotheses}
        found: set[str] = set()
        for h in self.hypotheses:
            if h.verdict is Verdict.confirmed:
                parent = parents.get(h.id)
                while parent is not None:
                    found.add(parent)
                    parent = parents.get(parent)
        return found

    def causes(self) -> list[HypothesisResult]:
        """Confirmed findings with no confirmed descendant: the deepest explanations, where the fixes are."""
        below = self.with_confirmed_descendant()
        return [h for h in self.confirmed() if h.id not in below]

    def counts(self) -> dict[str, int]:
        out = {v.value: 0 for v in Verdict}
        for h in self.hypotheses:
            out[h.verdict.value] += 1
        return out

    def unmeasured(self) -> list[ProbeCallRecord]:
        """The first call of each probe that did not return evidence (unavailable or failed): what the
        run could not see, which is what an inconclusive verdict needs to be read against. A call the run's
        depth left out is not among them: the depth line says what the tier does not run."""
        seen: dict[str, ProbeCallRecord] = {}
        for call in self.probes:
            if (call.reason or "").startswith(NOT_AT_DEPTH):
                continue
            if call.status is not ProbeStatus.ok and call.probe not in seen:
                seen[call.probe] = call
        return list(seen.values())

    def no_gpu_seen(self) -> bool:
        """NVML itself was missing: on a machine without a GPU, --simulate is what works."""
        return not self.target.get("simulated") and any("NVMLError_LibraryNotFound" in (c.reason or "") for c in self.unmeasured())

    def inventory(self) -> dict[str, Any]:
        """What the run learned about the target: the first ok evidence of the inventory-like probes. The server's
        configuration is whichever server probe read it (`sglang.server`, `vllm.server`, or its role `server.config`),
        the GPUs' whichever GPU family did (`gpu.inventory`, `amd.inventory`)."""
        out: dict[str, Any] = {}
        wanted = {"host.info": "host", "gpu.inventory": "gpus", "model.config": "model"}
        for h in self.hypotheses:
            for ev in h.evidence:
                key = wanted.get(probe_role(ev.probe) or ev.probe) or ("server" if probe_role(ev.probe) == "server.config" else None)
                if key and key not in out and ev.status is ProbeStatus.ok:
                    out[key] = ev.values
        return out

    def scrubbed(self, secrets: list[str] | tuple[str, ...] = ()) -> "Results":
        """These results with control characters stripped from every string and `secrets` redacted (gpu_runbook.scrub)."""
        from .scrub import scrub_tree  # noqa: PLC0415

        data = self.model_dump()
        clean = scrub_tree(data, secrets)
        return self if clean == data else type(self).model_validate(clean)

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read_json(cls, path: str | Path) -> "Results":
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))


def read_results(path: str | Path) -> Results:
    """Read a results file of any known schema version; a ResultsError names the file and the problem."""
    from pydantic import ValidationError  # noqa: PLC0415

    try:
        text = _read_capped(Path(path))
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ResultsError(f"{path}: not a runbook results file: not UTF-8 text") from None
    try:
        results = Results.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ResultsError(f"{path}: not a runbook results file: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    if results.schema_version not in KNOWN_VERSIONS:
        raise ResultsError(f"{path}: schema_version {results.schema_version} is newer than this engine reads ({', '.join(sorted(KNOWN_VERSIONS))}); upgrade runbook")
    return results.scrubbed()  # a results file's strings are data: no escape sequences reach a terminal or a report


def _read_capped(path: Path) -> str:
    """The file's text, refused past MAX_RESULTS_BYTES (counted as read, so a growing file or a FIFO is bounded too)."""
    from .files import FileLimitError, read_text_capped  # noqa: PLC0415

    try:
        return read_text_capped(path, MAX_RESULTS_BYTES, "MAX_RESULTS_BYTES")
    except FileLimitError as exc:
        raise ResultsError(f"{exc} (not a runbook results file this engine reads)") from None
