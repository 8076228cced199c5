"""`runbook fleet --tui`: the ranked host list; selecting a host shows that host's hypothesis tree.

Host names, reasons and headlines come from the metrics: they are shown as plain `Text`, never markup.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from ..fleet import FleetHost, FleetResults
from ..marks import mark

VERDICT_STYLE = {"confirmed": "bold red", "refuted": "green", "inconclusive": "yellow", "skipped": "dim", "error": "magenta"}


def host_line(h: FleetHost) -> Text:
    status = ", ".join(h.confirmed[:2]) or ("no warning" if h.join == "joined" and h.has_results else h.join)
    return Text.assemble((f"{h.rank:>3} ", "dim"), (h.host, "bold"), "  ", (status, "red" if h.worst_severity in ("critical", "warning") else ""))


def host_tree(h: FleetHost) -> Text:
    out = Text()
    out.append(f"{h.host}\n", style="bold")
    out.append(f"{h.join}{': ' + h.join_detail if h.join_detail else ''}\n", style="dim")
    if h.command:
        out.append(f"next: {h.command}\n", style="cyan")
    out.append("\n")
    results = h.judged()
    if results is None:
        out.append("no metrics to decide on\n")
        return out
    for x in results.hypotheses:
        out.append("  " * x.depth)
        out.append(f"{mark(x.verdict.value)} ", style=VERDICT_STYLE.get(x.verdict.value, ""))
        out.append(x.id, style="bold" if x.verdict.value == "confirmed" else "")
        out.append(f"  {' '.join((x.headline or x.reason).split())[:160]}\n", style="dim")
    return out


class FleetApp(App[None]):
    TITLE = "runbook fleet"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [Binding("q", "quit", "quit")]
    CSS = "#hosts { width: 40%; } #tree { width: 60%; }"

    def __init__(self, results: FleetResults) -> None:
        super().__init__()
        self.results = results

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield OptionList(*(Option(host_line(h), id=f"h{i}") for i, h in enumerate(self.results.hosts)), id="hosts")
            with VerticalScroll(id="tree"):
                yield Static(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        hosts = self.query_one("#hosts", OptionList)
        hosts.focus()
        if self.results.hosts:
            hosts.highlighted = 0
            self.show(0)

    def show(self, index: int) -> None:
        self.query_one("#detail", Static).update(host_tree(self.results.hosts[index]))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_index is not None:
            self.show(event.option_index)
