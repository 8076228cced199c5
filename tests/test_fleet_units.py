"""The fleet's pieces that need no server: host keys, units, the counters file, the values' contract, the
CLI's usage errors, and that labels from the metrics stay data in the report. (The real engines are in
test_fleet.py.)"""

from __future__ import annotations

import pytest

from gpu_runbook.cli import main
from gpu_runbook.fleet import FleetHost, FleetResults
from gpu_runbook.fleet.report import markdown, table_text
from gpu_runbook.probes.gpu_values import InventoryValues
from gpu_runbook.probes.gpu_values import SampleValues
from gpu_runbook.probes.server.values import MetricsValues
from gpu_runbook.probes.prometheus.client import HostKey, Sample, Window, parse_duration
from gpu_runbook.probes.prometheus.gpu import (
    FIELDS, NOT_IN_STOCK, GpuInventoryFleet, GpuSampleFleet, counters_csv, gpu_queries, per_gpu, violation_fraction,
)  # fmt: skip
from gpu_runbook.probes.prometheus.server import SglangMetricsFleet, server_queries
from gpu_runbook.sim.fleet import STOCK_CSV, counters_fields
from gpu_runbook.values import contract_errors


def test_host_key_takes_the_first_label_present_case_insensitively() -> None:
    key = HostKey.parse("host,Hostname,instance")
    assert key.of({"host": "a", "Hostname": "b"}) == "a"
    assert key.of({"hostname": "b", "instance": "10.0.0.1:9400"}) == "b"  # dcgm-exporter's renamed label
    assert key.of({"instance": "10.0.0.1:9400"}) == key.of({"instance": "10.0.0.1:30000"}) == "10.0.0.1"
    assert key.of({"instance": "[fe80::1]:9400"}) == "fe80::1"
    assert key.of({"job": "x"}) is None
    k8s = HostKey.parse("namespace/pod")
    assert k8s.of({"namespace": "llm", "pod": "sglang-0"}) == "llm/sglang-0"
    assert k8s.of({"pod": "sglang-0"}) is None
    with pytest.raises(ValueError):
        HostKey.parse(" , ")


def test_violation_counters_are_ns_unless_told_otherwise() -> None:
    assert violation_fraction(15e9, 15.0, "auto") == (1.0, "ns")
    assert violation_fraction(3e9, 15.0, "auto") == (0.2, "ns")
    assert violation_fraction(3e6, 15.0, "us") == (0.2, "us")
    assert violation_fraction(None, 15.0, "auto") == (None, "auto")


