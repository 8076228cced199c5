"""`runbook`: the command line. Heavy modules are imported inside the command that needs them.

Exit codes: 0 the command did its job (a run completed, whatever the verdicts); 1 `--fail-on`
found a confirmed finding at or above its severity, `--fail-on regressed` or `metric:NAME:-5%` a change
beyond noise, or `runbook test` saw a mismatch; 2 usage or validation error; 3 a run measured nothing
(every probe unavailable or failed: target unreachable, no GPU; `calibrate`: no GPU or no PyTorch); 4 `calibrate`
refused a GPU that compute processes hold; 70 an internal error (a bug: please
report it); 130 interrupted.

`-` as an output path (`run --json -`, `run --report -`, `report --out -`) means standard output;
the progress lines and the summary then go to standard error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 70, 130
EXIT_NOTHING_MEASURED = 3
STDOUT = "-"
# --fail-on LEVEL: the severities that fail the run (`confirmed` keeps its first meaning: warning or critical)
FAIL_ON = {"confirmed": ("warning", "critical"), "warning": ("warning", "critical"), "critical": ("critical",)}


class UsageError(Exception):
    pass


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"a whole number of 1 or more, not {text!r}")
    return n


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runbook",
        description="Investigate a GPU inference host with a runbook: a tree of hypotheses, probes and rules.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def probes_dir(p: argparse.ArgumentParser) -> None:
        p.add_argument("--probes-dir", action="append", default=[], metavar="DIR", help="load every probe file in DIR (repeatable)")

    p = sub.add_parser("list", help="list the runbooks found (bundled, ./runbooks, RUNBOOK_PATH)")
    _json_flag(p)
    p = sub.add_parser("show", help="show a runbook's hypothesis tree")
    p.add_argument("runbook", metavar="NAME|FILE")
    probes_dir(p)
    _json_flag(p)
    p = sub.add_parser("validate", help="check runbook files; errors as FILE:LINE:COL: message")
    p.add_argument("files", nargs="+", metavar="NAME|FILE")
    probes_dir(p)
    sub.add_parser("schema", help="print the JSON Schema of the runbook format (for editors)")
    p = sub.add_parser("probes", help="list the probes available, and plugins that failed to load; with NAME, one probe's params and values")
    p.add_argument("name", nargs="?", metavar="NAME", help="a probe's name: print its params and the values it returns")
    probes_dir(p)
    _json_flag(p)
    p = sub.add_parser("report", help="render the Markdown report again from a results JSON")
    p.add_argument("results", metavar="RESULTS.json")
    p.add_argument("--out", metavar="FILE.md", help="where to write, - for standard output (default: reports/<runbook>-<time>.md)")

    p = sub.add_parser("run", help="run a runbook against a host")
    p.add_argument("runbook", metavar="NAME|FILE")
    p.add_argument("--server-url", "--sglang-url", dest="server_url",
                   default=os.environ.get("RUNBOOK_SERVER_URL") or os.environ.get("RUNBOOK_SGLANG_URL") or "http://127.0.0.1:30000",
                   help="the SGLang or vLLM server; its kind is detected from what it answers (default: %(default)s, or "
                   "RUNBOOK_SERVER_URL; --sglang-url and RUNBOOK_SGLANG_URL are its deprecated old names, still read)")
    p.add_argument("--server-kind", choices=("sglang", "vllm"), default=None,
                   help="the server kind, instead of detecting it (decides which probe family talks to it)")
    p.add_argument("--api-key", default=None, help="the server's API key (or RUNBOOK_API_KEY); never written to results")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a runbook param (repeatable)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (- for standard output)")
    p.add_argument("--report", metavar="PATH", help="write the Markdown report here, - for standard output (default: reports/<runbook>-<time>.md)")
    p.add_argument("--no-tui", action="store_true", help="print progress lines instead of the live TUI")
    p.add_argument("--simulate", metavar="SCENARIO", help="run against the built-in simulated host (a scenario name or file)")
    p.add_argument("--calibration", metavar="PATH",
                   help="the GPUs' own power curve (`runbook calibrate`'s file, or a directory of them); default on a real host: "
                   "the user's calibration directory; a simulated run reads one only when named")
    fail_on = p.add_argument("--fail-on", action="append", default=[], metavar="WHAT",
                   help="exit 1 when: 'confirmed' or 'warning' (a warning or critical hypothesis is confirmed), 'critical'; "
                   "with --baseline also 'regressed' or 'metric:NAME:-5%%' (beyond noise only); repeatable")
    fail_on.completions = list(FAIL_ON)  # what shell completion offers (metric:NAME:N% is free-form)
    p.add_argument("--record-all", action="store_true", help="also run the probes of branches a refuted parent skips, so later rules can be judged against this run")
    p.add_argument("--baseline", metavar="BEFORE.json", help="after the run, diff it against this earlier results file (printed as Markdown)")
    p.add_argument("-v", "--verbose", action="store_true", help="also print node and probe starts")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the final summary and errors (no TUI)")
    p.add_argument("--depth", choices=["quick", "standard", "deep"], default="standard",
                   help="quick: a look in seconds (no load, no profile); standard: the runbook's load and profile; deep: adds its deep params (default: %(default)s)")
    probes_dir(p)

    p = sub.add_parser("rejudge", help="decide every verdict again from a results JSON's recorded evidence (offline: no GPU, no server)")
    p.add_argument("results", metavar="RESULTS.json")
    p.add_argument("--runbook", metavar="NAME|FILE", help="judge with this runbook (default: the one that made the run, as the results keep it)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a runbook param (repeatable)")
    p.add_argument("--json", metavar="PATH", help="write the new results as JSON")
    p.add_argument("--report", metavar="PATH", help="write the Markdown report here (default: reports/<runbook>-<time>.md)")
    probes_dir(p)

    p = sub.add_parser("diff", help="compare two results files: comparability, verdict transitions, key figures against noise")
    p.add_argument("before", metavar="BEFORE.json")
    p.add_argument("after", metavar="AFTER.json")
    p.add_argument("--json", metavar="PATH", help="also write the diff as JSON ('-' for stdout, instead of the Markdown)")
    p.add_argument("--out", metavar="FILE.md", help="write the Markdown here instead of stdout")
    p.add_argument("--change", action="append", default=[], metavar="KEY",
                   help="the header row that is the change under test (e.g. server_version, or a server arg name); repeatable")
    p.add_argument("--fail-on", action="append", default=[], metavar="WHAT", help="exit 1 on 'regressed' or 'metric:NAME:-5%%' (beyond noise only); repeatable")
    probes_dir(p)

    p = sub.add_parser("test", help="run a runbook against simulated scenarios and compare verdicts with the expected ones")
    p.add_argument("runbook", metavar="NAME|FILE")
    p.add_argument("--scenario", action="append", default=[], metavar="S", help="only these scenarios (repeatable)")
    p.add_argument("-j", "--jobs", type=_positive_int, default=1, metavar="N",
                   help="run N scenarios at once, each in its own process (a simulated host runs in real time and mostly waits)")
    probes_dir(p)

    p = sub.add_parser("scenarios", help="list the simulated host's bundled scenarios")
    _json_flag(p)
    p = sub.add_parser(
        "simulate",
        help="serve a scenario's own simulated server (SGLang or vLLM, as the scenario says) on 127.0.0.1 until Ctrl-C "
        "(for curl, a benchmark client, a browser)",
        description="Serve the scenario's own simulated server, SGLang or vLLM as its `server.kind` says, on 127.0.0.1 "
        "until Ctrl-C. The first line of output is its base URL; everything else goes to stderr, starting with the "
        "kind and version it serves.",
    )
    p.add_argument("scenario", metavar="SCENARIO", help="a scenario name (see `runbook scenarios`) or file")
    p.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: 0, any free one)")
    p = sub.add_parser("trace", help="break down GPU traces you already have (Kineto/PyTorch .json[.gz], files or directories)")
    p.add_argument("paths", nargs="*", metavar="PATH", help="one capture: trace files, or directories of *.json / *.json.gz traces")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                   help="compare two captures (each a trace file or a directory of one capture's files) bucket by bucket and pass kind by pass kind")
    p.add_argument("--rules", action="append", default=[], metavar="FILE", help="extra bucket-rule YAML, tried before the shipped rules")
    p.add_argument("--json", action="store_true", help="print the breakdown (or the comparison) as JSON")
    from .fleet.cli import add_parser as add_fleet_parser  # noqa: PLC0415 - `runbook fleet` (issue 24)

    add_fleet_parser(sub)
    p = sub.add_parser("calibrate", help="measure this GPU's power curve (copy, decode-shaped and compute GEMMs) on the idle GPU, for gpu.reference",
                       description="Run each load alone on the idle GPU (refused when a compute process holds it) with NVML sampled "
                       "beside it, and write the draw, clocks, clock event reasons and rates by arithmetic intensity. The loads need "
                       "PyTorch (the inference server's environment has it).")
    p.add_argument("--gpu", type=int, default=0, metavar="N", help="the GPU to measure, by NVML index as nvidia-smi shows it (default: 0)")
    p.add_argument("--seconds", type=float, default=None, metavar="S", help="how long each load is measured, after its warm-up (default: 4)")
    p.add_argument("--warmup", type=float, default=None, metavar="S", help="how long each load runs before it is measured (default: 2; NVML's power is a 1 s average)")
    p.add_argument("--batches", default=None, metavar="N,N,...", help="the decode GEMMs' batches (default: 1,8,32,64,128,256,512,1024,2048)")
    p.add_argument("--out", metavar="PATH", help="where to write: a .json file or a directory (default: $XDG_CONFIG_HOME/gpu-runbook/calibration/)")
    p.add_argument("--json", action="store_true", help="also print the calibration as JSON on standard output (progress goes to standard error)")
    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh or fish)")
    p.add_argument("shell", choices=["bash", "zsh", "fish"])
    return parser


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print a machine-readable JSON listing")


def _print_json(data: Any) -> None:
    """Listings as indented JSON (the completion scripts read the top-level "name" keys)."""
    import json  # noqa: PLC0415

    print(json.dumps(data, indent=2, default=str))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for a near miss among `choices`, else ''."""
    import difflib  # noqa: PLC0415

    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _registry(args: argparse.Namespace):
    from .registry import Registry  # noqa: PLC0415

    dirs = getattr(args, "probes_dir", []) or []
    for directory in dirs:
        try:
            is_dir = Path(directory).is_dir()
        except OSError as exc:  # a name longer than the OS allows
            raise UsageError(f"--probes-dir {_clip(directory)}: {exc.strerror or exc}") from None
        if not is_dir:
            raise UsageError(f"--probes-dir {_clip(directory)}: no such directory")
    return Registry.discover(dirs)


