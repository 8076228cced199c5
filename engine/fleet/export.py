"""`runbook fleet NAME --export-rules FILE`: the runbook's fleet-decidable hypotheses as Prometheus alerting rules
(vmalert reads the same file), so the metrics store judges the fleet all the time and pages on it.

Each alert fires for a host exactly where `runbook fleet` over the same window confirms the hypothesis:
- the values are the fleet's own queries (`gpu_queries`, `sglang_queries`, `vllm_queries`: the same text), their
  hosts named from the labels by the same `HostKey` (label_replace, first label present wins, `instance` without its
  port), then combined over GPUs and engines as the fleet probes combine them in Python;
- the rules are the runbook's CEL, as each server kind reads it (`LoadedRunbook.for_server`), compiled to PromQL
  vectors that hold a series exactly where the rule is true. A value missing in the metrics is an absent series,
  which is how CEL's missing values behave in `&&` and `||` (true only where decided true). What the fleet never
  fills (a host-only probe's alias reads `{}`) and the params are constants, folded at export time; values that
  depend only on the GPU model (`gpu.reference`) are worked out per GPU-table row with the engine's own evaluator;
- a child is judged only where its parent is confirmed (or always below an `explore: always` parent), a `when`
  must hold, and `confirm` must be true.
Alerts evaluate their values inline, not through recorded series: vmalert writes a recording rule's result
through remote write, and a rule reading it in the same evaluation would see the last one. The recording rules
(one per value a confirm rule reads) are for the summaries and dashboards.
What cannot be said in PromQL is named with the reason in a comment, never guessed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import yaml
from lark import Token, Tree

from .. import __version__
from ..loader import LoadedRunbook
from ..rules import FUNCTIONS, compile_rule, to_cel_data
from .judge import HOST_ONLY, SERVER_URL_FLAG, _role
from gpu_runbook.probes.gpu_table import gpu_model, gpu_table
from gpu_runbook.probes.gpu_values import reference_for
from gpu_runbook.probes.prometheus.client import HostKey, Sample, Window
from gpu_runbook.probes.prometheus.gpu import DcgmFleet, GpuInventoryFleet, GpuRow, GpuSampleFleet, gpu_queries
from gpu_runbook.probes.prometheus.server import KV_ROOM, SglangMetricsFleet, VllmMetricsFleet, sglang_queries, vllm_queries

STRIP_PORT = r"\[([^]]*)\].*|([^:]*):[^:]*|(.+)"  # client._strip_port as one RE2 (anchored, first alternative wins)
HOST = "host"  # the label every exported series names its host by
KINDS = ("sglang", "vllm")  # a host is vLLM by its series, any other is read as SGLang (registry.DEFAULT_KIND)


class NotExpressible(Exception):
    """A rule, or a value it reads, has no PromQL form here; the message says why."""


# -- host names in PromQL: HostKey's first-label-present-wins, instance without its port ----------------------


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _hosted(expr: str, key: HostKey, keep: tuple[str, ...] = ()) -> str:
    """`expr`'s series grouped by the host `key` names (label `host`) and `keep`: the ways are applied last to first
    into a scratch label, so the first present wins; a series no way names is dropped (the fleet leaves it out)."""
    tmp = "runbook_host"
    out = expr
    for i, way in reversed(list(enumerate(key.ways))):
        names = way.split("/")
        if len(names) > 1:
            variants = [[v for v in (n, n.lower(), n[:1].upper() + n[1:])] for n in names]
            joined = f"runbook_way_{i}"
            for combo in _combos(variants):
                out = f"label_join({out}, {_quote(joined)}, \"/\", {', '.join(_quote(n) for n in combo)})"
                pattern = "/".join(["[^/]+"] * len(names))
                out = f"label_replace({out}, {_quote(tmp)}, \"$1\", {_quote(joined)}, {_quote('(' + pattern + ')')})"
            continue
        for name in dict.fromkeys((names[0], names[0].lower(), names[0][:1].upper() + names[0][1:])):
            if name.lower() == "instance":  # _strip_port: [v6]:port -> v6, host:port -> host, anything else whole
                out = f"label_replace({out}, {_quote(tmp)}, \"$1$2$3\", {_quote(name)}, {_quote(STRIP_PORT)})"
            else:
                out = f"label_replace({out}, {_quote(tmp)}, \"$1\", {_quote(name)}, \"(.+)\")"
    out = f"label_replace({out}, {_quote(HOST)}, \"$1\", {_quote(tmp)}, \"(.*)\")"
    by = ", ".join([HOST, *keep])
    return f"(max by ({by}) ({out}) unless on({HOST}) vector(0))"


def _combos(variants: list[list[str]]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for vs in variants:
        out = [c + [v] for c in out for v in dict.fromkeys(vs)]
    return out


# -- symbolic values: what a CEL expression is, per host, in PromQL -----------------------------------------------

NEVER = ""  # a boolean side that holds on no host


@dataclass(frozen=True)
class Const:
    """Known at export time: a literal, a param, what the fleet never fills (a host-only alias reads {})."""

    value: Any


@dataclass(frozen=True)
class Err:
    """An error on every host (a member the fleet's values lack, a null operand): never true, never false."""

    why: str


@dataclass(frozen=True)
class MaybeNull(Err):
    """Null on some hosts, an error on others: an error to every operator but null's own == and !=."""


@dataclass(frozen=True)
class Num:
    """A number per host (labels {host}) or per GPU ({host, gpu})."""

    q: str
    gpu: bool = False
    hosts: str | None = None  # where its member always exists (null where absent there), when known: null is sayable


@dataclass(frozen=True)
class Bool:
    """A boolean per host (or GPU) as two vectors: where it is true, where it is false (NEVER: nowhere; None: not
    expressible in that sense)."""

    t: str | None
    f: str | None
    gpu: bool = False


@dataclass(frozen=True)
class Path:
    """A value path not yet resolved: an alias's values, a member below (or a GPU of a list: alias '$g')."""

    alias: str
    parts: tuple[str, ...]


def _or(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:  # where one side holds cannot be said, nor where either does
        return None
    if a == NEVER:
        return b
    if b == NEVER:
        return a
    return f"({a} or {b})"


def _and(a: str | None, b: str | None) -> str | None:
    if a == NEVER or b == NEVER:
        return NEVER
    if a is None or b is None:
        return None
    return f"({a} and {b})"


# -- the values the fleet fills, as PromQL ---------------------------------------------------------------------


class Values:
    """Every value path a rule may read, as the fleet probes fill it, in PromQL over one window."""

    def __init__(self, window: Window, gpu_key: HostKey, server_key: HostKey, violation_unit: str) -> None:
        self.window = window
        self.gpu_key, self.server_key = gpu_key, server_key
        self.per_s = 1e6 if violation_unit == "us" else 1e9  # violation_fraction: ns per DCGM's header, us for old exporters
        gq = gpu_queries(window, gpu_key)
        self.g = {name: _hosted(q, gpu_key, ("gpu",)) for name, q in gq.items() if name != "model_name"}
        sq, vq = sglang_queries(window, server_key), vllm_queries(window, server_key)
        self.s = {name: _hosted(q, server_key) for name, q in sq.items() if name != "graph_passes"}
        self.v = {name: _hosted(q, server_key) for name, q in vq.items() if name != "cache_config" and not name.startswith("kv_series")}
        self.sglang_hosts = self.s["running_mean"]  # a host the fleet reads as SGLang: its scheduler gauges
        self.vllm_hosts = f"({self.v['running_mean']} unless on({HOST}) {self.sglang_hosts})"
        self.server_instance = " or ".join(_hosted(q, server_key, ("instance",)) for q in (sq["running_mean"], vq["running_mean"]))
        self.gpus = f"({self.g['power_mean']} or {self.g['util_mean']})"  # a host's GPUs: a GPU row with any reading
        self.shape = _shapes(window)

    # -- GPU side ----------------------------------------------------------------------------------------------
    def _top(self) -> str:
        """max_sm_clock: the exporter's DCGM_FI_DEV_MAX_SM_CLOCK where non-zero, else the GPU table's figure."""
        table = self._per_model(lambda row: row.max_sm_clock_mhz.value if row.max_sm_clock_mhz is not None and row.max_sm_clock_mhz.value else None, gpu=True)
        exported = f"({self.g['max_sm_clock']} != 0)"
        return f"({exported} or on({HOST}, gpu) {table})" if table != NEVER else exported

    def _per_model(self, value_of: Callable[[Any], Any], gpu: bool) -> str:
        """A number per GPU-table row, on the hosts (GPUs) whose model name that row matches (first row wins)."""
        parts, earlier = [], []
        by = f"{HOST}, gpu" if gpu else HOST
        for row in gpu_table().gpus:
            value = value_of(row)
            matcher = _model_matcher(row.match, earlier)
            earlier.extend(row.match)
            if value is None:
                continue
            sel = Window(self.window.seconds, self.window.at, ",".join(x for x in (self.window.matchers, matcher) if x))
            names = _hosted(gpu_queries(sel, self.gpu_key)["model_name"], self.gpu_key, ("gpu",))
            if isinstance(value, str):  # a host-level PromQL value, on the hosts of this model
                parts.append(f"({value} and on({HOST}) max by ({HOST}) ({names}))")
            else:
                parts.append(f"(max by ({by}) ({names}) * 0 + {_num(value)})")
        return " or ".join(parts) if parts else NEVER

    def board_estimate(self, share: float, table_max: float | None) -> str:
        """reference_for's estimate: share x the board maximum (the exporter's largest, else the table's), as
        GpuReferenceFleet reads the board, rounded to 0.1 W."""
        board = f"max by ({HOST}) ({self.g['limit_max']})"
        if table_max is not None:
            board = f"({board} or on({HOST}) (count by ({HOST}) ({self.gpus}) * 0 + {_num(table_max)}))"
        return f"round({_num(share)} * {board}, 0.1)"

    def unknown_model_estimate(self, share: float) -> str:
        """gpu_table's memory_bound_fallback on hosts whose GPU model no row matches: share x the board maximum."""
        known = [m for row in gpu_table().gpus for m in row.match]
        matcher = f"modelName=~\".+\",modelName!~{_quote('(?i).*(' + '|'.join(_re2(m) for m in known) + ').*')}"
        sel = Window(self.window.seconds, self.window.at, ",".join(x for x in (self.window.matchers, matcher) if x))
        names = _hosted(gpu_queries(sel, self.gpu_key)["model_name"], self.gpu_key, ("gpu",))
        return f"(round({_num(share)} * max by ({HOST}) ({self.g['limit_max']}), 0.1) and on({HOST}) max by ({HOST}) ({names}))"

    def gpu_value(self, parts: tuple[str, ...]) -> Any:
        """A member of `power.gpus[]` (GpuSampleFleet's per-GPU dict)."""
        g = self.g
        shape = _walk(self.shape["gpu.sample"]["gpus"][0], parts)
        if not isinstance(shape, _Leaf):
            return shape
        path = ".".join(parts)
        stat = parts[1] if len(parts) == 2 else None
        simple = {"power_limit_enforced_w": "limit_enforced", "power_limit_max_w": "limit_max", "pcie_tx_bytes_per_s": "pcie_tx",
                  "pcie_rx_bytes_per_s": "pcie_rx"}  # fmt: skip
        if path in simple:
            return Num(g[simple[path]], gpu=True)
        one = {"gpu_util_pct": g["util_mean"], "sm_clock_mhz": g["sm_clock_mean"], "mem_clock_mhz": g["mem_clock_mean"],
               "temperature_c": g["temp_mean"], "sm_clock_ratio": f"({g['sm_clock_mean']} / {self._top()})",
               "draw_to_enforced_limit": f"({g['power_mean']} / ({g['limit_enforced']} != 0))",
               "draw_to_max_constraint": f"({g['power_mean']} / ({g['limit_max']} != 0))"}  # _one: every stat is the mean  # fmt: skip
        if parts[0] in one and stat is not None:
            return Num(one[parts[0]], gpu=True)
        if parts[0] == "power_draw_w" and stat is not None:
            if stat == "mean":
                return Num(g["power_mean"], gpu=True)
            return Num(f"(({g['power_' + stat]} or {g['power_mean']}) and {g['power_mean']})", gpu=True)
        if path == "max_sm_clock_mhz":
            return Num(f"floor({self._top()})", gpu=True)
        raise NotExpressible(f"power.gpus[].{path} has no PromQL form in the export yet")

    def _fraction(self, answer: str) -> str:
        """violation_fraction per GPU, then the host's: the largest, only where every GPU has the counter."""
        per = f"clamp_min(clamp_max({self.g[answer]} / {_num(self.window.seconds * self.per_s)}, 1), 0)"
        return f"(max by ({HOST}) ({per}) and on({HOST}) (count by ({HOST}) ({per}) == count by ({HOST}) ({self.gpus})))"

    def _all_gpus(self, q: str, agg: str) -> str:
        return f"({agg} by ({HOST}) ({q}) and on({HOST}) (count by ({HOST}) ({q}) == count by ({HOST}) ({self.gpus})))"

    def sample_value(self, parts: tuple[str, ...]) -> Any:
        """A member of gpu.sample's host-level values (GpuSampleFleet)."""
        shape = _walk(self.shape["gpu.sample"], parts)
        if not isinstance(shape, _Leaf):
            return shape
        path = ".".join(parts)
        pooled = ("draw_to_enforced_limit", "draw_to_max_constraint", "gpu_util_pct", "sm_clock_mhz", "mem_clock_mhz",
                  "sm_clock_ratio", "temperature_c")  # stats over the GPUs' window means  # fmt: skip
        if len(parts) == 2 and parts[0] in pooled:
            return Num(_over_gpus(self.gpu_value((parts[0], "mean")).q, parts[1]))
        if len(parts) == 2 and parts[0] == "power_draw_w":  # mean and p50 of the GPUs' means, their lowest min, ...
            stat = parts[1]
            own = {"mean": "mean", "p50": "mean", "min": "min", "max": "max", "p95": "p95"}[stat]
            return Num(_over_gpus(self.gpu_value(("power_draw_w", own)).q, stat))
        if path == "gpu_count":
            return Num(f"count by ({HOST}) ({self.gpus})")
        if len(parts) == 2 and parts[0] in ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"):  # stats over the GPUs' rates
            return Num(_over_gpus(self.g["pcie_tx" if parts[0].startswith("pcie_tx") else "pcie_rx"], parts[1]))
        if path == "power_limit_enforced_w":
            return Num(self._all_gpus(self.g["limit_enforced"], "min"))
        if path == "power_limit_max_w":
            return Num(self._all_gpus(self.g["limit_max"], "max"))
        if path in ("slowdown_fraction", "event_reasons.sw_thermal_slowdown"):
            return Num(self._fraction("thermal_violation"))
        if path == "event_reasons.sw_power_cap":
            return Num(self._fraction("power_violation"))
        if path == "throttled_fraction":
            return Num(f"clamp_max({self._fraction('power_violation')} + {self._fraction('thermal_violation')}, 1)")
        raise NotExpressible(f"power.{path} has no PromQL form in the export yet")

    def inventory_value(self, parts: tuple[str, ...]) -> Any:
        """A member of gpu.inventory's host-level values (GpuInventoryFleet): what the exporter knows of the GPUs."""
        shape = _walk(self.shape["gpu.inventory"], parts)
        if not isinstance(shape, _Leaf):
            return shape
        path = ".".join(parts)
        if path == "gpu_count":
            return Num(f"count by ({HOST}) ({self.gpus})")
        if path in ("power_limit_enforced_w", "power_limit_requested_w"):
            return Num(self._all_gpus(self.g["limit_enforced" if path == "power_limit_enforced_w" else "limit_requested"], "min"))
        if path == "power_limit_max_w":
            return Num(f"max by ({HOST}) ({self.g['limit_max']})")
        raise NotExpressible(f"inv.{path} has no PromQL form in the export yet")

    def dcgm_value(self, parts: tuple[str, ...]) -> Any:
        """A member of gpu.dcgm's window aggregates (DcgmFleet)."""
        shape = _walk(self.shape["gpu.dcgm"], parts)
        if not isinstance(shape, _Leaf):
            return shape
        path = ".".join(parts)
        g = self.g
        if path == "readings_distinct":  # the fewest distinct DRAM readings over the GPUs: changes() + 1, else 0
            return Num(f"((min by ({HOST}) ({g['prof_dram_changes']}) + 1) or on({HOST}) (count by ({HOST}) ({self.gpus}) * 0))")
        if path == "gpu_count":
            return Num(f"count by ({HOST}) ({self.gpus})")
        per = {"prof_dram_active": "prof_dram", "prof_pipe_tensor_active": "prof_tensor", "prof_sm_active": "prof_sm_active",
               "gpu_util_pct": "util_mean", "sm_clock_mhz": "sm_clock_mean", "mem_clock_mhz": "mem_clock_mean",
               "power_usage_w": "power_mean"}  # stats over the GPUs' window means  # fmt: skip
        if len(parts) == 2 and parts[0] in per:
            return Num(_over_gpus(g[per[parts[0]]], parts[1]))
        raise NotExpressible(f"dcgm.{path} has no PromQL form in the export yet")

    # -- server side -------------------------------------------------------------------------------------------
    def server_value(self, kind: str, parts: tuple[str, ...]) -> Any:
        """A member of server.metrics as the fleet fills it for a host of `kind` (SglangMetricsFleet, VllmMetricsFleet)."""
        shape = _walk(self.shape[kind], parts, sure=1)
        if not isinstance(shape, _Leaf):
            return shape
        out = self._server_value(kind, parts)
        hosts = self.sglang_hosts if kind == "sglang" else self.vllm_hosts
        return Num(out.q, hosts=hosts) if isinstance(out, Num) else out  # every member is there on every such host

    def _server_value(self, kind: str, parts: tuple[str, ...]) -> Any:
        shape = _walk(self.shape[kind], parts, sure=1)
        if not isinstance(shape, _Leaf):
            return shape
        a, hosts = (self.s, self.sglang_hosts) if kind == "sglang" else (self.v, self.vllm_hosts)
        path = ".".join(parts)
        spread = {"running": "running", "queued": "queued", "kv_usage": "kv_usage", "num_running_reqs": "running",
                  "num_queue_reqs": "queued", "token_usage": "kv_usage", "num_used_tokens": "used_tokens"}  # fmt: skip
        if len(parts) == 2 and parts[0] in spread and f"{spread[parts[0]]}_{parts[1]}" in a:
            return Num(f"({a[spread[parts[0]] + '_' + parts[1]]} and on({HOST}) {hosts})")
        dp = f"(({a['dp_ranks']} != 0) or on({HOST}) ({hosts} * 0 + 1))"  # int(dp_ranks or 1)
        if len(parts) == 2 and parts[0] == "running_per_dp" and f"running_{parts[1]}" in a:
            return Num(f"(({a['running_' + parts[1]]} and on({HOST}) {hosts}) / on({HOST}) {dp})")
        if path == "dp_ranks":
            return Num(dp)
        if path == "retractions":
            if kind == "sglang":  # the 0.5.7+ counter appears at the first retraction: absent counts as none
                return Num(f"(({a['retractions']} and on({HOST}) {hosts}) or on({HOST}) ({hosts} * 0))")
            return Num(f"({a['retractions']} and on({HOST}) {hosts})")
        if path in ("generation_tokens_per_s", "prompt_tokens_per_s", "requests_per_s"):
            name = {"generation_tokens_per_s": "gen_tokens_per_s"}.get(path, path)
            return Num(f"({a[name]} and on({HOST}) {hosts})")
        if path in ("gauges_current", "gauges_written_in_window"):
            if kind == "vllm":  # gauge_age's num_used_tokens is not read on vLLM: counted as written, so the group is
                return Bool(hosts, NEVER)
            changed = " or ".join(f"({a[n]} > 0)" for n in ("gauge_changes", "queued_changes", "kv_usage_changes", "used_tokens_changes"))
            written = f"({hosts} and on({HOST}) ({changed}))"
            if path == "gauges_written_in_window":
                return Bool(written, f"({hosts} unless on({HOST}) {written})")
            idle = f"(({a['running_last']} == 0) and on({HOST}) ({a['queued_last']} == 0))"
            current = f"({written} or on({HOST}) ({hosts} and on({HOST}) {idle}))"
            return Bool(current, f"({hosts} unless on({HOST}) {current})")
        if path == "decode_graph_share" and kind == "sglang":  # SglangMetricsFleet: graph / (graph + eager) decode passes
            def mode(m: str) -> str:
                w = Window(self.window.seconds, self.window.at, ",".join(x for x in (self.window.matchers, f'mode="{m}"') if x))
                return _hosted(sglang_queries(w, self.server_key)["graph_passes"], self.server_key)

            graph, eager = mode("decode_cuda_graph"), mode("decode_none")
            decode = f"({graph} + on({HOST}) ({eager} or on({HOST}) ({graph} * 0)))"
            return Num(f"(({graph} and on({HOST}) {hosts}) / on({HOST}) ({decode} != 0))")
        if kind == "vllm" and path in ("running_cap", "max_running_requests", "running_to_cap_p50", "running_to_cap_max", "running_to_cap"):
            # vllm.metrics' pinned cap over the window's second half: running at one number, requests waiting, KV with room
            cap = (f"((({a['pin_running_min']} != 0) and on({HOST}) ({a['pin_running_min']} == on({HOST}) {a['pin_running_max']})) "
                   f"and on({HOST}) ({a['pin_queued_min']} >= 1) and on({HOST}) ({a['pin_kv_max']} < {_num(KV_ROOM)}) and on({HOST}) {hosts})")  # fmt: skip
            if path in ("running_cap", "max_running_requests"):
                return Num(cap)
            stat = {"running_to_cap_p50": "p50", "running_to_cap_max": "max", "running_to_cap": "max"}[path]
            return Num(f"({a['running_' + stat]} / on({HOST}) {cap})")
        raise NotExpressible(f"metrics.{path} ({kind}) has no PromQL form in the export yet")


def _over_gpus(per_gpu: str, stat: str) -> str:
    """gpu_values.stats over a host's GPUs (its percentiles interpolate as PromQL's quantile does)."""
    if stat in ("p50", "p95"):
        return f"quantile by ({HOST}) ({int(stat[1:]) / 100:g}, {per_gpu})"
    return f"{ {'mean': 'avg', 'min': 'min', 'max': 'max'}[stat] } by ({HOST}) ({per_gpu})".strip()


def _num(x: float) -> str:
    return repr(float(x)) if math.isfinite(x) else "NaN"


def _re2(text: str) -> str:
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def _model_matcher(matches: list[str], earlier: list[str]) -> str:
    """gpu_table.gpu_model's choice as label matchers: the row's substrings (any case), none of an earlier row's."""
    out = f"modelName=~{_quote('(?i).*(' + '|'.join(_re2(m) for m in matches) + ').*')}"
    if earlier:
        out += f",modelName!~{_quote('(?i).*(' + '|'.join(_re2(m) for m in earlier) + ').*')}"
    return out


# -- the shapes of the fleet's values: which members exist, which the fleet always leaves null ----------------


class _Leaf:
    """A member the fleet fills with a number or boolean on some host."""


LEAF = _Leaf()


def _walk(shape: Any, parts: tuple[str, ...], sure: int = 0) -> Any:
    """What a path is in the fleet's values: LEAF, Const(None) (always null), Err (no such member, or a null operand:
    MaybeNull where a map above it is itself null on some hosts), or NotExpressible for a map or list.
    `sure`: how many members deep every map is always there."""
    node = shape
    for i, part in enumerate(parts):
        if not isinstance(node, dict):
            return Err(f"{'.'.join(parts[:i])} is {'null' if node is None else 'not a map'} in the fleet's values")
        if part not in node:
            return Err(f"the fleet's values have no {'.'.join(parts[: i + 1])}")
        node = node[part]
    if node is None:
        return Const(None) if len(parts) - 1 <= sure else MaybeNull(f"{'.'.join(parts)} is null (or its map is)")
    if isinstance(node, (dict, list)):
        raise NotExpressible(f"{'.'.join(parts) or 'the values'} is a {'map' if isinstance(node, dict) else 'list'} per host")
    if isinstance(node, str):
        if parts[-1] == "server_kind":
            return Const(node)
        raise NotExpressible(f"{'.'.join(parts)} is a string per host")
    return LEAF


def _shapes(window: Window) -> dict[str, Any]:
    """The fleet probes' own values for a host whose every answer is there (numbers chosen so that every optional
    value is filled): a member null here is null on every host."""
    names = gpu_queries(window, HostKey.parse("host"))
    row = GpuRow("h", "0", {n: 100.0 for n in names if n != "model_name"}, model_name="NVIDIA H100 80GB HBM3")
    sample = GpuSampleFleet().fill({"h": {"0": row}}, window).values["h"]

    def answers(queries: dict[str, str], value: Callable[[str], float]) -> dict[str, list[Sample]]:
        return {n: [Sample({"host": "h", "instance": "h:1", "mode": "decode_cuda_graph", "num_gpu_blocks": "10", "block_size": "16"},
                           value(n))] for n in queries}  # fmt: skip

    sgl = SglangMetricsFleet().fill_servers(answers(sglang_queries(window, HostKey.parse("host")), lambda n: 1.0),
                                            HostKey.parse("host"), window)[0].values["h"]  # fmt: skip
    pin = {"pin_running_min": 8.0, "pin_running_max": 8.0, "pin_queued_min": 2.0, "pin_kv_max": 0.5}
    vll = VllmMetricsFleet().fill_servers(answers(vllm_queries(window, HostKey.parse("host")), lambda n: pin.get(n, 1.0)),
                                          HostKey.parse("host"), window)[0].values["h"]  # fmt: skip
    inventory = GpuInventoryFleet().fill({"h": {"0": row}}, window).values["h"]
    dcgm = DcgmFleet().fill({"h": {"0": row}}, window).values["h"]
    return {"gpu.sample": sample, "gpu.inventory": inventory, "gpu.dcgm": dcgm, "sglang": sgl, "vllm": vll}


# -- CEL to PromQL -------------------------------------------------------------------------------------------------

_CMP = {"relation_lt": "<", "relation_le": "<=", "relation_gt": ">", "relation_ge": ">=", "relation_eq": "==", "relation_ne": "!="}
_NEG = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_ARITH = {"addition_add": "+", "addition_sub": "-", "multiplication_mul": "*", "multiplication_div": "/"}
_PY = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
       "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "+": lambda a, b: a + b, "-": lambda a, b: a - b,
       "*": lambda a, b: a * b, "/": lambda a, b: a / b}  # fmt: skip


class Compiler:
    """One rule of one hypothesis, for hosts of one server kind: CEL (celpy's parse tree) to a Bool."""

    def __init__(self, values: Values, kind: str, aliases: dict[str, str], params: dict[str, Any], source: str,
                 says_null: bool) -> None:  # fmt: skip
        self.values, self.kind, self.aliases, self.params = values, kind, aliases, params
        self.source = source
        self.says_null = says_null
        self.read: dict[str, Num] = {}  # host-level numbers the rule reads (dotted path -> value): the summary's

    # the tree's shape (celpy 0.5's cel.lark): a binary node holds [op_node[lhs], rhs]
    def value(self, node: Any, env: dict[str, Any] | None = None) -> Any:
        env = env or {}
        if isinstance(node, Token):
            raise NotExpressible(f"unexpected token {node!s}")
        d, ch = node.data, node.children
        if d == "expr":
            if len(ch) == 1:
                return self.value(ch[0], env)
            cond = self.resolve(self.value(ch[0], env))
            if isinstance(cond, Const) and isinstance(cond.value, bool):
                return self.value(ch[1] if cond.value else ch[2], env)
            if isinstance(cond, Err):  # an error in the condition is the whole expression's
                return cond
            if isinstance(cond, Bool) and not cond.gpu:  # of two conditions: each where the condition says so
                branches = []
                for c in ch[1:]:
                    x = self.boolean(self.value(c, env))
                    if isinstance(x, Const):
                        raise NotExpressible("a ?: giving a constant on a per-host condition")
                    branches.append(Bool(NEVER, NEVER) if isinstance(x, Err) else x)
                then, other = branches
                if then.gpu or other.gpu:
                    raise NotExpressible("a ?: giving a GPU's condition on a host's")
                return Bool(_or(_and(cond.t, then.t), _and(cond.f, other.t)), _or(_and(cond.t, then.f), _and(cond.f, other.f)))
            raise NotExpressible("a ?: whose condition is a per-host value")
        if d in ("conditionalor", "conditionaland"):
            if len(ch) == 1:
                return self.value(ch[0], env)
            is_or = d == "conditionalor"
            sides: list[Any] = []
            for c in ch:  # CEL's && and || are commutative: a side that decides does so whatever the other is
                try:
                    sides.append(self.boolean(self.value(c, env)))
                except NotExpressible as exc:
                    sides.append(exc)
            for s in sides:
                if isinstance(s, Const) and s.value is is_or:
                    return s
            for s in sides:
                if isinstance(s, NotExpressible):
                    raise s
            return self._logic(sides[0], sides[1], is_or)
        if d in ("relation", "addition", "multiplication", "unary", "member", "primary") and len(ch) == 1:
            return self.value(ch[0], env)
        if d in ("relation", "addition", "multiplication"):
            op_node, rhs = ch
            lhs = self.value(op_node.children[0], env)
            rhs_v = self.value(rhs, env)
            if op_node.data in _CMP:
                return self._compare(_CMP[op_node.data], lhs, rhs_v)
            if op_node.data in _ARITH:
                return self._arith(_ARITH[op_node.data], lhs, rhs_v)
            if op_node.data == "relation_in":
                lhs, rhs_v = self.resolve(lhs), self.resolve(rhs_v)
                for x in (lhs, rhs_v):
                    if isinstance(x, Err):
                        return x
                if isinstance(lhs, Const) and isinstance(rhs_v, Const) and isinstance(rhs_v.value, (list, dict)):
                    return Const(lhs.value in rhs_v.value)
                raise NotExpressible("'in' with a per-host value")
            raise NotExpressible(f"the operator {op_node.data.split('_')[-1]}")
        if d == "unary":
            op, operand = ch
            v = self.value(operand, env)
            if op.data == "unary_not":
                b = self.boolean(v)
                return Const(not b.value) if isinstance(b, Const) else b if isinstance(b, Err) else Bool(b.f, b.t, b.gpu)
            if op.data == "unary_neg":
                v = self.resolve(v)
                if isinstance(v, Const) and isinstance(v.value, (int, float)):
                    return Const(-v.value)
                if isinstance(v, Num):
                    return Num(f"(-{v.q})", v.gpu)
                return v if isinstance(v, Err) else self._fail("a negated non-number")
        if d == "paren_expr":
            return self.value(ch[0], env)
        if d == "literal":
            return Const(_literal(ch[0]))
        if d == "ident":
            name = str(ch[0])
            if name in env:
                return env[name]
            if name == "params":
                return Const(self.params)
            if name in self.aliases:
                role = self.aliases[name]
                if role in HOST_ONLY:
                    return Const({})  # a host-only probe's values: {} in the fleet (its status is unavailable)
                return Path(name, ())
            raise NotExpressible(f"'{name}' is not a probe alias the fleet fills")
        if d == "member_dot":
            base, attr = self.value(ch[0], env), str(ch[1])
            if isinstance(base, Path):
                return Path(base.alias, base.parts + (attr,))
            base = self.resolve(base)
            if isinstance(base, Const):
                if isinstance(base.value, dict):
                    return Const(_cel_value(base.value[attr])) if attr in base.value else Err(f"no member {attr}")
                return Err(f"member {attr} of {base.value!r}")
            return base if isinstance(base, Err) else self._fail("a member of a computed value")
        if d == "member_dot_arg":
            return self._method(ch, env)
        if d == "ident_arg":
            return self._call(node, env)
        if d == "list_lit":
            return self._constant(node, env)
        raise NotExpressible(f"CEL's {d.replace('_', ' ')}")

    def _fail(self, what: str) -> Any:
        raise NotExpressible(what)

    def _text(self, node: Tree) -> str:
        meta = node.meta
        return self.source[meta.start_pos : meta.end_pos]

    def _constant(self, node: Tree, env: dict[str, Any]) -> Any:
        """A subexpression that reads no host value, by the engine's own evaluator."""
        if self._free(node, env) or env:
            raise NotExpressible(f"{self._text(node)!r} is a list or map built from per-host values")
        out = self._eval(self._text(node), {})
        if isinstance(out, Err):
            return out
        import celpy  # noqa: PLC0415

        return Const(json.loads(json.dumps(out, cls=celpy.CELJSONEncoder)))

    def _eval(self, text: str, data: dict[str, Any]) -> Any:
        """`text` by the engine's evaluator over `data`, the params and the host-only aliases ({} in the fleet): the
        CEL value, or Err."""
        from ..cel_budget import evaluate_bounded  # noqa: PLC0415
        from ..rules import activation  # noqa: PLC0415

        rule = compile_rule(text)
        cel = to_cel_data({"params": self.params, **{a: {} for a, r in self.aliases.items() if r in HOST_ONLY}, **data})
        try:
            out = evaluate_bounded(rule.program, cel, activation(cel, rule.names))
        except Exception:  # noqa: BLE001 - an error on every host: never decided
            return Err(f"{text} errs")
        return Err(f"{text} errs") if isinstance(out, Exception) else out

    def _free(self, node: Tree, env: dict[str, Any]) -> set[str]:
        """The per-host aliases a subtree reads (params, host-only aliases and lambda variables excluded)."""
        out = set()
        for sub in node.iter_subtrees():
            if sub.data == "ident":
                name = str(sub.children[0])
                if name in self.aliases and self.aliases[name] not in HOST_ONLY and name not in env:
                    out.add(name)
        return out

    def _call(self, node: Tree, env: dict[str, Any]) -> Any:
        name = str(node.children[0])
        args = node.children[1].children if len(node.children) > 1 else []
        if name == "has":
            target = args[0]
            while isinstance(target, Tree) and target.data != "member_dot" and len(target.children) == 1:
                target = target.children[0]
            if isinstance(target, Tree) and target.data == "member_dot":
                parent = self.value(target.children[0], env)
                if isinstance(parent, Const) and isinstance(parent.value, dict):  # a host-only alias's {}
                    return Const(str(target.children[1]) in parent.value)
            raise NotExpressible(f"has({self._text(args[0])}) of a per-host value")
        if not self._free(node, env):
            return self._constant(node, env)
        refs = {a for a, r in self.aliases.items() if r == "gpu.reference"}
        if name != "interp":
            raise NotExpressible(f"{name}() of per-host values (a metrics store knows no {name})")
        forms: list[tuple[str, Any]] = []
        for arg in args:
            free = self._free(arg, env)
            if free and free <= refs:
                forms.append(("ref", self._text(arg)))
                continue
            v = self.resolve(self.value(arg, env))
            if not isinstance(v, Const):
                raise NotExpressible(f"{name}() of per-host values other than the GPU model's reference")
            forms.append(("const", v.value))
        return self._per_model(name, forms, refs)

    def _per_model(self, fn: str | None, forms: list[tuple[str, Any]], refs: set[str]) -> Any:
        """A function of gpu.reference's values (a function of the GPU model: reference_for) and constants: its value
        on each GPU-table row by the engine's own function, for the hosts of that model; on a model the table does
        not know, the estimate from the board maximum (gpu_table's memory_bound_fallback) where that is what it gives."""
        import celpy  # noqa: PLC0415

        def at(name: str, board: float | None) -> Any:
            args = []
            for kind, x in forms:
                if kind == "const":
                    args.append(celpy.json_to_cel(x))
                    continue
                v = self._eval(x, {a: _reference(name, board) for a in refs})
                if isinstance(v, Err):
                    return v
                args.append(v)
            out = FUNCTIONS[fn](*args) if fn is not None else args[0]
            if isinstance(out, Exception) or out is None:
                return Err(f"{fn} errs")
            try:
                return float(out)
            except (TypeError, ValueError):
                raise NotExpressible(f"{forms[0][1] if fn is None else fn + '()'} is not a number per GPU model") from None

        share = gpu_table().memory_bound_fallback.share
        by_row: dict[str, float | str] = {}
        for row in gpu_table().gpus:
            if gpu_model(row.match[0]) is not row:  # reference_for reads a model by its name: this row's must find it
                raise NotExpressible(f"the GPU table's row {row.id} is found by no name of its own")
            seen = {repr(at(row.match[0], b)) for b in (450.0, 1000.0)}
            if len(seen) == 1:
                v = at(row.match[0], 450.0)
                if isinstance(v, float):
                    by_row[row.id] = v
            elif [at(row.match[0], b) for b in (450.0, 1000.0)] == [round(share * 450.0, 1), round(share * 1000.0, 1)]:
                # no measurement for this model: the estimate from the board maximum (exported, else the table's)
                table_max = row.max_w.value if row.max_w is not None else None
                by_row[row.id] = self.values.board_estimate(share, table_max)
            else:
                raise NotExpressible(f"{fn or forms[0][1]} of the GPU reference depends on the board's power maximum otherwise than the estimate")
        q = self.values._per_model(lambda row: by_row.get(row.id), gpu=False)
        unknown = [at("no such GPU", b) for b in (450.0, 1000.0)]
        if all(isinstance(u, Err) for u in unknown):
            pass
        elif unknown == [round(share * 450.0, 1), round(share * 1000.0, 1)]:
            q = _or(q, self.values.unknown_model_estimate(share)) or NEVER
        else:
            raise NotExpressible(f"{fn or forms[0][1]} of the GPU reference on a GPU model the table does not know")
        return Num(q) if q != NEVER else Err("known for no GPU model")

    def _method(self, ch: list[Any], env: dict[str, Any]) -> Any:
        recv, name = ch[0], str(ch[1])
        args = ch[2].children if len(ch) > 2 else []
        if name not in ("exists", "all"):
            try:
                target = self.resolve(self.value(recv, env))
            except NotExpressible:
                target = None
            if isinstance(target, Err):  # a method of what errs errs (CEL's macros and methods alike)
                return target
            raise NotExpressible(f"the macro or method {name}()")
        target = self.value(recv, env)
        if not (isinstance(target, Path) and self.aliases.get(target.alias) == "gpu.sample" and target.parts == ("gpus",)):
            raise NotExpressible(f"{name}() over {self._text(recv)} (only a host's GPUs, power.gpus, are series)")
        var = str(next(args[0].scan_values(lambda v: isinstance(v, Token))))
        body = self.boolean(self.value(args[1], {**env, var: Path("$g", ())}))
        gpus = self.values.gpus
        count = f"count by ({HOST}) ({gpus})"
        if isinstance(body, Const):  # the same for every GPU: a host with GPUs
            every = f"count by ({HOST}) ({gpus})"
            return Bool(every, NEVER) if body.value else Bool(NEVER, every)
        if isinstance(body, Err):
            return body
        if not body.gpu:
            raise NotExpressible(f"{name}() whose condition reads no GPU")

        def any_(q: str | None) -> str | None:
            return q if q in (None, NEVER) else f"group by ({HOST}) ({q})"

        def every_(q: str | None) -> str | None:
            return q if q in (None, NEVER) else f"(count by ({HOST}) ({q}) == on({HOST}) {count})"

        return Bool(any_(body.t), every_(body.f)) if name == "exists" else Bool(every_(body.t), any_(body.f))

    # -- resolving paths and combining ---------------------------------------------------------------------------
    def resolve(self, v: Any) -> Any:
        if not isinstance(v, Path):
            return v
        vals = self.values
        if v.alias == "$g":
            out = vals.gpu_value(v.parts)
        else:
            role = self.aliases[v.alias]
            if role == "gpu.sample" and v.parts[:1] != ("gpus",):
                out = vals.sample_value(v.parts)
            elif role == "server.metrics":
                out = vals.server_value(self.kind, v.parts)
            elif role == "gpu.inventory":
                out = vals.inventory_value(v.parts)
            elif role == "gpu.dcgm":
                out = vals.dcgm_value(v.parts)
            elif role == "gpu.reference" and v.parts:  # a function of the GPU model: per GPU-table row
                out = self._per_model(None, [("ref", ".".join((v.alias, *v.parts)))], {v.alias})
            else:
                raise NotExpressible(f"{v.alias}.{'.'.join(v.parts)} ({role}) has no PromQL form in the export yet")
        if isinstance(out, Num) and not out.gpu and v.alias != "$g":
            self.read[".".join((v.alias, *v.parts))] = out
        return out

    def boolean(self, v: Any) -> Any:
        v = self.resolve(v)
        if isinstance(v, (Bool, Err)):
            return v
        if isinstance(v, Const):
            if isinstance(v.value, bool):
                return v
            return Err(f"{v.value!r} is not a boolean")
        raise NotExpressible("a number used as a condition")

    def _logic(self, a: Any, b: Any, is_or: bool) -> Any:
        # CEL's commutative && and ||: an error on one side gives way to a deciding other side
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(a.value or b.value) if is_or else Const(a.value and b.value)
        for x, y in ((a, b), (b, a)):
            if isinstance(x, Const):
                if is_or:
                    return x if x.value else y
                return y if x.value else x
        if isinstance(a, Err) and isinstance(b, Err):
            return a
        for x, y in ((a, b), (b, a)):
            if isinstance(x, Err):  # error || y: true where y is; never false. error && y: false where y is
                return Bool(y.t, NEVER, y.gpu) if is_or else Bool(NEVER, y.f, y.gpu)
        if a.gpu != b.gpu:
            raise NotExpressible("a condition mixing a GPU's values and the host's")
        if is_or:
            return Bool(_or(a.t, b.t), _and(a.f, b.f), a.gpu)
        return Bool(_and(a.t, b.t), _or(a.f, b.f), a.gpu)

    def _both(self, lhs: Any, rhs: Any) -> tuple[Any, Any]:
        """Both operands resolved; one that errs on every host decides (the operation errs) even where the other
        has no PromQL form."""
        out: list[Any] = []
        for x in (lhs, rhs):
            try:
                out.append(self.resolve(x))
            except NotExpressible as exc:
                out.append(exc)
        for x in out:
            if isinstance(x, Err):
                return x, x
        for x in out:
            if isinstance(x, NotExpressible):
                raise x
        return out[0], out[1]

    def _compare(self, op: str, lhs: Any, rhs: Any) -> Any:
        lhs, rhs = self._both(lhs, rhs)
        for x in (lhs, rhs):
            if isinstance(x, MaybeNull) and self.says_null and op in ("==", "!="):
                raise NotExpressible(f"{x.why}: null on some hosts, missing on others")
        if isinstance(lhs, Err):
            return lhs
        if isinstance(rhs, Err):
            return rhs
        if isinstance(lhs, Const) and isinstance(rhs, Const):
            a, b = lhs.value, rhs.value
            if op in ("==", "!=") and (a is None or b is None):
                if not self.says_null:
                    return Err("null compared")
                return Const((a is None and b is None) == (op == "=="))
            try:
                return Const(bool(_PY[op](a, b)))
            except TypeError:
                return Err(f"{a!r} {op} {b!r}")
        if isinstance(lhs, Bool) or isinstance(rhs, Bool):
            raise NotExpressible("a comparison of booleans")
        for x, other in ((lhs, rhs), (rhs, lhs)):
            if isinstance(x, Const) and not (isinstance(x.value, (int, float)) and not isinstance(x.value, bool)):
                if x.value is None and self.says_null and op in ("==", "!="):
                    if isinstance(other, Num) and other.hosts is not None:  # there, absent is null
                        present, absent = other.q, f"({other.hosts} unless on({HOST}) {other.q})"
                        return Bool(present, absent, other.gpu) if op == "!=" else Bool(absent, present, other.gpu)
                    raise NotExpressible("a per-host value compared with null (the metrics cannot tell null from absent)")
                return Err(f"{x.value!r} compared with a number")
        gpu = any(isinstance(x, Num) and x.gpu for x in (lhs, rhs))
        if isinstance(lhs, Num) and isinstance(rhs, Num) and lhs.gpu != rhs.gpu:
            raise NotExpressible("a comparison of a GPU's value with the host's")
        l_text = lhs.q if isinstance(lhs, Num) else _num(lhs.value)
        r_text = rhs.q if isinstance(rhs, Num) else _num(rhs.value)
        if isinstance(lhs, Const):  # PromQL keeps the left side's value and labels: the vector on the left
            l_text, r_text, op = r_text, l_text, {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}[op]
        t, f = f"({l_text} {op} {r_text})", f"({l_text} {_NEG[op]} {r_text})"
        if self.says_null and op in ("==", "!="):  # null-safe: a null reading is "not equal", which absent cannot say
            return Bool(t, None, gpu) if op == "==" else Bool(None, f, gpu)
        return Bool(t, f, gpu)

    def _arith(self, op: str, lhs: Any, rhs: Any) -> Any:
        lhs, rhs = self._both(lhs, rhs)
        for x in (lhs, rhs):
            if isinstance(x, Err):
                return x
            if isinstance(x, Bool) or (isinstance(x, Const) and (isinstance(x.value, bool) or not isinstance(x.value, (int, float)))):
                return Err("arithmetic on a non-number") if isinstance(x, Const) else self._fail("arithmetic on a boolean")
        if isinstance(lhs, Const) and isinstance(rhs, Const):
            try:
                return Const(_PY[op](lhs.value, rhs.value))
            except ZeroDivisionError:
                return Err("division by zero")
        if isinstance(lhs, Num) and isinstance(rhs, Num) and lhs.gpu != rhs.gpu:
            raise NotExpressible("arithmetic on a GPU's value and the host's")
        gpu = any(isinstance(x, Num) and x.gpu for x in (lhs, rhs))
        text = [x.q if isinstance(x, Num) else _num(x.value) for x in (lhs, rhs)]
        return Num(f"({text[0]} {op} {text[1]})", gpu)


def _literal(tok: Token) -> Any:
    text = str(tok)
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if tok.type in ("STRING_LIT", "MLSTRING_LIT"):
        return yaml.safe_load(text) if text[:1] in "\"'" else text
    try:
        return float(text.rstrip("uU"))
    except ValueError:
        raise NotExpressible(f"the literal {text}") from None


def _cel_value(v: Any) -> Any:
    """A param as a rule sees it: numbers are doubles (rules.to_cel_data)."""
    return to_cel_data(v)


def _reference(name: str, board: float | None) -> dict[str, Any]:
    ref = reference_for(name, board)
    draw = ref["memory_bound_draw_w"]
    return {"gpu_name": name, "board_max_w": board, **ref, "memory_bound_share": round(draw / board, 4) if draw and board else None}


# -- a hypothesis: its gate, its when, its confirm ------------------------------------------------------------


@dataclass
class Exported:
    hypothesis: str
    title: str
    severity: str
    expr: str | None  # None: not expressible
    why_not: str = ""
    read: dict[str, list[str]] | None = None  # host-level values the confirm rule reads: path -> PromQL per server kind
    never: bool = False  # expressible, and the fleet can confirm it on no host (every part reads what it lacks)


def _aliases(loaded: LoadedRunbook) -> dict[str, str]:
    return {alias: _role(call.probe) for hyp, _ in loaded.runbook.walk() for alias, call in hyp.probes.items()}


def _says_null(source: str) -> bool:
    return re.search(r"\bnull\b", source) is not None


def _compile(values: Values, loaded: LoadedRunbook, kind: str, params: dict[str, Any]) -> dict[str, tuple[str | None, str, dict[str, Num]]]:
    """Each hypothesis of the runbook as `kind` reads it: (where confirmed: PromQL, NEVER or None, why not, values read)."""
    from ..rules import _ENV  # noqa: PLC0415 - the rule's parse tree, as rules.compile_rule parses it

    aliases = _aliases(loaded)
    out: dict[str, tuple[str | None, str, dict[str, Num]]] = {}
    gate: dict[str, str | None] = {}
    for hyp, parent in loaded.runbook.walk():
        if parent is None:
            g: str | None = None  # a root: every host
        elif parent.id not in gate:
            out[hyp.id] = (None, f"its parent {parent.id} is not expressible", {})
            continue
        elif parent.explore == "always" and loaded.rule(parent.id, "when") is None:
            g = gate[parent.id]  # judged wherever the parent is, whatever it decides (it is never skipped)
        elif parent.explore == "always":
            out[hyp.id] = (None, f"its parent {parent.id} explores always under a precondition (where it is not skipped is not exported)", {})
            continue
        elif out[parent.id][0] is None:
            out[hyp.id] = (None, f"its parent {parent.id} is not expressible", {})
            continue
        else:
            g = out[parent.id][0]
            if g == "__every_host__":
                g = None
        gate[hyp.id] = g
        where: str | None = g
        read: dict[str, Num] = {}
        why = ""
        # confirm first: one the fleet never finds true makes the hypothesis never confirmed, whatever its when says
        for field in ("confirm", "when"):
            rule = loaded.rule(hyp.id, field)
            if rule is None:
                if field == "confirm":
                    where, why = None, "it has no confirm rule"
                    break
                continue
            comp = Compiler(values, kind, aliases, params, rule.source, _says_null(rule.source))
            try:
                b = comp.boolean(comp.value(_ENV.compile(rule.source)))
            except NotExpressible as exc:
                where, why = None, f"{field}: {exc}"
                break
            if isinstance(b, Const) and b.value is True:
                continue  # holds on every host: the gate alone
            t = NEVER if isinstance(b, (Const, Err)) else b.t
            if t is None:
                where, why = None, f"{field}: true where {'a value is null or ' if comp.says_null else ''}the metrics cannot say"
                break
            if field == "confirm":
                read = comp.read
            where = t if where is None else _and(where, t)
            if where == NEVER:
                break
        out[hyp.id] = (where, why, read)
    return out


def export(loaded: LoadedRunbook, params: dict[str, Any], window: Window, gpu_key: HostKey, server_key: HostKey,
           violation_unit: str = "auto", for_: str = "0s") -> tuple[str, list[Exported]]:  # fmt: skip
    """The rule file's text, and what became of each hypothesis."""
    values = Values(window, gpu_key, server_key, violation_unit)
    every = f"(group by ({HOST}) ({values.gpus}) or group by ({HOST}) ({values.sglang_hosts} or {values.vllm_hosts}))"
    by_kind = {kind: _compile(values, loaded.for_server(kind), kind, params) for kind in KINDS}
    hosts_of = {"sglang": f"({every} unless on({HOST}) {values.vllm_hosts})", "vllm": values.vllm_hosts}
    done: list[Exported] = []
    base = loaded.for_server(None)
    for hyp, _ in base.runbook.walk():
        parts: list[str] = []
        why: list[str] = []
        read: dict[str, list[str]] = {}
        for kind in KINDS:
            where, reason, r = by_kind[kind][hyp.id]
            if where is None:
                why.append(f"{'SGLang' if kind == 'sglang' else 'vLLM'} hosts: {reason}")
                continue
            for p, n in r.items():
                read.setdefault(p, []).append(n.q)
            if where == NEVER:
                continue
            where = every if where == "__every_host__" else where
            parts.append(f"({where} and on({HOST}) {hosts_of[kind]})")
        sev = hyp.severity.value if hasattr(hyp.severity, "value") else str(hyp.severity)
        if why:
            done.append(Exported(hyp.id, hyp.title, sev, None, "; ".join(why)))
        elif not parts:
            done.append(Exported(hyp.id, hyp.title, sev, None, "never confirmed by the fleet: its rules, or its parent's, read only what the metrics never hold", never=True))
        else:
            expr = parts[0] if len(parts) == 1 else " or ".join(parts)
            done.append(Exported(hyp.id, hyp.title, sev, f"group by ({HOST}) ({expr})", read=read))
    return render(loaded, done, values, window, gpu_key, server_key, for_), done


# -- the file ------------------------------------------------------------------------------------------------------


def _template_text(text: str) -> str:
    """Runbook text inside an annotation: literal, never template code (`{{` written as an action printing it)."""
    return re.sub(r"\{\{", '{{ "{{" }}', " ".join(text.split()))


def _go_string(text: str) -> str:
    """A Go template string literal (a backquoted raw string cannot hold a backquote, PromQL has none here)."""
    assert "`" not in text
    return "`" + text + "`"


def _metric_name(path: str) -> str:
    return "runbook:" + re.sub(r"[^a-zA-Z0-9_]", "_", path)


def alert_name(runbook: str, hypothesis: str) -> str:
    """`RunbookPowerStarvationGpusUnderfed`: the runbook and hypothesis ids in one alert name."""
    words = re.split(r"[^A-Za-z0-9]+", f"runbook-{runbook}-{hypothesis}")
    return "".join(w[:1].upper() + w[1:] for w in words if w)


def render(loaded: LoadedRunbook, done: list[Exported], values: Values, window: Window, gpu_key: HostKey,
           server_key: HostKey, for_: str) -> str:  # fmt: skip
    name = loaded.name
    records: dict[str, list[str]] = {}
    for e in done:
        for path, qs in (e.read or {}).items():
            for q in qs:  # one per server kind where they differ (each on its own hosts)
                if q not in records.setdefault(_metric_name(path), []):
                    records[_metric_name(path)].append(q)
    instance_metric = "runbook:server_instance"
    rules_values = [{"record": instance_metric, "expr": values.server_instance}]
    rules_values += [{"record": m, "expr": " or ".join(qs)} for m, qs in sorted(records.items())]
    # the server's address asked at evaluation from the metrics themselves (not the recorded series: vmalert writes
    # those through remote write, seconds later); the host given as a label of a constant, so no text is PromQL
    ask = f"topk(1, ({values.server_instance}) and on({HOST}) label_replace(vector(1), \"{HOST}\", %q, \"\", \"\"))"
    command = (f"runbook run {name} {SERVER_URL_FLAG} http://"
               f"{{{{ with printf {_go_string(ask)} $labels.host | query }}}}{{{{ . | first | label \"instance\" }}}}{{{{ end }}}}")  # fmt: skip
    alerts = []
    for e in done:
        if e.expr is None:
            continue
        shown = " ".join(f"{p}={{{{ with printf \"{_metric_name(p)}{{host=%q}}\" $labels.host | query }}}}"
                         f"{{{{ . | first | value | printf \"%.4g\" }}}}{{{{ end }}}}" for p in sorted(e.read or {}))  # fmt: skip
        summary = f"{{{{ $labels.host }}}}: {_template_text(e.title)}" + (f" ({shown})" if shown else "")
        severity = "info" if e.severity == "from-causes" else e.severity
        annotations = {"summary": summary, "runbook_command": command}
        if e.severity == "from-causes":
            annotations["severity_note"] = "a symptom: as severe as the worst cause confirmed below it (their alerts)"
        alerts.append({"alert": alert_name(name, e.hypothesis), "expr": e.expr, "for": for_,
                       "labels": {"severity": severity, "runbook": name, "hypothesis": e.hypothesis},
                       "annotations": annotations})  # fmt: skip
    longest = max((len(r["expr"]) for r in rules_values + alerts), default=0)
    head = [f"# `runbook fleet {name} --export-rules`: runbook {name} ({' '.join(loaded.runbook.title.split())}) as Prometheus / vmalert rules",
            f"# (gpu-runbook {__version__}). Window {window.range}; hosts named by GPU labels {','.join(gpu_key.ways)}, server labels",
            f"# {','.join(server_key.ways)}" + (f"; series matching {window.matchers}" if window.matchers else "") + ".",
            "# Each alert fires for a host exactly where `runbook fleet` over the same window confirms that hypothesis.",
            "# VictoriaMetrics: vmalert sends each expression as one query; start VictoriaMetrics with -search.maxQueryLen of at",
            f"# least {longest} (the longest here; the default is 16384). Prometheus has no such limit.",
            "# Hypotheses that are not alerts here, and why:"]  # fmt: skip
    for e in done:
        if e.expr is None:
            head.append(f"#   {e.hypothesis}: {' '.join(e.why_not.split())}")
    doc = {"groups": [{"name": f"runbook-{name}-values", "rules": rules_values},
                      {"name": f"runbook-{name}", "rules": alerts}]}  # fmt: skip
    body = yaml.safe_dump(doc, sort_keys=False, width=1 << 16, allow_unicode=True)
    return "\n".join(head) + "\n" + body


__all__ = ["Exported", "NotExpressible", "alert_name", "export"]
