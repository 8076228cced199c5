"""Extract the default ServerArgs of a released SGLang wheel into engine/sim/data/server_args_<version>.json.

Why: the simulator's `/server_info` must carry every key a real release reports, with its defaults,
and those come from the released source, not from our guesses. Run against an unpacked wheel:

    pip download --no-deps sglang==0.5.5.post3 -d /tmp/sg && unzip -q /tmp/sg/*.whl -d /tmp/sg/x
    python -m gpu_runbook.sim.server_args_extract /tmp/sg/x 0.5.5.post3

Classic releases (<=0.5.13) declare one `@dataclasses.dataclass class ServerArgs` in
`sglang/srt/server_args.py`; refactored ones (0.5.22+) spread msgspec Structs over
`sglang/srt/arg_groups/fields/*.py`. Only annotated fields with a literal default (or a
`default_factory` of list/dict) keep their value; any other default is recorded as null.
The output keeps the source's field order (that is the order `asdict` emits).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"


def _default(node: ast.expr | None) -> Any:
    if node is None:
        return None
    if isinstance(node, ast.Call):  # dataclasses.field(default=..., default_factory=list)
        for kw in node.keywords:
            if kw.arg == "default":
                return _default(kw.value)
            if kw.arg == "default_factory":
                name = getattr(kw.value, "id", getattr(kw.value, "attr", ""))
                return {"list": [], "dict": {}}.get(name)
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        pass
    if all(isinstance(n, (ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop)) for n in ast.walk(node)):
        return eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}})  # constants only
    return None


def _class_fields(cls: ast.ClassDef) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
            if name.startswith("_") or "ClassVar" in ast.unparse(stmt.annotation):
                continue
            out[name] = _default(stmt.value)
    return out


def classic(root: Path) -> dict[str, Any]:
    tree = ast.parse((root / "sglang/srt/server_args.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            return _class_fields(node)
    raise SystemExit("no ServerArgs dataclass found")


def refactored(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted((root / "sglang/srt/arg_groups/fields").glob("*.py")):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.ClassDef):
                out.update(_class_fields(node))
    return out


def main(argv: list[str]) -> None:
    root, version = Path(argv[0]), argv[1]
    fields = refactored(root) if (root / "sglang/srt/arg_groups/fields").is_dir() else classic(root)
    DATA.mkdir(exist_ok=True)
    target = DATA / f"server_args_{version}.json"
    target.write_text(json.dumps({"version": version, "fields": fields}, indent=1) + "\n", encoding="utf-8")
    print(f"{target}: {len(fields)} fields")


if __name__ == "__main__":
    main(sys.argv[1:])