def _load(name: str, registry) -> Any:
    from .loader import LoadError, load_path_or_name  # noqa: PLC0415

    try:
        return load_path_or_name(name, registry)
    except LoadError as exc:
        raise UsageError(str(exc) + _runbook_suggestion(name)) from None


def _runbook_suggestion(name: str) -> str:
    from .loader import available  # noqa: PLC0415

    return "" if _exists(name) else did_you_mean(name, available())


def cmd_list(args: argparse.Namespace) -> int:
    from .loader import available  # noqa: PLC0415
    from .yamlpos import SourceError, load  # noqa: PLC0415

    rows = []
    for name, path in sorted(available().items()):
        try:
            data = load(path).data
            title = data.get("title", "") if isinstance(data, dict) else ""
        except SourceError:
            title = "(cannot be read: run `runbook validate`)"
        rows.append({"name": name, "title": title, "path": str(path)})
    if args.json:
        _print_json(rows)
        return EXIT_OK
    for row in rows:
        print(f"{row['name']:<24} {row['title']}  [{row['path']}]")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    loaded = _load(args.runbook, _registry(args))
    rb = loaded.runbook
    if args.json:
        _print_json(_show_data(loaded))
        return EXIT_OK
    print(f"{rb.name}: {rb.title}")
    if rb.params:
        print("params: " + ", ".join(f"{k}={p.default}" for k, p in rb.params.items()))
    depth: dict[str, int] = {}
    for hyp, parent in rb.walk():
        depth[hyp.id] = 0 if parent is None else depth[parent.id] + 1
        probes = ", ".join(f"{a}={c.probe}{'*' if c.under_load else ''}" for a, c in hyp.probes.items())
        print(f"{'  ' * depth[hyp.id]}- {hyp.id} [{getattr(hyp.severity, 'value', hyp.severity)}]: {hyp.title}" + (f"  ({probes})" if probes else ""))
    print("(* = sampled under load)")
    return EXIT_OK


