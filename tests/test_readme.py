"""The docs' examples are the tested example files (docs/runbooks.md, docs/probes.md), and the README's test command
is what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).parent.parent
README = (REPO / "README.md").read_text()


def blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_runbook_example_is_the_tested_file():
    page = (REPO / "docs" / "runbooks.md").read_text()
    assert (REPO / "examples" / "cpu-saturated.yaml").read_text().rstrip() + "\n" in blocks("yaml", page)


def test_probe_example_is_the_tested_file():
    page = (REPO / "docs" / "probes.md").read_text()
    assert (REPO / "examples" / "probe-files" / "loadavg.py").read_text().rstrip() + "\n" in blocks("python", page)


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_command():
    first = blocks("bash")[0]
    commands = [line for line in first.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert commands[0].endswith("runbook run power-starvation --simulate seed-rtx-pro-6000-tp8 --set load_concurrency=2048 --set load_input_len=256")
    test_cmd = commands[1].split("&& ", 2)[-1]
    assert test_cmd == 'pip install ".[test]" && python -m pytest'
    assert 'pip install -q ".[test]" && python -m pytest' in (REPO / ".ci" / "run").read_text()
    assert README.index("```bash") < README.index("## ")
