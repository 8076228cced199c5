"""The runbook file format, as pydantic models. `runbook schema` prints their JSON Schema for editors."""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ID_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"
ALIAS_PATTERN = r"^[a-z_][a-z0-9_]*$"
PARAM_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
RESERVED_NAMES = {"params", "load", "true", "false", "null", "in", "has", "size"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Severity(str, Enum):
    info = "info"
    warning = "warning"
    critical = "critical"


class Verdict(str, Enum):
    confirmed = "confirmed"
    refuted = "refuted"
    inconclusive = "inconclusive"
    skipped = "skipped"
    error = "error"


ParamType = Literal["int", "float", "bool", "str", "list"]
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "str": (str,),
    "list": (list,),
}


TRUE_WORDS = {"true", "1", "yes", "on"}
FALSE_WORDS = {"false", "0", "no", "off"}


def truthy(value: Any) -> bool:
    """A flag from YAML or a resolved '${param}': booleans as they are, words as --set accepts them."""
    if isinstance(value, str):
        return value.strip().lower() in TRUE_WORDS
    return bool(value)


PARAM_INT_LIMIT = 2**63  # params are 64-bit integers, as in the YAML loader (yamlpos.MAX_INT)


def _shown(value: Any, limit: int = 40) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def coerce_param(kind: str, value: Any) -> Any:
    """Check (and for text from `--set`, convert) one param value. Raises ValueError with a readable message.

    Numbers must be finite and ints must fit in 64 bits: `inf` as a ratio or margin would make every
    comparison a foregone conclusion, and nan makes every comparison false."""
    if isinstance(value, str) and kind != "str":
        text = value.strip()
        try:
            if kind == "int":
                value = int(text)
            elif kind == "float":
                value = float(text)
            elif kind == "bool":
                lowered = text.lower()
                if lowered not in TRUE_WORDS | FALSE_WORDS:
                    raise ValueError
                value = lowered in TRUE_WORDS
            elif kind == "list":
                value = [item.strip() for item in text.split(",") if item.strip()]
        except ValueError:
            raise ValueError(f"expected {kind}, got '{_shown(value)}'") from None
    ok = isinstance(value, _PY_TYPES[kind]) and not (kind in {"int", "float"} and isinstance(value, bool))
    if not ok:
        raise ValueError(f"expected {kind}, got {type(value).__name__} {_shown(repr(value))}")
    if isinstance(value, int) and not isinstance(value, bool) and not -PARAM_INT_LIMIT <= value < PARAM_INT_LIMIT:
        raise ValueError(f"{_shown(value)} does not fit in 64 bits")
    if kind == "float":
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"{_shown(value)} is too large for a float") from None
        if not math.isfinite(value):
            raise ValueError(f"expected a finite float, got {value} (inf and nan are not accepted)")
    return value


class Param(Strict):
    type: ParamType
    default: Any
    description: str = ""

    @model_validator(mode="after")
    def _default_has_type(self) -> "Param":
        self.default = coerce_param(self.type, self.default)
        return self


class ProbeCall(Strict):
    probe: str = Field(description="Dotted probe name, e.g. gpu.sample (see `runbook probes`).")
    with_: dict[str, Any] = Field(default_factory=dict, alias="with", description="Probe parameters; '${param}' refers to a runbook param.")
    under_load: bool = Field(False, description="Sample inside the shared load window.")
    timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="Overrides the probe's own timeout.")


class Reference(Strict):
    title: str
    url: str


class Gain(Strict):
    """What a next step is expected to give, as an expression over the evidence (an estimate, shown
    with its arithmetic): `kv_capacity` multiplies the KV cache's capacity in tokens (-> batch ->
    throughput), `step_share` is the share of the decode step it removes (-> step time)."""

    kind: Literal["kv_capacity", "step_share"]
    factor: str = Field(description="CEL giving a number: the capacity multiplier, or the share of the step (0-1) removed.")
    assumes: str = Field("", description="The assumptions behind the estimate, in words.")


class NextStep(Strict):
    """One next step that can say when it applies and what it should give."""

    text: str = Field(description="The step, in Markdown.")
    when: str | None = Field(None, description="CEL; false -> the step is not offered (e.g. FP8 KV where the KV cache is FP8 already).")
    server: str | None = Field(
        None, pattern=r"^[a-z][a-z0-9_-]*$",
        description="The server kind whose flags the step names (sglang, vllm): against another kind it is left out, not shown as not applying.")
    gain: Gain | None = None
    after: list[str] = Field(
        default_factory=list,
        description="Ids of hypotheses this step builds on (`see kv-cache-wall`): offered only where one of them is confirmed.")