def test_durations() -> None:
    assert parse_duration("15m") == 900.0 and parse_duration("30s") == 30.0 and parse_duration("1.5h") == 5400.0
    for bad in ("15", "m", "-1s", "0s", "1y"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_counters_file_enables_every_field_the_fleet_reads_and_stock_lacks_the_limits() -> None:
    printed = counters_fields(counters_csv())
    assert printed == set(FIELDS)
    stock = counters_fields(STOCK_CSV)
    assert not stock & NOT_IN_STOCK
    assert "DCGM_FI_DEV_POWER_USAGE" in stock


def test_query_count_depends_on_the_runbook_not_the_hosts() -> None:
    key = HostKey.parse("host,Hostname,instance")
    window = Window(900, 1.7e9, 'job="dcgm"')
    queries = {**gpu_queries(window, key), **server_queries(window, key)}
    assert all('job="dcgm"' in q for q in queries.values())
    # old and DCGM 4.6 names both asked for
    assert "DCGM_FI_DEV_BOARD_POWER_WATTS" in queries["power_mean"] and "DCGM_FI_DEV_POWER_USAGE" in queries["power_mean"]


def _gpu_answers(host: str, n: int, enforced: float | None) -> dict[str, list[Sample]]:
    def s(gpu: int, value: float) -> Sample:
        return Sample({"Hostname": host, "gpu": str(gpu)}, value)

    answers = {name: [s(g, v) for g in range(n)] for name, v in {
        "power_mean": 235.0, "power_min": 230.0, "power_max": 240.0, "power_p50": 235.0, "power_p95": 239.0,
        "power_samples": 15.0, "util_mean": 99.0, "sm_clock_mean": 2400.0, "mem_clock_mean": 13365.0,
    }.items()}  # fmt: skip
    if enforced is not None:
        answers.update({"limit_enforced": [s(g, enforced) for g in range(n)], "limit_max": [s(g, 600.0) for g in range(n)],
                        "max_sm_clock": [s(g, 2617.0) for g in range(n)], "power_violation": [s(g, 0.0) for g in range(n)],
                        "thermal_violation": [s(g, 0.0) for g in range(n)]})  # fmt: skip
    answers["model_name"] = [Sample({"Hostname": host, "gpu": str(g), "modelName": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}, 1.0) for g in range(n)]
    return answers


def test_fleet_values_keep_the_host_probes_contract() -> None:
    key = HostKey.parse("host,Hostname,instance")
    window = Window(15, 1.7e9)
    rows = per_gpu(_gpu_answers("box", 8, 600.0), key)
    sample = GpuSampleFleet().fill(rows, window).values["box"]
    assert sample["gpu_count"] == 8 and sample["power_draw_w"]["p95"] == 239.0 and sample["power_limit_enforced_w"] == 600.0
    assert sample["event_reasons"]["sw_power_cap"] == 0.0 and sample["sm_clock_ratio"]["mean"] == pytest.approx(2400 / 2617, rel=1e-4)
    top_level = [e for e in contract_errors(SampleValues, sample, complete=False) if "." not in e.split(":")[0]]
    assert top_level == []
    inv = GpuInventoryFleet().fill(rows, window).values["box"]
    assert [e for e in contract_errors(InventoryValues, inv, complete=False) if "." not in e.split(":")[0]] == []
    # a stock exporter: the limits are missing, and named
    stock = GpuSampleFleet().fill(per_gpu(_gpu_answers("box", 8, None), key), window)
    assert stock.values["box"]["power_limit_enforced_w"] is None
    assert {"DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "DCGM_FI_DEV_POWER_VIOLATION"} <= set(stock.missing["box"])


def test_server_values_keep_the_contract() -> None:
    key = HostKey.parse("host,instance")
    labels = {"host": "box", "instance": "10.0.0.1:30000"}
    answers = {f"{c}_{s}": [Sample(labels, v)] for c, v in (("running", 300.0), ("queued", 20.0), ("kv_usage", 0.95), ("used_tokens", 9e4))
               for s in ("mean", "min", "p50", "max", "last")}  # fmt: skip
    answers["dp_ranks"] = [Sample(labels, 1.0)]
    answers["graph_passes"] = [Sample(dict(labels, mode="decode_cuda_graph"), 30.0), Sample(dict(labels, mode="decode_none"), 70.0)]
    ans, instances = SglangMetricsFleet().fill_servers(answers, key, Window(15, 1.7e9))
    values = ans.values["box"]
    assert instances == {"box": "10.0.0.1:30000"}
    assert values["decode_graph_share"] == 0.3 and values["running"]["p50"] == 300.0 and values["running_to_cap_p50"] is None
    assert contract_errors(MetricsValues, values, complete=True) == []


def test_labels_from_the_metrics_stay_data() -> None:
    hostile = "evil<script>|**x**\x1b[31m"
    fr = FleetResults(runbook="power-starvation", title="t", prometheus="http://p", engine="prometheus", window_s=900, at=1.7e9,
                      latency_offset_s=0, gpu_host_labels=["host"], server_host_labels=["host"], queries=56,
                      hosts=[FleetHost(host=hostile, join="server only", join_detail="no GPU series", rank=1, draw_w=200.0, limit_w=600.0)])  # fmt: skip
    text = table_text(fr)
    assert "\x1b" not in text
    md = markdown(fr)
    assert "<script>" not in md and "\\<script\\>" in md and "\x1b" not in md and "\\|" in md


@pytest.mark.parametrize("argv, message", [
    (["fleet", "power-starvation"], "--prometheus URL is required"),
    (["fleet", "power-starvation", "--prometheus", "prom:9090"], "expected http(s)://"),
    (["fleet", "power-starvation", "--prometheus", "http://127.0.0.1:9", "--match", "job=dcgm"], "--match job=dcgm"),
    (["fleet", "power-starvation", "--prometheus", "http://127.0.0.1:9", "--at", "yesterday"], "--at 'yesterday'"),
    (["fleet", "power-starvation", "--prometheus", "http://127.0.0.1:9", "--window", "15"], "--window '15' is not a duration"),
    (["fleet", "power-starvation", "--prometheus", "http://127.0.0.1:9", "--latency-offset", "soon"], "--latency-offset 'soon' is not a duration"),
    (["fleet", "power-starvation", "--prometheus", "http://127.0.0.1:9", "--set", "nope=1"], "unknown param 'nope'"),
    (["fleet"], "name a runbook"),
    (["fleet", "power-starvation", "--prometheus", "http://127.0.0.1:9", "--workers", "0"], "--workers 0: at least 1"),
])  # fmt: skip
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unreachable_prometheus_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from prom_servers import free_port

    assert main(["fleet", "power-starvation", "--prometheus", f"http://127.0.0.1:{free_port()}", "--timeout", "2"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("runbook fleet: cannot connect to http://127.0.0.1:") and err.count("\n") == 1 and "Traceback" not in err


def test_dcgm_counters_prints_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "--dcgm-counters"]) == 0
    assert counters_fields(capsys.readouterr().out) == set(FIELDS)


def _judged(values: dict, host: str):
    import asyncio

    from gpu_runbook.fleet import recorded_for
    from gpu_runbook.loader import load_path_or_name
    from gpu_runbook.registry import Registry
    from gpu_runbook.runner import Runner, resolve_params
    from gpu_runbook.target import Target

    registry = Registry.discover()
    loaded = load_path_or_name("power-starvation", registry)
    params = resolve_params(loaded, {})
    return asyncio.run(Runner(loaded, registry, Target(label=host), params, recorded=recorded_for(loaded, params, values, {})).run())


def test_tui_host_list_shows_the_selected_hosts_tree() -> None:
    import asyncio

    from textual.widgets import Static

    from gpu_runbook.tui.fleet import FleetApp

    stats = {"mean": 235.0, "min": 230.0, "max": 240.0, "p50": 235.0, "p95": 239.0}
    underfed = {"gpu.sample": {"gpu_count": 8, "power_draw_w": stats, "gpu_util_pct": dict(stats, mean=99.0)},
                "gpu.reference": {"memory_bound_draw_w": 367.0}}  # fmt: skip
    fr = FleetResults(runbook="power-starvation", title="t", prometheus="http://p", engine="prometheus", window_s=900, at=1.7e9,
                      latency_offset_s=0, gpu_host_labels=["host"], server_host_labels=["host"], queries=56,
                      hosts=[FleetHost(host="box-a", join="gpu only", rank=1, results=_judged(underfed, "box-a"), confirmed=["gpus-underfed"]),
                             FleetHost(host="box-[b]", join="exporter down", rank=2)])  # fmt: skip

    async def drive() -> tuple[str, str]:
        app = FleetApp(fr)
        async with app.run_test() as pilot:
            first = str(app.query_one("#detail", Static).render())
            await pilot.press("down")
            await pilot.pause()
            second = str(app.query_one("#detail", Static).render())
            await pilot.press("q")
        return first, second

    first, second = asyncio.run(drive())
    assert "box-a" in first and "gpus-underfed" in first
    assert "box-[b]" in second and "exporter down" in second  # a label with brackets stays text, not markup


class _AuthApi:
    """A small Prometheus-API server on 127.0.0.1 that wants one Authorization header and answers empty vectors."""

    def __init__(self, wanted: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        api = self
        self.seen: list[str | None] = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                auth = self.headers.get("Authorization")
                api.seen.append(auth)
                if auth != wanted:
                    body, code = b'{"status":"error","errorType":"unauthorized","error":"no"}', 401
                elif self.path.startswith("/api/v1/status/buildinfo"):
                    body, code = b'{"status":"success","data":{"version":"2.42.0"}}', 200
                else:
                    body, code = b'{"status":"success","data":{"resultType":"vector","result":[]}}', 200
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("flags, wanted", [
    (["--bearer-token", "s3cret"], "Bearer s3cret"),
    (["--basic-auth", "ops:pw"], "Basic b3BzOnB3"),
])  # fmt: skip
def test_auth_goes_with_every_query(flags: list[str], wanted: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    api = _AuthApi(wanted)
    try:
        out = tmp_path / "f.json"
        assert main(["fleet", "power-starvation", "--prometheus", api.url, "--json", str(out), *flags]) == 3  # no hosts
        assert api.seen and all(a == wanted for a in api.seen)
        assert "s3cret" not in out.read_text() and "pw" not in json_keys(out)
        api.seen.clear()
        assert main(["fleet", "power-starvation", "--prometheus", api.url]) == 3
        err = capsys.readouterr().err
        assert "HTTP 401" in err and "Traceback" not in err
    finally:
        api.close()


def json_keys(path) -> str:
    import json

    data = json.loads(path.read_text())
    return " ".join(str(data.get(k)) for k in ("prometheus", "gpu_host_labels", "server_host_labels"))


def test_a_large_fleet_is_split_over_one_worker_per_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked workers where they pay (100 hosts each), one per CPU this process may use, at most 8; the option
    wins; never more workers than hosts."""
    import os  # noqa: PLC0415

    from gpu_runbook.fleet import Fleet, FleetOptions  # noqa: PLC0415
    from gpu_runbook.fleet import judge  # noqa: PLC0415

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    fleet = Fleet.__new__(Fleet)
    fleet.options = FleetOptions()
    assert [fleet.workers(n) for n in (1, 99, 100, 250, 1000, 10_000)] == [1, 1, 1, 2, 8, 8]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert fleet.workers(10_000) == 2
    fleet.options = FleetOptions(workers=3)
    assert [fleet.workers(n) for n in (1, 2, 50)] == [1, 2, 3]
    monkeypatch.setattr(judge.sys, "platform", "darwin")  # no fork there: this process alone
    assert fleet.workers(10_000) == 1


def test_the_question_of_the_first_host_label_names_every_gpu_series() -> None:
    from gpu_runbook.probes.prometheus import amd  # noqa: PLC0415
    from gpu_runbook.probes.prometheus.gpu import FIELDS, lacking_first_label, narrowed  # noqa: PLC0415

    window = Window(60, 1.7e9, 'job="dcgm"')
    q = lacking_first_label(window, HostKey.parse("host,Hostname,instance"))
    assert q is not None and 'host=""' in q and 'Host=""' in q and 'job="dcgm"' in q and q.startswith("count(last_over_time(")
    assert all(n in q for f in FIELDS.values() for n in f.names) and all(m in q for metrics, *_ in amd.QUERIES.values() for m in metrics)
    assert lacking_first_label(window, HostKey.parse("namespace/pod,instance")) is None  # a joined way: never narrowed
    assert narrowed(HostKey.parse("host,Hostname,instance")).ways == ("host",)


def test_a_workers_spool_gives_back_each_text_where_it_lies() -> None:
    import multiprocessing  # noqa: PLC0415
    import pickle  # noqa: PLC0415

    from gpu_runbook.fleet.spool import Spool  # noqa: PLC0415

    spool = Spool()
    texts = ['{"a": "H200 \u00e9\u00e8"}', "", "x" * 200_000]
    with multiprocessing.get_context("fork").Pool(1) as pool:  # written in a forked worker, as a fleet's are
        placed = pool.map(_put_all, [(spool, texts)])[0]
    assert [p.text() for p in placed] == texts
    assert pickle.loads(pickle.dumps(placed[0])).spool is spool  # the parent's own spool, by its descriptor
    fd = spool.fd
    spool.close()
    del spool, placed
    with pytest.raises(OSError, match="no results spool"):
        pickle.loads(pickle.dumps(_FakeSpooled(fd)))


def _put_all(args: tuple) -> list:
    spool, texts = args
    return [spool.put(t.encode()) for t in texts]


class _FakeSpooled:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple:
        from gpu_runbook.fleet.spool import _reopened  # noqa: PLC0415

        return (_reopened, (self.fd,))
