"""Property-based fuzzing of the loader: whatever the text, `load` returns a runbook or raises LoadError
whose every line is `FILE:...: message`; nothing else escapes (no RecursionError, ValueError, MemoryError).

Deterministic and small for CI: derandomized, a fixed number of examples, no per-example deadline.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_runbook.loader import LoadError, load
from gpu_runbook.registry import Registry
from hostile_figures import FIGURES

TESTS = Path(__file__).parent
REGISTRY = Registry.discover([TESTS / "probe_files"])
SEEDS = [
    (TESTS.parent / "runbooks" / "host-sanity.yaml").read_text(),
    (TESTS.parent / "runbooks" / "throughput-plateau.yaml").read_text(),
    (TESTS / "data" / "fixed-example.yaml").read_text(),
]
FUZZ = settings(derandomize=True, deadline=None, max_examples=300, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip

# What a careless edit or a hostile author puts into YAML.
TOKENS = ["&a ", "*a", "!!int ", "!!float ", "!!bool ", "!!timestamp ", "!!binary ", "!!python/object:os.system ",
          "<<: *a", "[", "]", "{", "}", ": ", "- ", "? ", "\t", "\n", "  ", "'", '"', "|", ">", "#", "%YAML 1.1\n", "---\n",
          "...\n", "2001-13-01", ".inf", ".nan", "9" * 30, "${x}", "\x00", "\ufeff", "é", "\r\n"]  # fmt: skip


def _check(text: str, tmp_path: Path, case: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    FIGURES.tried("fuzzed documents", case)
    try:
        load(path, REGISTRY)
    except LoadError as exc:
        assert exc.errors
        for err in exc.errors:
            line = str(err)
            assert line.startswith(f"{path}:"), line
            assert err.message.strip(), line
    except Exception as exc:  # the property: nothing but LoadError escapes
        FIGURES.crash(repr(case[:60]))
        raise AssertionError(f"{type(exc).__name__}: {exc} on {text[:200]!r}") from exc
    FIGURES.passed("fuzzed documents", case)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A valid runbook with a few edits: spans deleted, tokens inserted, lines repeated or swapped."""
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["insert", "delete", "repeat", "swap"]))
        at = draw(st.integers(0, len(text)))
        if kind == "insert":
            text = text[:at] + draw(st.one_of(st.sampled_from(TOKENS), st.text(max_size=6))) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        else:
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            if kind == "repeat":
                lines.insert(i, lines[j] * draw(st.integers(1, 3)))
            else:
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
    return text


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
VALUES = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=30)


@FUZZ
@given(text=mutated())
def test_mutated_runbooks_load_or_fail_with_a_position(text, tmp_path):
    _check(text, tmp_path, "mutation " + text)


@FUZZ
@given(data=st.dictionaries(st.sampled_from(["name", "title", "params", "load", "hypotheses", "tests", "probe_files", "x"]), VALUES, max_size=6))
def test_generated_documents_load_or_fail_with_a_position(data, tmp_path):
    _check(yaml.safe_dump(data, allow_unicode=True), tmp_path, "document " + repr(data))


@settings(FUZZ, max_examples=200)
@given(text=st.lists(st.sampled_from(TOKENS + list("abc:-_ 0123")), max_size=60).map("".join))
def test_token_soup_loads_or_fails_with_a_position(text, tmp_path):
    _check(text, tmp_path, "soup " + text)