class NotLimiting(Strict):
    """A configuration fact that is true but changes nothing at this load (messages above custom all-reduce's
    limit, a batch above the CUDA-graph limit): not a root cause, not a first step; `says` gives the load at
    which it would start to matter."""

    when: str = Field(description="CEL; true -> the confirmed fact does not limit at this load.")
    says: str = Field("", description="Text with {{ CEL | unit }} fields: why not, and the load at which it would matter.")


HEADLINE_FIELD = re.compile(r"\{\{(?P<expr>.+?)\}\}", re.S)


def headline_parts(text: str) -> list[tuple[str, str]]:
    """The `{{ expr | unit }}` fields of a headline as (CEL source, unit); `||` stays CEL's or."""
    return [(expr, unit) for expr, unit, _ in headline_spans(text)]


def headline_spans(text: str) -> list[tuple[str, str, int]]:
    """As `headline_parts`, with where each expression starts in the text (for error positions)."""
    out = []
    for m in HEADLINE_FIELD.finditer(text):
        expr, unit = m.group("expr"), ""
        cut = next((i for i in range(len(expr) - 1, -1, -1) if expr[i] == "|" and expr[i - 1 : i] != "|" and expr[i + 1 : i + 2] != "|"), None)
        if cut is not None:
            expr, unit = expr[:cut], expr[cut + 1 :].strip()
        out.append((expr.strip(), unit, m.start("expr") + len(expr) - len(expr.lstrip())))
    return out


VARIANT_FIELDS = ("title", "why", "when", "confirm", "refute", "inconclusive", "headline", "cost", "not_limiting",
                  "next_steps", "references")  # fmt: skip


class ServerVariant(Strict):
    """What a hypothesis says and decides on one server kind (`servers: {vllm: {...}}`): its own explanation, rule,
    steps and references, in that server's words and fields. A field left out is the hypothesis's own; `next_steps`
    given here replaces the hypothesis's list on that server."""

    title: str | None = None
    why: str | None = None
    when: str | None = None
    confirm: str | None = None
    refute: str | None = None
    inconclusive: str | None = None
    headline: str | None = None
    cost: str | None = None
    not_limiting: NotLimiting | None = None
    next_steps: Union[str, list[Union[NextStep, str]], None] = None
    references: list[Reference] | None = None


class GpuVariant(Strict):
    """What a hypothesis says on one GPU vendor's hosts (`gpus: {amd: {...}}`): its explanation, steps and references
    in that vendor's words and tools (amd-smi, not nvidia-smi). Text only: the rules read the same GPU concepts on
    every vendor (a headline's fields are checked as the hypothesis's are). A field left out is the hypothesis's own
    (or its server variant's)."""

    title: str | None = None
    why: str | None = None
    inconclusive: str | None = None
    headline: str | None = Field(None, description="The confirmed finding's first line in this vendor's words ({{ CEL | unit }} fields).")
    next_steps: Union[str, list[str], None] = Field(None, description="Markdown text or plain steps (no rules), replacing the hypothesis's.")
    references: list[Reference] | None = None

    def fields_over(self) -> dict[str, Any]:
        """The fields this variant sets, as the hypothesis's own."""
        return {f: getattr(self, f) for f in self.model_fields_set if getattr(self, f) is not None}


GPU_VENDORS = ("nvidia", "amd")


