"""Record what hooks emit in this process, in memory (the real CaptureWriter is tested on its own)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from latprof.collectors.hooks import runtime


class ListWriter:
    """Stands in for the capture writer: keeps every emitted event in a list."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, event: Any) -> None:
        self.events.append(event)


@contextlib.contextmanager
def recording() -> Iterator[list[Any]]:
    """Start the hooks' runtime on a ListWriter; yield its event list; stop it afterwards."""
    writer = ListWriter()
    runtime.start(writer)
    try:
        yield writer.events
    finally:
        runtime.stop()
