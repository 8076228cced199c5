"""The figures issue 15 asks for, counted by the hostile-input, hostile-server and fault tests as they
run and printed in pytest's terminal summary (with or without -s): what was tried, what ended as it
should (a positioned error; a written report with the right marks), hangs, crashes, leaked secrets."""

from __future__ import annotations

from collections import defaultdict


class Figures:
    def __init__(self) -> None:
        self.tried_: dict[str, set[str]] = defaultdict(set)
        self.handled: dict[str, set[str]] = defaultdict(set)
        self.hangs: set[str] = set()
        self.crashes: set[str] = set()
        self.leaks: set[str] = set()
        self.secret_runs = 0

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

    def lines(self) -> list[str]:
        labels = {
            "bad inputs": "bad inputs tried / refused with a positioned (or named-limit) error",
            "hostile servers": "hostile servers tried / ending in a written report with the right marks",
            "faults": "faults injected / ending in a written report (or a clear nothing-written error)",
            "fuzzed documents": "fuzzed documents (hypothesis) tried / loaded or refused at FILE:LINE:COL",
        }
        out = [f"{labels.get(kind, kind)}: {len(self.tried_[kind])} / {len(self.handled[kind])}" for kind in sorted(self.tried_)]
        out.append(f"hangs: {len(self.hangs)}" + (f" ({', '.join(sorted(self.hangs))})" if self.hangs else ""))
        out.append(f"crashes: {len(self.crashes)}" + (f" ({', '.join(sorted(self.crashes))})" if self.crashes else ""))
        out.append(f"secrets leaked: {len(self.leaks)} (outputs checked in {self.secret_runs} runs given a key by --api-key or RUNBOOK_API_KEY)")
        return out


FIGURES = Figures()