class Hypothesis(Strict):
    id: str = Field(pattern=ID_PATTERN, description="Unique kebab-case id; a contract for other tools.")
    title: str
    why: str = Field("", description="The reasoning, in Markdown: what the evidence means.")
    when: str | None = Field(None, description="CEL precondition; false -> skipped.")
    probes: dict[str, ProbeCall] = Field(default_factory=dict)
    confirm: str = Field(description="CEL rule; true -> confirmed.")
    refute: str | None = Field(None, description="CEL rule; true (and confirm false) -> refuted.")
    inconclusive: str = Field("", description="What it means when the evidence sits between the rules (prefixes the reason).")
    explore: Literal["when-confirmed", "always"] = "when-confirmed"
    fact: bool = Field(
        False,
        description="A fact of the configuration (an MLA model's KV replicated over TP): judged even where its parent is "
        "refuted, and then, when confirmed, reported as true, not limiting at this load (it would matter where the parent holds).",
    )
    severity: Severity | Literal["from-causes"] = Field(
        Severity.warning,
        description="info, warning or critical; `from-causes` for a symptom: as severe as the worst cause confirmed under it (info when none is).",
    )
    next_steps: Union[str, list[Union[NextStep, str]]] = Field(
        "", description="Markdown text, or a list of steps (plain Markdown, or {text, when, gain}).")
    follows: list[str] = Field(
        default_factory=list,
        description="Ids of hypotheses this one is a consequence of: when one of them is confirmed too, the summary lists this under it.",
    )
    headline: str = Field(
        "",
        description="The confirmed finding's first line with its numbers: text with {{ CEL | unit }} fields (units: W, %, share, tok/s, ms, ...).",
    )
    cost: str | None = Field(
        None, description="CEL giving the share (0-1) of the measured decode step this cause explains: root causes rank by it.")
    not_limiting: NotLimiting | None = None
    references: list[Reference] = Field(default_factory=list)
    needs: list[Literal["load", "profile", "sweep", "deep"]] = Field(
        default_factory=list,
        description="What judging it needs beyond a look: `load` (a load we drive), `profile`, `sweep`, `deep` (only "
        "--depth deep runs its calls: a long extra measurement). The run's depth decides what runs (--depth quick runs "
        "none of them and marks such verdicts); the calls its rules read add theirs.",
    )
    servers: dict[str, ServerVariant] = Field(
        default_factory=dict,
        description="Per server kind (sglang, vllm): the explanation, rules, steps and references in that server's words; "
        "a server without an entry gets the hypothesis's own.")
    gpus: dict[Literal["nvidia", "amd"], GpuVariant] = Field(
        default_factory=dict,
        description="Per GPU vendor (nvidia, amd): the explanation, steps and references in that vendor's words and tools; "
        "a vendor without an entry gets the hypothesis's own.")
    children: list["Hypothesis"] = Field(default_factory=list)

    @field_validator("servers")
    @classmethod
    def _server_kinds(cls, servers: dict[str, ServerVariant]) -> dict[str, ServerVariant]:
        for kind in servers:
            if not re.match(r"^[a-z][a-z0-9_-]*$", kind):
                raise ValueError(f"server kind '{kind}' must be a lower-case name (sglang, vllm)")
        return servers

    def own(self, kind: str | None, vendor: str | None = None) -> "Hypothesis":
        """This hypothesis as a server of `kind` on GPUs of `vendor` reads it (children included): its server
        variant's fields over its own, then its GPU variant's, steps for another server left out. `kind` None or
        unknown: the hypothesis's own text, every step kept; `vendor` None: no GPU variant."""
        known = kind not in (None, "unknown")
        variant = self.servers.get(kind) if known and kind is not None else None
        update: dict[str, Any] = {"servers": {}, "gpus": {}, "children": [c.own(kind, vendor) for c in self.children]}
        if variant is not None:
            update.update({f: getattr(variant, f) for f in variant.model_fields_set if getattr(variant, f) is not None})
        gpu_variant = self.gpus.get(vendor) if vendor is not None else None  # type: ignore[call-overload]
        if gpu_variant is not None:
            update.update(gpu_variant.fields_over())
        merged = self.model_copy(update=update)
        if known and not isinstance(merged.next_steps, str):
            merged = merged.model_copy(update={"next_steps": [s for s in merged.next_steps if isinstance(s, str) or s.server in (None, kind)]})
        return merged

    @property
    def steps(self) -> list[NextStep]:
        """next_steps as a list of steps: a Markdown text is one bullet per step (continuations joined)."""
        if isinstance(self.next_steps, str):
            return [NextStep(text=t) for t in split_steps(self.next_steps)]
        return [NextStep(text=s) if isinstance(s, str) else s for s in self.next_steps]

    @property
    def next_steps_text(self) -> str:
        """next_steps as Markdown, whichever form the runbook used."""
        if isinstance(self.next_steps, str):
            return self.next_steps
        return "\n".join(f"- {s.text.strip()}" for s in self.steps)

    @property
    def base_severity(self) -> Severity:
        """The severity before the children are judged (a `from-causes` symptom starts as info)."""
        return Severity.info if self.severity == "from-causes" else self.severity  # type: ignore[return-value]

    @field_validator("probes")
    @classmethod
    def _alias_names(cls, probes: dict[str, ProbeCall]) -> dict[str, ProbeCall]:
        for alias in probes:
            if alias in RESERVED_NAMES:
                raise ValueError(f"probe alias '{alias}' is reserved (reserved: {', '.join(sorted(RESERVED_NAMES))})")
            if not re.match(ALIAS_PATTERN, alias):
                raise ValueError(f"probe alias '{alias}' must be a lower-case identifier: letters, digits and '_'")
        return probes

    def walk(self, parent: "Hypothesis | None" = None):
        yield self, parent
        for child in self.children:
            yield from child.walk(self)


