"""`runbook fleet NAME --prometheus URL`: the subcommand's options and what it does with them."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone
from typing import Any, Callable


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "fleet",
        help="decide a runbook for every host a Prometheus / VictoriaMetrics knows (no load, no request to any server)",
        description="Triage every GPU host at once from dcgm-exporter and server metrics in Prometheus or VictoriaMetrics: "
        "a ranked host table, per-host verdicts (--json) and a Markdown fleet report (--report).",
    )
    p.add_argument("runbook", nargs="?", metavar="NAME|FILE")
    p.add_argument("--prometheus", metavar="URL", default=os.environ.get("RUNBOOK_PROMETHEUS_URL"),
                   help="the Prometheus (or VictoriaMetrics) base URL, e.g. http://prometheus:9090")  # fmt: skip
    p.add_argument("--window", default="15m", help="how far back from the end the aggregates look (default: %(default)s)")
    p.add_argument("--at", metavar="TIME", help="the window's end: RFC 3339 (2026-12-03T14:05:00Z) or unix seconds (default: now)")
    p.add_argument("--match", action="append", default=[], metavar='LABEL="VALUE"',
                   help='narrow every series, e.g. --match job="dcgm" --match cluster=~"eu-.*" (repeatable)')  # fmt: skip
    p.add_argument("--gpu-host-label", default=None, metavar="LABELS", help="labels that name a host on GPU series, first present wins (default: host,Hostname,instance; Kubernetes: namespace/pod)")
    p.add_argument("--server-host-label", default=None, metavar="LABELS", help="labels that name a host on server series (default: host,instance)")
    p.add_argument("--kubernetes", action="store_true", help="join GPU and server series on namespace/pod (dcgm-exporter -k)")
    p.add_argument("--violation-unit", choices=["auto", "ns", "us"], default="auto",
                   help="unit of DCGM_FI_DEV_*_VIOLATION: ns per DCGM's header (auto), us for older exporters")  # fmt: skip
    p.add_argument("--latency-offset", metavar="DURATION", help="how far behind now the engine answers (default: asked: VictoriaMetrics' -search.latencyOffset, 0 for Prometheus)")
    p.add_argument("--bearer-token", default=os.environ.get("RUNBOOK_PROMETHEUS_TOKEN"), help="Authorization: Bearer (or RUNBOOK_PROMETHEUS_TOKEN)")
    p.add_argument("--bearer-token-file", metavar="FILE", help="read the bearer token from FILE")
    p.add_argument("--basic-auth", metavar="USER[:PASSWORD]", default=os.environ.get("RUNBOOK_PROMETHEUS_BASIC_AUTH"),
                   help="HTTP basic auth (or RUNBOOK_PROMETHEUS_BASIC_AUTH)")  # fmt: skip
    p.add_argument("--ca-file", metavar="FILE", help="CA bundle to verify the server's TLS certificate")
    p.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request, connect to last byte (default: %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="set a runbook param (repeatable)")
    p.add_argument("--json", metavar="PATH", help="write the per-host verdicts as JSON (- for standard output)")
    p.add_argument("--report", metavar="PATH", help="write the Markdown fleet report (- for standard output)")
    p.add_argument("--tui", action="store_true", help="then open the host list in the terminal (a host's tree beside it)")
    p.add_argument("--no-memo", action="store_true", help="judge every host afresh, not once per distinct input (same verdicts, slower: for checking)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes that judge the hosts (default: one per CPU, up to 8, each with 100 hosts or more; 1: this process alone)")
    p.add_argument("--export-rules", metavar="FILE",
                   help="write the runbook's fleet-decidable hypotheses as Prometheus / vmalert alerting rules (- for standard output); "
                        "judges no host, so --prometheus is then optional")  # fmt: skip
    p.add_argument("--for", dest="for_", default="5m", metavar="DURATION",
                   help="with --export-rules: how long a hypothesis must hold before its alert fires (default: %(default)s; 0s: at once)")  # fmt: skip
    p.add_argument("--dcgm-counters", action="store_true", help="print a dcgm-exporter counters file with every field the runbooks use, and exit")


def parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--at {text!r}: expected RFC 3339 (2026-12-03T14:05:00Z) or unix seconds") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def cmd_fleet(args: argparse.Namespace, usage: type[Exception], registry_of: Callable, load: Callable, parse_sets: Callable) -> int:
    from gpu_runbook.probes.prometheus.client import K8S_HOST, HostKey, PromClient, PromError, PromSource, parse_duration  # noqa: PLC0415
    from gpu_runbook.probes.prometheus.gpu import counters_csv  # noqa: PLC0415

    if args.dcgm_counters:
        sys.stdout.write(counters_csv())
        return 0
    if not args.runbook:
        raise usage("runbook fleet: name a runbook (e.g. power-starvation), or pass --dcgm-counters")
    if not args.prometheus and not args.export_rules:
        raise usage("runbook fleet: --prometheus URL is required (or set RUNBOOK_PROMETHEUS_URL), or --export-rules FILE")
    if args.prometheus and not args.prometheus.startswith(("http://", "https://")):
        raise usage(f"--prometheus {args.prometheus}: expected http(s)://HOST:PORT")
    from .judge import Fleet, FleetOptions  # noqa: PLC0415
    from . import report as fleet_report  # noqa: PLC0415
    from ..runner import ParamError, resolve_params  # noqa: PLC0415

    def duration(flag: str, text: str) -> float:
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise usage(f"{flag} {exc}") from None

    window = duration("--window", args.window)
    lo = (args.latency_offset or "").strip()
    offset = None if not lo else 0.0 if lo in ("0", "0s", "0ms") else duration("--latency-offset", lo)
    try:
        at = parse_time(args.at) if args.at else None
        gpu_key = HostKey.parse(args.gpu_host_label or (K8S_HOST if args.kubernetes else "host,Hostname,instance"))
        server_key = HostKey.parse(args.server_host_label or (K8S_HOST if args.kubernetes else "host,instance"))
    except ValueError as exc:
        raise usage(str(exc)) from None
    if args.workers is not None and args.workers < 1:
        raise usage(f"--workers {args.workers}: at least 1 (1: judge in this process)")
    for m in args.match:
        if not _matcher_ok(m):
            raise usage(f'--match {m}: expected LABEL="VALUE" (or =~, !=, !~ with a quoted value)')
    token = args.bearer_token
    if args.bearer_token_file:
        try:
            token = open(args.bearer_token_file, encoding="utf-8").read().strip()
        except OSError as exc:
            raise usage(f"--bearer-token-file {args.bearer_token_file}: {exc.strerror or exc}") from None
    user, password = (args.basic_auth.split(":", 1) + [""])[:2] if args.basic_auth else (None, None)
    registry = registry_of(args)
    loaded = load(args.runbook, registry)
    sets = parse_sets(args.set)
    try:
        resolve_params(loaded, sets)
    except ParamError as exc:
        raise usage(str(exc)) from None
    if args.export_rules:
        for_ = args.for_.strip()
        if for_ not in ("0", "0s"):
            duration("--for", for_)
        _export_rules(args.export_rules, loaded, resolve_params(loaded, sets), window, args.match, gpu_key, server_key,
                      args.violation_unit, "0s" if for_ == "0" else for_)  # fmt: skip
        if not args.prometheus:
            return 0
    source = PromSource(args.prometheus, bearer_token=token, basic_user=user, basic_password=password, ca_file=args.ca_file,
                        insecure=args.insecure, timeout_s=args.timeout)  # fmt: skip
    client = PromClient(source)
    options = FleetOptions(window_s=window, at=at, matchers=",".join(args.match), gpu_key=gpu_key, server_key=server_key,
                           violation_unit=args.violation_unit, latency_offset_s=offset, params=sets, memo=not args.no_memo,
                           workers=args.workers)  # fmt: skip
    try:
        results = Fleet(loaded, registry, client, options).run()
    except PromError as exc:
        print(f"runbook fleet: {exc}", file=sys.stderr)
        return 3
    finally:
        client.close()
    to_stdout = args.json == "-" or args.report == "-"
    table = fleet_report.table_text(results)
    (sys.stderr if to_stdout else sys.stdout).write(table)
    for path, chunks in ((args.json, lambda: fleet_report.json_chunks(results)), (args.report, lambda: [fleet_report.markdown(results)])):
        if not path:
            continue
        if path == "-":
            sys.stdout.writelines(chunks())
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(chunks())
    if args.tui and results.hosts:
        from ..tui.fleet import FleetApp  # noqa: PLC0415 - Textual only when asked for

        FleetApp(results).run()
    return 0 if results.hosts else 3


def _export_rules(path: str, loaded: Any, params: dict[str, Any], window_s: float, matchers: list[str], gpu_key: Any,
                  server_key: Any, violation_unit: str, for_: str) -> None:  # fmt: skip
    from gpu_runbook.probes.prometheus.client import Window  # noqa: PLC0415

    from .export import export  # noqa: PLC0415

    text, done = export(loaded, params, Window(window_s, 0.0, ",".join(matchers)), gpu_key, server_key, violation_unit, for_)
    if path == "-":
        sys.stdout.write(text)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    alerts = sum(1 for e in done if e.expr is not None)
    print(f"runbook fleet: wrote {alerts} alerting rules of {len(done)} hypotheses to {'standard output' if path == '-' else path} "
          f"(the others, and why, in its comments)", file=sys.stderr)  # fmt: skip


def _matcher_ok(text: str) -> bool:
    import re  # noqa: PLC0415

    return re.fullmatch(r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*', text) is not None
