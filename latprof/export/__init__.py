"""Export a capture to the trace viewers people use: Chrome trace-event JSON (Perfetto) and OTLP/JSON.

An exporter writes what `read_captures` read - requests, their layered segments, gauges - and
nothing else: no event is invented, no attribute the capture does not hold is added (names
the target format requires, such as a span's kind or a track's name, are derived from the
capture's own fields). Each format registers its writer on `EXPORT`, as renderers do:

    @EXPORT.register("perfetto")
    def write_perfetto(data: CaptureData, out: TextIO) -> None: ...

    EXPORT.names()                           # ["otlp", "perfetto"]: `latprof export --format`'s choices
    EXPORT.render("otlp", read_input(paths), out)

docs/export.md describes both formats and what `latprof analyze` reads back from the OTLP one.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator

from latprof.capture.reader import CaptureData, read_captures
from latprof.events import Request, Segment
from latprof.report.renderers import Formats


def _load_exporters() -> None:
    from latprof.export import otlp, perfetto  # noqa: F401  (registration)


#: The export formats by name (`latprof export --format`).
EXPORT: Formats[CaptureData] = Formats("export", _load_exporters)


def read_input(paths: Iterable[str | os.PathLike[str]]) -> CaptureData:
    """Read what `latprof analyze` reads (captures, trace files, directories of them) for an export.

    Raises `InputError` (one line) for a missing, empty, malformed or foreign file, as `analyze` does.
    """
    return read_captures(paths)


def requests_with_segments(data: CaptureData) -> Iterator[tuple[Request, list[Segment]]]:
    """Each request once (the first root of a request id, as the timeline keeps it), by arrival,
    with its segments in capture order. Segments of a request id with no root are not exported:
    they belong to no track and no trace."""
    seen: set[str] = set()
    for request in sorted(data.requests, key=lambda r: (r.start_ns, r.request_id)):
        if request.request_id in seen:
            continue
        seen.add(request.request_id)
        yield request, data.segments_by_request.get(request.request_id, [])


def process_about(data: CaptureData, pid: int) -> dict[str, Any]:
    """What the capture says about the process (or, read from traces, the service instance) `pid`:
    `service.name`, `host.name` and `process.pid` where the headers hold them.

    A capture header holds its writer's `pid` and `host` (and `service.name` when a writer
    recorded one); a trace file's header holds its instances by the number the events carry
    as `pid`, each with the resource attributes the spans had.
    """
    about: dict[str, Any] = {}
    for header in data.headers:
        instances = header.get("instances")
        if isinstance(instances, dict):
            instance = instances.get(str(pid))
            if isinstance(instance, dict):
                about.update({k: v for k, v in instance.items() if k in ("service.name", "host.name", "process.pid")})
        elif header.get("pid") == pid:
            if header.get("service.name"):
                about["service.name"] = str(header["service.name"])
            if header.get("host"):
                about["host.name"] = str(header["host"])
            about["process.pid"] = pid
    return about