def _show_data(loaded: Any) -> dict[str, Any]:
    """`show --json`: the tree as rows in walk order, each naming its parent."""
    rb = loaded.runbook
    rows = []
    for hyp, parent in rb.walk():
        rows.append({
            "id": hyp.id,
            "parent": None if parent is None else parent.id,
            "title": hyp.title,
            "severity": getattr(hyp.severity, "value", hyp.severity),
            "probes": {a: {"probe": c.probe, "under_load": c.under_load, "with": c.with_} for a, c in hyp.probes.items()},
        })  # fmt: skip
    params = {k: {"type": getattr(p.type, "value", p.type), "default": p.default, "description": p.description} for k, p in rb.params.items()}
    return {"name": rb.name, "title": rb.title, "path": str(loaded.path), "params": params, "hypotheses": rows}


def cmd_validate(args: argparse.Namespace) -> int:
    from .loader import LoadError, load_path_or_name  # noqa: PLC0415

    registry = _registry(args)
    failed = False
    for name in args.files:
        try:
            if name.endswith(".tests.yaml") and Path(name).is_file():
                # a runbook's scenario-test sidecar: checked with its runbook (ids, params, scenario names)
                from .runbook_test import collect_cases  # noqa: PLC0415

                runbook_path = Path(name).with_name(Path(name).name[: -len(".tests.yaml")] + ".yaml")
                cases = collect_cases(load_path_or_name(str(runbook_path), registry))
                print(f"ok: {name} (scenario tests of {runbook_path.name}; {len(cases)} with its own)")
                continue
            loaded = load_path_or_name(name, registry)
            count = sum(1 for _ in loaded.runbook.walk())
            print(f"ok: {loaded.path} ({count} hypothes{'is' if count == 1 else 'es'})")
        except LoadError as exc:
            failed = True
            for err in exc.errors:
                print(str(err), file=sys.stderr)
    return EXIT_USAGE if failed else EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415

    from .model import Runbook  # noqa: PLC0415

    print(json.dumps(Runbook.model_json_schema(by_alias=True), indent=2))
    return EXIT_OK


