"""The figures issue 15 asks for, counted by the hostile-input, hostile-server and fault tests as they
run and printed in pytest's terminal summary (with or without -s): what was tried, what ended as it
should (a positioned error; a written report with the right marks), hangs, crashes, leaked secrets."""

from __future__ import annotations

from collections import defaultdict


PEAK_MB_LIMIT = 500


class Figures:
    def __init__(self) -> None:
        self.tried_: dict[str, set[str]] = defaultdict(set)
        self.handled: dict[str, set[str]] = defaultdict(set)
        self.hangs: set[str] = set()
        self.crashes: set[str] = set()
        self.leaks: set[str] = set()
        self.secret_runs = 0
        self.injections: set[str] = set()  # markup, escapes or a live link from data reached an output
        self.outside: set[str] = set()  # a file written outside the paths given (or the default's directory)
        self.peak_mb: dict[str, float] = {}  # peak RSS of a run on a hostile input, in MB

    def tried(self, kind: str, case: str) -> None:
        self.tried_[kind].add(case)

    def passed(self, kind: str, case: str) -> None:
        self.handled[kind].add(case)

    def hang(self, case: str) -> None:
        self.hangs.add(case)

    def crash(self, case: str) -> None:
        self.crashes.add(case)

    def leak(self, case: str) -> None:
        self.leaks.add(case)

    def secret_checks(self, n: int) -> None:
        self.secret_runs += n

    def injection(self, case: str) -> None:
        self.injections.add(case)

    def wrote_outside(self, case: str) -> None:
        self.outside.add(case)

    def memory(self, case: str, mb: float) -> None:
        self.peak_mb[case] = max(mb, self.peak_mb.get(case, 0.0))

    def lines(self) -> list[str]:
        labels = {
            "bad inputs": "bad inputs tried / refused with a positioned (or named-limit) error",
            "hostile servers": "hostile servers tried / ending in a written report with the right marks",
            "faults": "faults injected / ending in a written report (or a clear nothing-written error)",
            "fuzzed documents": "fuzzed documents (hypothesis) tried / loaded or refused at FILE:LINE:COL",
            "crafted traces": "crafted traces tried / refused or read within their limits, the limit named",
            "crafted results files": "crafted results files tried / rendered inert, re-judged within budget, or refused by name",
        }
        out = [f"{labels.get(kind, kind)}: {len(self.tried_[kind])} / {len(self.handled[kind])}" for kind in sorted(self.tried_)]
        out.append(f"hangs (runs past their deadline): {len(self.hangs)}" + (f" ({', '.join(sorted(self.hangs))})" if self.hangs else ""))
        out.append(f"crashes (tracebacks): {len(self.crashes)}" + (f" ({', '.join(sorted(self.crashes))})" if self.crashes else ""))
        out.append(f"secrets leaked: {len(self.leaks)} (outputs checked in {self.secret_runs} runs given a key by --api-key or RUNBOOK_API_KEY)")
        out.append(f"injections (markup, escapes, live links from data in an output): {len(self.injections)}" + (f" ({', '.join(sorted(self.injections))})" if self.injections else ""))
        out.append(f"files written outside the given paths: {len(self.outside)}" + (f" ({', '.join(sorted(self.outside))})" if self.outside else ""))
        if self.peak_mb:
            worst = max(self.peak_mb, key=self.peak_mb.get)  # type: ignore[arg-type]
            over = sorted(c for c, mb in self.peak_mb.items() if mb > PEAK_MB_LIMIT)
            out.append(f"peak memory on hostile inputs: max {self.peak_mb[worst]:.0f} MB ({worst}) over {len(self.peak_mb)} runs; "
                       f"over {PEAK_MB_LIMIT} MB: {len(over)}" + (f" ({', '.join(over)})" if over else ""))
        return out


FIGURES = Figures()