class LoadSpec(Strict):
    """The workload the engine drives while `under_load` probes sample. Fields may be '${param}'."""

    enabled: Union[bool, str] = True
    endpoint: Union[Literal["generate", "completions"], str] = "generate"
    concurrency: Union[int, str] = 64
    input_len: Union[int, str] = 128
    output_len: Union[int, str] = 128
    # output lengths spread over [ratio x output_len, output_len] (LoadConfig.output_range_ratio); 1: all alike
    output_range_ratio: Union[float, str] = 1.0
    ignore_eos: Union[bool, str] = True
    temperature: Union[float, str] = 0.0
    warmup_s: Union[float, str] = 5.0
    # also wait (up to this long) for the load's steady state, its first requests finished and replaced,
    # before the warm-up: a young batch has not yet generated what fills a KV cache. 0: do not wait.
    steady_s: Union[float, str] = 0.0
    max_requests: Union[int, str, None] = None


class ScenarioTest(Strict):
    """An expected verdict per hypothesis id for one simulated scenario (`runbook test`)."""

    scenario: str
    set: dict[str, Any] = Field(default_factory=dict)
    # dotted scenario fields changed for this entry only, e.g. {server.max_total_num_tokens: 60000}: a scaled-down
    # host whose physics (and so whose wall) is reached in seconds; the entry says what it changed
    scenario_set: dict[str, Any] = Field(default_factory=dict)
    expect: dict[str, Verdict]
    # A second verdict accepted for a hypothesis whose measured value sits at its rule's threshold in this
    # scenario, where how well a busy test machine's client keeps the load up decides the side (say why in a
    # comment, with the numbers): the test then still fails on any third verdict.
    also: dict[str, Verdict] = Field(default_factory=dict)
    # whether a confirmed hypothesis limits at this load (false: true but not limiting, see `not_limiting`)
    limiting: dict[str, bool] = Field(default_factory=dict)


class Runbook(Strict):
    name: str = Field(pattern=ID_PATTERN)
    title: str
    description: str = ""
    params: dict[str, Param] = Field(default_factory=dict)
    load: LoadSpec | None = None
    probe_files: list[str] = Field(default_factory=list, description="Local probe files, relative to this runbook.")
    hypotheses: list[Hypothesis] = Field(min_length=1)
    tests: list[ScenarioTest] = Field(default_factory=list)
    depths: dict[Literal["quick", "standard", "deep"], dict[str, Any]] = Field(
        default_factory=dict,
        description="Params each --depth sets (e.g. deep: {profile_steps: 20}); --set still wins over them.",
    )

    def walk(self):
        for root in self.hypotheses:
            yield from root.walk(None)


def split_steps(text: str) -> list[str]:
    """A Markdown next_steps text as steps: each top-level bullet with its continuation lines; a text
    without bullets is one step (its paragraphs)."""
    lines = text.strip().splitlines()
    if not lines:
        return []
    if not any(line.lstrip().startswith(("- ", "* ")) for line in lines):
        return [" ".join(text.split())]
    steps: list[list[str]] = []
    lead: list[str] = []
    for line in lines:
        if line.startswith(("- ", "* ")):
            steps.append([line[2:].strip()])
        elif steps and line.strip():
            steps[-1].append(line.strip())
        elif not steps and line.strip():
            lead.append(line.strip())
    out = [" ".join(s) for s in steps]
    return ([" ".join(lead)] if lead else []) + out


def resolve_refs(value: Any, params: dict[str, Any]) -> Any:
    """Replace '${name}' strings (anywhere in lists and mappings) by the param's value."""
    if isinstance(value, str):
        match = PARAM_REF.match(value.strip())
        if match:
            return params[match.group(1)]
        return value
    if isinstance(value, list):
        return [resolve_refs(v, params) for v in value]
    if isinstance(value, dict):
        return {k: resolve_refs(v, params) for k, v in value.items()}
    return value


def unknown_refs(value: Any, params: dict[str, Any]) -> list[str]:
    if isinstance(value, str):
        match = PARAM_REF.match(value.strip())
        return [match.group(1)] if match and match.group(1) not in params else []
    if isinstance(value, list):
        return [name for v in value for name in unknown_refs(v, params)]
    if isinstance(value, dict):
        return [name for v in value.values() for name in unknown_refs(v, params)]
    return []
