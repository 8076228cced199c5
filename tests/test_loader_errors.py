"""The broken-runbook corpus: every file must fail with its message at its position, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_runbook.loader import LoadError, load

BROKEN = Path(__file__).parent / "broken"

EXPECTED = {
    "01-yaml-syntax.yaml": ("6:4", "YAML syntax error"),
    "02-unknown-top-key.yaml": ("3:1", "unknown key 'hypothesis'"),
    "03-missing-hypotheses.yaml": ("1:1", "missing required field 'hypotheses'"),
    "04-missing-confirm.yaml": ("4:5", "missing required field 'confirm'"),
    "05-typo-key.yaml": ("6:5", "unknown key 'confrim'"),
    "06-bad-id.yaml": ("4:9", "id 'Power_Limit' must be kebab-case"),
    "07-duplicate-id.yaml": ("8:13", "duplicate hypothesis id 'a' (first at line 4)"),
    "08-unknown-probe.yaml": ("7:19", "unknown probe 'gpu.telepathy'"),
    "09-unknown-probe-param.yaml": ("10:11", "probe 'test.value' has no parameter 'bogus'"),
    "10-probe-param-type.yaml": ("10:20", "probe 'test.value' parameter 'delay_s': Input should be a valid number"),
    "11-cel-syntax.yaml": ("8:24", "confirm: CEL syntax error"),
    "12-alias-not-visible.yaml": ("11:14", "'power' is not a probe alias this rule can see"),
    "13-unknown-param-in-rule.yaml": ("10:14", "unknown param 'ratoi'"),
    "14-param-default-type.yaml": ("5:5", "params.seconds: expected int, got 'fifteen'"),
    "15-param-unknown-type.yaml": ("5:11", "params.seconds.type: Input should be 'int'"),
    "16-unknown-ref-in-with.yaml": ("11:15", "unknown param '${secs}'"),
    "17-unknown-ref-in-load.yaml": ("6:3", "load refers to unknown param '${load_concurrency}'"),
    "18-bad-severity.yaml": ("7:15", "severity: Input should be 'info', 'warning' or 'critical'"),
    "19-bad-explore.yaml": ("7:14", "explore: Input should be 'when-confirmed' or 'always'"),
    "20-reserved-alias.yaml": ("7:7", "probe alias 'params' is reserved"),
    "21-duplicate-key.yaml": ("7:5", "duplicate key 'title'"),
    "22-test-unknown-id.yaml": ("11:7", "expected verdict for unknown hypothesis 'b'"),
    "23-test-bad-verdict.yaml": ("10:10", "tests.0.expect.a: Input should be 'confirmed'"),
    "24-empty.yaml": ("1:1", "the file is empty"),
    "25-empty-tree.yaml": ("3:13", "List should have at least 1 item"),
    "26-when-child-alias.yaml": ("6:11", "when: 'c' is not a probe alias this rule can see"),
    "27-not-a-mapping.yaml": ("1:1", "a runbook must be a mapping"),
    "28-call-without-probe.yaml": ("8:9", "missing required field 'probe'"),
    "29-set-unknown-param.yaml": ("11:12", "unknown param 'secs'"),
    "30-cel-syntax-folded.yaml": ("10:19", "confirm: CEL syntax error"),
    "31-cel-syntax-literal.yaml": ("10:19", "confirm: CEL syntax error"),
    "32-unknown-function.yaml": ("10:17", "confirm: unknown function 'lower'"),
    # issue 15: documents beyond a bound, scalars YAML resolves but cannot convert, non-finite numbers
    "33-alias-bomb.yaml": ("11:16", "alias *x3: the document expands to more than 10,000 YAML nodes (limit: MAX_NODES"),
    "34-alias-bomb-in-title.yaml": ("7:9", "(limit: MAX_NODES"),
    "35-alias-bomb-unknown-key.yaml": ("8:9", "(limit: MAX_NODES"),
    "36-deep-flow-sequence.yaml": ("3:76", "nesting deeper than 64 levels (limit: MAX_DEPTH 64)"),
    "37-deep-block-mapping.yaml": ("67:129", "nesting deeper than 64 levels (limit: MAX_DEPTH 64)"),
    "38-deep-children.yaml": ("4:1752", "nesting deeper than 64 levels (limit: MAX_DEPTH 64)"),
    "39-bad-date.yaml": ("2:8", "'2001-13-01' is not a valid date or timestamp: month must be in 1..12"),
    "40-tag-int.yaml": ("6:14", "'abc' is not a valid integer"),
    "41-tag-float.yaml": ("6:14", "'abc' is not a valid number"),
    "42-tag-bool.yaml": ("7:43", "'maybe' is not a valid boolean"),
    "43-bad-timestamp.yaml": ("3:14", "'next tuesday' is not a valid date or timestamp"),
    "44-huge-int.yaml": ("6:14", "does not fit in 64 bits (limit: MAX_INT 2**63)"),
    "45-int-beyond-64-bit.yaml": ("6:14", "integer '9223372036854775808' does not fit in 64 bits"),
    "46-recursive-alias.yaml": ("8:16", "alias *loop refers to the node it is inside"),
    "47-inf-param-default.yaml": ("5:5", "params.ratio: expected a finite float, got inf"),
    "48-nan-timeout.yaml": ("7:42", "timeout_s: Input should be a finite number"),
    "49-inf-probe-param.yaml": ("7:48", "probe 'test.value' parameter 'delay_s': expected a finite number"),
    "50-inf-load-warmup.yaml": ("5:13", "load.warmup_s: expected a finite number, got inf"),
    "51-python-tag.yaml": ("3:14", "YAML tag !!python/object/apply:os.system is not supported"),
    "52-mapping-key-list.yaml": ("3:3", "a mapping key must be a plain value"),
    "53-control-character.yaml": ("2:19", "character U+0001 is not allowed in YAML"),
    # issue 14 item 6: a rule naming a value its probe does not return fails at the member that is wrong
    "54-value-typo.yaml": ("10:18", "confirm: 'power' has no value 'maen' (did you mean 'mean'?)"),
    "55-value-typo-top.yaml": ("12:21", "confirm: test.declared has no value 'powr' (did you mean 'power'?)"),
    "57-value-typo-headline.yaml": ("11:18", "headline field 2 ('m.power.mx'): 'power' has no value 'mx' (did you mean 'max'?)"),
    "58-load-value-typo.yaml": ("9:39", "confirm: the load report has no value 'output_tokens_per_sec' (did you mean 'output_tokens_per_s'"),
    "59-value-typo-plain-multiline.yaml": ("9:15", "confirm: 'power' has no value 'maen'"),
    "60-value-typo-quoted-escapes.yaml": ("8:43", "confirm: 'power' has no value 'maen'"),
    "61-value-typo-folded-blank-line.yaml": ("11:81", "confirm: an element of 'gpus' has no value 'power'"),
    "56-value-typo-element.yaml": ("10:28", "confirm: an element of 'gpus' has no value 'power' (did you mean 'power_w'?)"),
}


def test_corpus_is_complete():
    assert sorted(p.name for p in BROKEN.glob("*.yaml")) == sorted(EXPECTED)
    assert len(EXPECTED) >= 20


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_broken_runbook_reports_file_line_col(name, registry):
    where, message = EXPECTED[name]
    path = BROKEN / name
    with pytest.raises(LoadError) as info:
        load(path, registry)
    lines = [str(e) for e in info.value.errors]
    assert any(line.startswith(f"{path}:{where}: ") and message in line for line in lines), lines


def test_cli_validate_prints_position_and_exits_2_without_traceback():
    path = BROKEN / "12-alias-not-visible.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_runbook.cli", "validate", "--probes-dir", str(Path(__file__).parent / "probe_files"), str(path)],
        capture_output=True, text=True, cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode == 2
    assert f"{path}:11:14: confirm: 'power' is not a probe alias" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_cli_run_of_broken_runbook_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_runbook.cli", "run", str(BROKEN / "05-typo-key.yaml"), "--no-tui", "--report", str(tmp_path / "r.md")],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "05-typo-key.yaml:6:5: unknown key 'confrim'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r.md").exists()


def test_cli_validate_refuses_a_misspelled_value_of_a_builtin_probe(tmp_path):
    """Issue 14's example: `m.token_usag.max` used to validate and then, 21 s into a run, read as
    "inconclusive: missing", like a device that does not report the value."""
    path = tmp_path / "typo.yaml"
    path.write_text(
        "name: typo\ntitle: Typo\nhypotheses:\n  - id: kv-full\n    title: KV full\n"
        "    probes:\n      m: { probe: sglang.metrics, with: { duration_s: 5.0 } }\n"
        "    confirm: m.token_usag.max > 0.9\n",
        encoding="utf-8",
    )
    proc = subprocess.run([sys.executable, "-m", "gpu_runbook.cli", "validate", str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{path}:8:16: confirm: sglang.metrics has no value 'token_usag' (did you mean 'token_usage'" in proc.stderr
    assert "Traceback" not in proc.stderr
    path.write_text(path.read_text(encoding="utf-8").replace("token_usag.", "token_usage."), encoding="utf-8")
    fixed = subprocess.run([sys.executable, "-m", "gpu_runbook.cli", "validate", str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
