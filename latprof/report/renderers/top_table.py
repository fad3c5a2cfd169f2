"""`latprof top`'s display: a `TopSnapshot` as a header line, the layer table and the process table (rich renderables)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from latprof.attach.top import TopSnapshot



def _percent(share: float) -> str:
    return f"{share:.0%}"


def _elapsed(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _Header:
    """The header line: the numbers, then how to quit on the same line when it fits, else under them."""

    def __init__(self, stats: Text, hint: Text) -> None:
        self.stats = stats
        self.hint = hint

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.hint:
            yield self.stats
        elif self.stats.cell_len + 3 + self.hint.cell_len <= options.max_width:
            yield Text.assemble(self.stats, "   ", self.hint)
        else:
            yield self.stats
            yield self.hint


def render(view: TopSnapshot, *, pid: int, name: str, elapsed_s: float, quits: str = "q or Ctrl-C quits",
           status: str = "") -> RenderableType:  # fmt: skip
    """The display of one refresh: a header line, the layer table, the process table, a status line."""
    stats = Text.assemble(
        (f"PID {pid}", "bold"), f" ({name})" if name else "", f"  processes {len(view.processes)}",
        f"  elapsed {_elapsed(elapsed_s)}  samples {view.samples:,}",
        f"  idle {_percent(view.idle_share_now)}" if view.idle_share_now is not None else "",
    )  # fmt: skip
    header = _Header(stats, Text(quits, style="dim"))
    # the table takes the terminal's width, and what gets what the other columns leave (cut to fit)
    layers = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=True)
    layers.add_column("layer", style="bold", no_wrap=True)
    layers.add_column("now", justify="right", no_wrap=True)
    layers.add_column("total", justify="right", no_wrap=True)
    layers.add_column("threads", justify="right", no_wrap=True)
    layers.add_column("what (most samples)", overflow="ellipsis", no_wrap=True, ratio=1)
    for row in view.layers:
        layers.add_row(row.layer, _percent(row.now_share) if row.now_samples else "-", _percent(row.total_share),
                       str(row.threads_now) if row.threads_now else "-", row.what)  # fmt: skip
    if not view.layers:
        layers.add_row("-", "-", "-", "-", "no busy sample yet" if view.windows else "waiting for the first window (about a second)")
    processes = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False)
    processes.add_column("pid", justify="right", no_wrap=True)
    processes.add_column("threads", justify="right", no_wrap=True)
    processes.add_column("busy", justify="right", no_wrap=True)
    processes.add_column("idle", justify="right", no_wrap=True)
    processes.add_column("top layer now", no_wrap=True)
    for p in view.processes:
        processes.add_row(str(p.pid), str(p.threads), _percent(p.busy_share), _percent(p.idle_share), p.top_layer or "-")
    parts: list[RenderableType] = [header, layers, processes]
    if status:
        parts.append(Text(status, style="yellow"))
    return Group(*parts)