def cmd_probes(args: argparse.Namespace) -> int:
    from .probe_info import describe, render  # noqa: PLC0415

    registry = _registry(args)
    for err in registry.errors:
        print(f"failed to load: {err.source}: {err.message}", file=sys.stderr)
    if args.name is not None:
        if args.name not in registry.probes:
            failed = registry.error_for(args.name)
            why = f" (its plugin failed to load: {failed.message})" if failed else did_you_mean(args.name, registry.probes)
            raise UsageError(f"no probe named '{args.name}'{why}; `runbook probes` lists them")
        info = describe(registry.probes[args.name], registry.sources[args.name])
        if args.json:
            _print_json(info)
        else:
            print(render(info))
        return EXIT_OK
    if args.json:
        _print_json([describe(registry.probes[n], registry.sources[n]) for n in sorted(registry.probes)])
        return EXIT_OK
    for name in sorted(registry.probes):
        cls = registry.probes[name]
        print(f"{name:<18} {cls.description}  [{registry.sources[name]}]")
    return EXIT_OK


def _exists(path: str) -> bool:
    """Path.exists() that says False for a name the OS refuses (too long, a loop of links) instead of raising."""
    try:
        return Path(path).exists()
    except OSError:
        return False


def _read_results(path: str) -> Any:
    from .results import ResultsError, read_results  # noqa: PLC0415

    try:
        if _exists(path) and not Path(path).is_file():  # /dev/zero would be read forever
            raise UsageError(f"{_clip(path)}: not a runbook results file: not a regular file")
        return read_results(path)
    except ResultsError as exc:
        raise UsageError(str(exc).replace(path, _clip(path), 1)) from None
    except OSError as exc:  # a name longer than the OS allows, before the file is even opened
        raise UsageError(f"{_clip(path)}: cannot read: {exc.strerror or exc}") from None


def cmd_report(args: argparse.Namespace) -> int:
    from . import report  # noqa: PLC0415

    _check_outputs({"--out": args.out}, {"results file": Path(args.results)})
    _check_writable(args.out, "--out")
    results = _read_results(args.results)
    if args.out == STDOUT:
        sys.stdout.write(report.render(results))
        return EXIT_OK
    path = report.write(results, args.out)
    print(f"Report: {path}")
    return EXIT_OK


def _parse_sets(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--set expects NAME=VALUE, got '{item}'")
        name, value = item.split("=", 1)
        out[name.strip()] = value
    return out


def _check_writable(path: str | None, flag: str) -> None:
    """Fail before the run, not after it: an output that cannot be written is a usage error."""
    if path is None or path == STDOUT:  # not asked for, or standard output
        return
    if not path.strip():
        raise UsageError(f"{flag}: the path is empty (give a file name, or leave {flag} out)")
    try:
        parent = Path(path).expanduser().resolve().parent
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {_clip(path)}: cannot create its directory: {exc.strerror or exc}") from None
    target = Path(path).expanduser()
    try:
        existed = target.exists()
        if target.is_dir():
            raise UsageError(f"{flag} {_clip(path)}: is a directory (give a file name)")
        with open(target, "a", encoding="utf-8"):
            pass
        if not existed:
            target.unlink(missing_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {_clip(path)}: cannot write there: {exc.strerror or exc}") from None


def _clip(path: str, limit: int = 120) -> str:
    """A path as it goes into an error line: a name longer than the OS allows must not fill the terminal."""
    return path if len(path) <= limit else f"{path[:60]}...{path[-40:]} ({len(path)} characters)"


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.expanduser().resolve() == b.expanduser().resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _check_outputs(outputs: dict[str, str | None], inputs: dict[str, Path]) -> None:
    """An output must not overwrite an input (the runbook, a scenario, a probe file) or the other output.

    Checked before anything runs: a results file written over the runbook it came from loses the runbook."""
    for flag, path in outputs.items():
        if path is not None and not path.strip():
            raise UsageError(f"{flag}: the path is empty (give a file name, or leave {flag} out)")
    given = [(flag, Path(path)) for flag, path in outputs.items() if path and path != "-"]
    for i, (flag, out) in enumerate(given):
        for what, source in inputs.items():
            if _same_file(out, source):
                raise UsageError(f"{flag} {_clip(str(out))}: is the {what}; writing there would overwrite it (choose another path)")
        for other_flag, other in given[i + 1 :]:
            if _same_file(out, other):
                raise UsageError(f"{flag} and {other_flag} are the same file ({_clip(str(out))}): one would overwrite the other")


def _input_files(loaded: Any, registry: Any, simulate: str | None) -> dict[str, Path]:
    """Every file a run reads that an output path could clobber, named as the user knows it."""
    import inspect  # noqa: PLC0415

    files: dict[str, Path] = {"runbook": Path(loaded.path)}
    if simulate:
        from .sim.scenario import find_scenario  # noqa: PLC0415
        from .yamlpos import SourceError  # noqa: PLC0415

        try:
            files["scenario file"] = find_scenario(simulate)
        except (SourceError, OSError):
            pass  # load_scenario says what is wrong with it
    for rel in loaded.runbook.probe_files:
        files[f"probe file {rel}"] = Path(loaded.path).parent / rel
    for name, cls in registry.probes.items():
        try:
            source = inspect.getsourcefile(cls)
        except TypeError:
            source = None
        if source:
            files.setdefault(f"probe file {source} (probe {name})", Path(source))
    return files


def _check_server_url(url: str) -> None:
    """The URL goes into results, reports and error messages: it must carry no secret."""
    from urllib.parse import urlsplit  # noqa: PLC0415

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise UsageError(f"--server-url/--sglang-url {url}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--server-url/--sglang-url {url}: expected http://HOST:PORT (the SGLang or vLLM server's address)")
    if parts.username is not None or parts.password is not None:
        raise UsageError("--server-url: credentials in the URL would be written to results and reports; pass the key with --api-key or RUNBOOK_API_KEY")


RUN_FAIL_ON = tuple(FAIL_ON)  # severities: no baseline needed


def _check_calibration(path: str) -> None:
    """A calibration named on the command line must be there and readable: silently judging against the table
    instead would be a different verdict than the one asked for."""
    from .calibration import CalibrationError, read  # noqa: PLC0415

    p = Path(path)
    if p.is_dir():
        return
    if not p.is_file():
        raise UsageError(f"--calibration {_clip(path)}: no such file or directory (runbook calibrate writes one)")
    try:
        read(p)
    except CalibrationError as exc:
        raise UsageError(f"--calibration: {exc}") from None


def _check_fail_on(specs: list[str], allowed_plain: tuple[str, ...] = ()) -> None:
    from .diff import parse_fail_on  # noqa: PLC0415

    for spec in specs:
        if spec in allowed_plain:
            continue
        try:
            parse_fail_on(spec)
        except ValueError as exc:
            raise UsageError(str(exc)) from None


def _wants_tui(args: argparse.Namespace) -> bool:
    to_stdout = STDOUT in (args.json, args.report)
    return not args.no_tui and not args.quiet and not to_stdout and sys.stdout.isatty() and sys.stdin.isatty()


def cmd_run(args: argparse.Namespace) -> int:
    if _wants_tui(args):  # the screen first; the runbook loads behind it (gpu_runbook.tui.launch)
        from .tui.launch import run_tui_first  # noqa: PLC0415

        restore_signals = _terminate_as_interrupt()
        try:
            return run_tui_first(lambda: _cmd_run(args), Path(args.runbook).stem)
        finally:
            restore_signals()
    return _cmd_run(args)


def _cmd_run(args: argparse.Namespace) -> int:
    from .runner import ParamError, resolve_params  # noqa: PLC0415

    outputs = {"--json": args.json, "--report": args.report}
    _check_outputs(outputs, {})  # an empty path is refused before the runbook is even read
    if args.json == STDOUT and args.report == STDOUT:
        raise UsageError("--json - and --report - both ask for standard output: give one of them a file")
    _check_writable(args.json, "--json")
    _check_writable(args.report, "--report")
    _check_fail_on(args.fail_on, RUN_FAIL_ON)
    baseline = _read_results(args.baseline) if args.baseline else None
    diff_specs = [s for s in args.fail_on if s not in RUN_FAIL_ON]
    if diff_specs and baseline is None:
        raise UsageError(f"--fail-on {diff_specs[0]}: needs --baseline BEFORE.json (only confirmed, warning and critical work without one)")

    registry = _registry(args)
    loaded = _load(args.runbook, registry)
    _check_outputs(outputs, _input_files(loaded, registry, args.simulate))
    _check_writable(args.json, "--json")
    _check_writable(args.report, "--report")
    sets = _parse_sets(args.set)
    try:
        params = resolve_params(loaded, sets, args.depth, registry)
    except ParamError as exc:
        unknown = next((n for n in sets if n not in loaded.runbook.params), None)
        raise UsageError(str(exc) + (did_you_mean(unknown, loaded.runbook.params) if unknown else "")) from None
    if args.simulate:
        from .loader import LoadError  # noqa: PLC0415
        from .sim.scenario import available_scenarios, load_scenario  # noqa: PLC0415

        try:
            load_scenario(args.simulate)
        except LoadError as exc:
            hint = "" if _exists(args.simulate) else did_you_mean(args.simulate, available_scenarios())
            raise UsageError(str(exc) + hint) from None
        except OSError as exc:  # a name longer than the OS allows
            raise UsageError(f"--simulate {_clip(args.simulate)}: {exc.strerror or exc}") from None
    _check_server_url(args.server_url)
    if args.calibration:
        _check_calibration(args.calibration)
    api_key = args.api_key or os.environ.get("RUNBOOK_API_KEY") or None
    to_stdout = STDOUT in (args.json, args.report)
    use_tui = _wants_tui(args)
    from .depth import next_command  # noqa: PLC0415
    from .session import run_session  # noqa: PLC0415

    restore_signals = _terminate_as_interrupt()
    # with `-`, standard output carries only the JSON or the report: progress and summary go to stderr
    try:
        with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
            outcome = run_session(
                loaded,
                registry,
                params,
                server_url=args.server_url,
                api_key=api_key,
                simulate=args.simulate,
                json_path=None if args.json == STDOUT else args.json,
                report_path=args.report,
                tui=use_tui,
                verbose=args.verbose,
                quiet=args.quiet,
                record_all=args.record_all,
                depth=args.depth,
                next_command=next_command(args.runbook, args.depth, simulate=args.simulate, server_url=args.server_url,
                                          sets=args.set, probes_dirs=args.probes_dir),
                server_kind=args.server_kind,
                calibration=args.calibration,
            )
    finally:
        restore_signals()
    _print_stdout_output(args, outcome.results)
    return _run_exit_code(args, outcome, registry, baseline, diff_specs)


def _print_stdout_output(args: argparse.Namespace, results: Any) -> None:
    if args.json == STDOUT:
        sys.stdout.write(results.model_dump_json(indent=2) + "\n")
    elif args.report == STDOUT:
        from . import report  # noqa: PLC0415

        sys.stdout.write(report.render(results))
    sys.stdout.flush()


def nothing_measured(results: Any) -> bool:
    """Every probe call came back unavailable or failed: the verdicts say nothing about the target."""
    from .evidence import ProbeStatus  # noqa: PLC0415

    return bool(results.probes) and all(call.status is not ProbeStatus.ok for call in results.probes)


def _run_exit_code(args: argparse.Namespace, outcome: Any, registry: Any, baseline: Any, diff_specs: list[str]) -> int:
    """In this order: interrupted, an output not written, nothing measured, --fail-on, success."""
    results = outcome.results
    if results.interrupted:
        return EXIT_INTERRUPTED
    if (args.json and args.json != STDOUT and outcome.json_path is None) or (args.report != STDOUT and outcome.report_path is None):
        return EXIT_USAGE  # an output asked for could not be written (said on stderr)
    if nothing_measured(results):
        print(f"runbook: nothing could be measured (every probe unavailable or failed): exit {EXIT_NOTHING_MEASURED}", file=sys.stderr)
        return EXIT_NOTHING_MEASURED
    failed = False
    if baseline is not None:
        from . import diff  # noqa: PLC0415

        from .cel_budget import run_budget  # noqa: PLC0415

        from .loader import LoadError  # noqa: PLC0415

        try:
            with run_budget():  # the baseline's recorded rules are a results file's: bounded
                d = diff.diff(baseline, results, registry, before_path=args.baseline, after_path=str(outcome.json_path or "this run"))
        except LoadError as exc:
            raise UsageError(f"--baseline {_clip(args.baseline)}: the runbook that made it cannot be loaded: {exc}") from None
        print("\n" + diff.render_markdown(d), end="", flush=True)
        failed = _report_failures(diff.failures(d, diff_specs))
    severities = {sev for spec in args.fail_on if spec in FAIL_ON for sev in FAIL_ON[spec]}
    if severities and any(h.severity.value in severities for h in results.confirmed()):
        return EXIT_FINDINGS
    return EXIT_FINDINGS if failed else EXIT_OK


def _report_failures(found: list[str]) -> bool:
    for line in found:
        print(f"fail-on: {line}", file=sys.stderr)
    return bool(found)


def cmd_rejudge(args: argparse.Namespace) -> int:
    from .rejudge import rejudge, runbook_of  # noqa: PLC0415
    from .runner import ParamError  # noqa: PLC0415
    from .session import write_outputs  # noqa: PLC0415
    from .progress import summary  # noqa: PLC0415
    from .loader import LoadError  # noqa: PLC0415

    _check_writable(args.json, "--json")
    _check_writable(args.report, "--report")
    results = _read_results(args.results)
    registry = _registry(args)
    try:
        loaded = _load(args.runbook, registry) if args.runbook else runbook_of(results, registry)
    except LoadError as exc:
        raise UsageError(f"{args.results}: the runbook that made the run: {exc} (pass --runbook FILE)") from None
    from .cel_budget import run_budget  # noqa: PLC0415

    try:
        with run_budget():  # the rules may be a results file's: all of them share one time budget
            judged = rejudge(results, loaded, registry, _parse_sets(args.set), source=args.results)
    except ParamError as exc:
        raise UsageError(str(exc)) from None
    written_json, written_report = write_outputs(judged, args.json, args.report)
    print(summary(judged, str(written_json) if written_json else None, str(written_report) if written_report else None), flush=True)
    if (args.json and written_json is None) or written_report is None:
        return EXIT_USAGE
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:

    from . import diff  # noqa: PLC0415
    from .loader import LoadError  # noqa: PLC0415

    _check_fail_on(args.fail_on)
    if args.json and args.json != "-":
        _check_writable(args.json, "--json")
    _check_writable(args.out, "--out")
    before, after = _read_results(args.before), _read_results(args.after)
    registry = _registry(args)
    from .cel_budget import run_budget  # noqa: PLC0415

    try:
        with run_budget():  # the rules may be a results file's: all of them share one time budget
            d = diff.diff(before, after, registry, under_test=args.change, before_path=args.before, after_path=args.after)
    except LoadError as exc:
        raise UsageError(f"the runbook that made a run cannot be loaded: {exc}") from None
    try:
        found = diff.failures(d, args.fail_on)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.json == "-":
        print(d.model_dump_json(indent=2))
    else:
        if args.json:
            Path(args.json).write_text(d.model_dump_json(indent=2) + "\n", encoding="utf-8")
        text = diff.render_markdown(d)
        if args.out:
            Path(args.out).write_text(text, encoding="utf-8")
            print(f"Diff: {args.out}")
        else:
            print(text, end="")
    return EXIT_FINDINGS if _report_failures(found) else EXIT_OK


def _terminate_as_interrupt() -> "Callable[[], None]":
    """SIGTERM (a `kill`, a container stopping) ends a run as Ctrl-C does: what was found is written.

    It is routed through SIGINT's handler, which asyncio replaces while the run is on to cancel it
    cleanly. A background job starts with SIGINT ignored; asyncio then leaves SIGINT alone, so the
    default handler is put back for the run (a background job gets no Ctrl-C from the terminal anyway)."""
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415

    if threading.current_thread() is not threading.main_thread():  # the TUI's loading thread: main set it up
        return lambda: None
    if not hasattr(signal, "SIGTERM") or signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return lambda: None
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def as_interrupt(_signum: int, frame: Any) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # pragma: no cover - SIGINT set to SIG_DFL/SIG_IGN by someone else meanwhile
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, as_interrupt)

    def restore() -> None:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])

    return restore


def cmd_test(args: argparse.Namespace) -> int:
    from .runbook_test import run_tests  # noqa: PLC0415

    from .loader import LoadError  # noqa: PLC0415

    registry = _registry(args)
    loaded = _load(args.runbook, registry)
    try:
        return EXIT_OK if run_tests(loaded, registry, args.scenario, jobs=args.jobs, probe_dirs=args.probes_dir) else EXIT_FINDINGS
    except LoadError as exc:
        from .sim.scenario import available_scenarios  # noqa: PLC0415

        unknown = next((s for s in args.scenario if s not in available_scenarios() and not _exists(s)), None)
        raise UsageError(str(exc) + (did_you_mean(unknown, available_scenarios()) if unknown else "")) from None


def cmd_scenarios(args: argparse.Namespace) -> int:
    from .loader import LoadError  # noqa: PLC0415
    from .sim.scenario import available_scenarios, load_scenario  # noqa: PLC0415

    found = sorted(available_scenarios().items())
    rows = []
    for name, path in found:
        try:
            about = load_scenario(path).about or "(no about line)"
        except LoadError as exc:
            about = f"invalid: {exc.errors[0]}"
        rows.append((name, about, path))
    if args.json:
        _print_json([{"name": name, "about": about, "path": str(path)} for name, about, path in rows])
        return EXIT_OK
    for name, about, path in rows:
        print(f"{name:<28} {about} [{path}]")
    return EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from .loader import LoadError  # noqa: PLC0415
    from .sim.host import SimulatedHost  # noqa: PLC0415
    from .sim.scenario import available_scenarios, load_scenario  # noqa: PLC0415
    from .target import kind_title  # noqa: PLC0415

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: expected 0 (any free port) to 65535")
    try:
        scenario = load_scenario(args.scenario)
    except LoadError as exc:
        hint = "" if _exists(args.scenario) else did_you_mean(args.scenario, available_scenarios())
        raise UsageError(str(exc) + hint) from None
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with SimulatedHost.start(scenario, port=args.port) as host:
            print(host.url, flush=True)
            server = scenario.server
            print(
                f"serving {kind_title(server.kind)} {server.version} of scenario {scenario.name}: {scenario.title} (model {server.served_model_name or server.model_path})"
                + ("; requests need its API key (Authorization: Bearer)" if server.api_key else "")
                + "; Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )
            while not stop.wait(0.5):
                pass
    except RuntimeError as exc:  # the server could not listen (port taken, no permission)
        raise UsageError(f"runbook simulate: cannot serve on 127.0.0.1:{args.port}: {exc}") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("stopped", file=sys.stderr)
    return EXIT_OK


def cmd_trace(args: argparse.Namespace) -> int:
    """Exit 1 when any file gave no breakdown (no kernel events, unreadable), or with --compare when a side
    gave none: tools see it without parsing."""
    from .loader import LoadError  # noqa: PLC0415
    from .trace import compare  # noqa: PLC0415
    from .trace.describe import describe, render_text  # noqa: PLC0415
    from .trace.rules import classifier  # noqa: PLC0415

    if args.compare and args.paths:
        raise UsageError("runbook trace: give one capture (PATH...) or --compare BEFORE AFTER, not both")
    if not args.compare and not args.paths:
        raise UsageError("runbook trace: give the trace files or directories of one capture (PATH...), or --compare BEFORE AFTER")
    try:
        cls = classifier(args.rules)
    except LoadError as exc:
        raise UsageError("\n".join(str(e) for e in exc.errors)) from None
    doc = compare.compare(*args.compare, cls) if args.compare else describe(args.paths, cls)
    if args.json:
        _print_json(doc)
    else:
        print(compare.render_text(doc) if args.compare else render_text(doc))
    return EXIT_OK if doc["ok"] else 1


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibrate import UsageProblem, calibrate_main  # noqa: PLC0415

    try:
        return calibrate_main(args)
    except UsageProblem as exc:
        raise UsageError(str(exc)) from None


def cmd_completion(args: argparse.Namespace) -> int:
    from .completion import script  # noqa: PLC0415

    sys.stdout.write(script(args.shell, _parser()))
    return EXIT_OK


def cmd_fleet(args: argparse.Namespace) -> int:
    from .fleet.cli import cmd_fleet as run_fleet  # noqa: PLC0415

    return run_fleet(args, UsageError, _registry, _load, _parse_sets)


COMMANDS = {
    "fleet": cmd_fleet,
    "list": cmd_list,
    "show": cmd_show,
    "validate": cmd_validate,
    "schema": cmd_schema,
    "probes": cmd_probes,
    "report": cmd_report,
    "run": cmd_run,
    "rejudge": cmd_rejudge,
    "diff": cmd_diff,
    "test": cmd_test,
    "scenarios": cmd_scenarios,
    "simulate": cmd_simulate,
    "trace": cmd_trace,
    "calibrate": cmd_calibrate,
    "completion": cmd_completion,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__  # noqa: PLC0415

        print(f"runbook {__version__}")
        return EXIT_OK
    if not args.command:
        parser.print_usage(sys.stderr)
        print("run `runbook --help` for the commands", file=sys.stderr)
        return EXIT_USAGE
    from .scrub import ScrubbedStream, secret_forms  # noqa: PLC0415

    # Server, trace and results-file strings reach the terminal only through here: no escape sequences, no key.
    secrets = secret_forms(getattr(args, "api_key", None) or os.environ.get("RUNBOOK_API_KEY"))
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ScrubbedStream(sys.stdout, secrets), ScrubbedStream(sys.stderr, secrets)
    try:
        return _dispatch(args)
    finally:
        if isinstance(sys.stdout, ScrubbedStream):
            sys.stdout = streams[0]
        if isinstance(sys.stderr, ScrubbedStream):
            sys.stderr = streams[1]


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # a bug, not bad input: say so in one line, keep the traceback for who asks
        if os.environ.get("RUNBOOK_DEBUG"):
            raise
        print(f"runbook: internal error: {type(exc).__name__}: {exc} (set RUNBOOK_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
