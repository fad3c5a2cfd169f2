"""The capture's wire format: one JSON object per line, a header line per writing process.

    {"type": "header", "schema": "latprof.capture/1", "pid": 4242, "source": "run", ...}
    {"type": "request", "request_id": "r1", "route": "POST /chat", "start_ns": ..., ...}
    {"type": "segment", "request_id": "r1", "segment_id": "s1", "layer": "db.pool", ...}
    {"type": "gauge", "name": "db.pool.in_use", "value": 9, "ts_ns": ..., ...}
    {"type": "stack", "ts_ns": ..., "tid": ..., "frames": [["fn", "file.py", 12], ...], ...}
    {"type": "quality", "kind": "dropped", "occurrences": 12, ...}

Keys are the event fields; `attrs` is left out when empty. Several processes may append to
one file: each writes its own header before its first events, and every event carries its
`pid`, so lines from different writers may interleave at line granularity.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from typing import Any, Callable

from latprof.events import NO_ATTRS, Event, Frame, Gauge, QualityRecord, Request, Segment, StackSample
from latprof.layers import SEGMENT_LAYERS

SCHEMA = "latprof.capture/1"
SCHEMA_PREFIX = "latprof.capture/"

#: Header field: true when the writer ends its process's part with a `closed` quality record
#: (`semconv.NOTE_CLOSED`) on a clean close; the reader warns when that record is missing.
#: Headers of older writers lack it: nothing is expected of them.
HEADER_CLOSES = "closes"

#: `source` values a header may carry (report-v1 `source.kind`).
SOURCE_KINDS = ("run", "attach", "otlp", "jaeger", "zipkin", "receive")
#: Source kinds read from traces: what stock instrumentation leaves out is inferred (latprof.analysis.inference).
TRACE_SOURCES = frozenset({"otlp", "jaeger", "zipkin", "receive"})


def make_header(source: str, **extra: Any) -> dict[str, Any]:
    """Return the header line of the calling process: schema, pid, clocks, host, source kind."""
    from latprof import __version__

    header: dict[str, Any] = {
        "type": "header",
        "schema": SCHEMA,
        "source": source,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "latprof": __version__,
        # Both clocks at one instant, so a reader can note skew between processes.
        "wall_ns": time.time_ns(),
        "monotonic_ns": time.monotonic_ns(),
    }
    header.update(extra)
    return header


def encode(event: Event) -> dict[str, Any]:
    """Return the wire form of one event (a dict ready for orjson.dumps)."""
    encoder = _ENCODERS.get(type(event))
    if encoder is None:
        raise TypeError(f"not a latprof event: {type(event).__name__}")
    wire = encoder(event)
    attrs = getattr(event, "attrs", NO_ATTRS)
    if attrs:
        wire["attrs"] = dict(attrs)
    return wire


def _encode_request(e: Request) -> dict[str, Any]:
    return {
        "type": "request",
        "request_id": e.request_id,
        "route": e.route,
        "start_ns": e.start_ns,
        "end_ns": e.end_ns,
        "pid": e.pid,
        "cpu_ns": e.cpu_ns,
        "status_code": e.status_code,
    }


def _encode_segment(e: Segment) -> dict[str, Any]:
    return {
        "type": "segment",
        "request_id": e.request_id,
        "segment_id": e.segment_id,
        "parent_id": e.parent_id,
        "name": e.name,
        "layer": e.layer,
        "start_ns": e.start_ns,
        "end_ns": e.end_ns,
        "pid": e.pid,
    }


def _encode_gauge(e: Gauge) -> dict[str, Any]:
    return {"type": "gauge", "name": e.name, "value": e.value, "ts_ns": e.ts_ns, "pid": e.pid}


def _encode_stack(e: StackSample) -> dict[str, Any]:
    return {
        "type": "stack",
        "ts_ns": e.ts_ns,
        "pid": e.pid,
        "tid": e.tid,
        "thread_name": e.thread_name,
        "frames": [[f.function, f.filename, f.line] for f in e.frames],
        "active": e.active,
        "wchan": e.wchan,
        "weight": e.weight,
    }


def _encode_quality(e: QualityRecord) -> dict[str, Any]:
    return {
        "type": "quality",
        "kind": e.kind,
        "ts_ns": e.ts_ns,
        "pid": e.pid,
        "message": e.message,
        "occurrences": e.occurrences,
    }


_ENCODERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    Request: _encode_request,
    Segment: _encode_segment,
    Gauge: _encode_gauge,
    StackSample: _encode_stack,
    QualityRecord: _encode_quality,
}


# The one decoder of capture lines: the reader and the tests both use it. Decoders take the
# parsed line and return the event; KeyError/TypeError/ValueError mean a malformed line
# (a segment of an unknown layer is one) and are turned into one clear InputError by the reader.

# Canonical layer strings, so a million segments share a dozen string objects.
LAYER_INTERN: dict[Any, str | None] = {layer: layer for layer in SEGMENT_LAYERS}
LAYER_INTERN[None] = None
#: What `LAYER_INTERN.get(value, BAD_LAYER)` gives for a value that is no layer.
BAD_LAYER = "?"
#: Distinct segment attribute texts a segment decoder remembers to share their dicts (bounds memory).
ATTRS_CACHE_MAX = 200_000


def _attrs(d: dict[str, Any]) -> Any:
    attrs = d.get("attrs")
    if attrs is None:
        return NO_ATTRS
    if type(attrs) is not dict:
        raise TypeError("attrs must be a JSON object")
    return attrs


def _decode_request(d: dict[str, Any]) -> Request:
    cpu = d.get("cpu_ns")
    status = d.get("status_code")
    request_id = d["request_id"]
    if type(request_id) is not str:
        raise TypeError("request_id must be a string")
    return Request(
        request_id,
        str(d["route"]),
        int(d["start_ns"]),
        int(d["end_ns"]),
        int(d["pid"]),
        None if cpu is None else int(cpu),
        None if status is None else int(status),
        _attrs(d),
    )


def _attrs_sharer() -> Callable[[dict[str, Any], "bytes | None"], dict[str, Any]]:
    """`share(attrs, line)`: the dict kept for `line`'s attribute text, or `attrs` (the line's own,
    parsed), kept for the lines to come (up to `ATTRS_CACHE_MAX` distinct texts, for one file).

    Keyed on the line from the top-level "attrs" key on: the fields before it are scalars or
    strings, in which an unescaped quote cannot occur, and the writer writes the attributes last.
    """
    cache: dict[bytes, dict[str, Any]] = {}

    def share(attrs: dict[str, Any], line: bytes | None) -> dict[str, Any]:
        at = -1 if line is None else line.find(b'"attrs":')
        if at < 0:
            return attrs
        key = line[at:]  # type: ignore[index]  # `line` is not None when `at` is found
        cached = cache.get(key)
        if cached is not None:
            return cached
        if len(cache) < ATTRS_CACHE_MAX:
            cache[key] = attrs
        return attrs

    return share


RequestDecoder = Callable[[dict[str, Any], "bytes | None"], Request]


def request_decoder() -> RequestDecoder:
    """A decoder of request lines for one capture file: `decode(d, line=None)`, as `_decode_request`.

    What repeats across a million requests is kept once: routes, pids and - given the raw `line` -
    the attribute dict of each distinct attribute text (up to `ATTRS_CACHE_MAX`; most requests of
    a route carry the same few attributes), as `segment_decoder` does for segments.
    """
    shared: dict[Any, Any] = {}
    share_attrs = _attrs_sharer()
    new_tuple = tuple.__new__

    def decode(d: dict[str, Any], line: bytes | None = None) -> Request:
        cpu = d.get("cpu_ns")
        status = d.get("status_code")
        request_id = d["request_id"]
        if type(request_id) is not str:
            raise TypeError("request_id must be a string")
        attrs = d.get("attrs")
        if attrs is None:
            attrs = NO_ATTRS
        elif type(attrs) is not dict:
            raise TypeError("attrs must be a JSON object")
        else:
            attrs = share_attrs(attrs, line)
        route = str(d["route"])
        pid = int(d["pid"])
        return new_tuple(
            Request,
            (
                request_id,
                shared.setdefault(route, route),
                int(d["start_ns"]),
                int(d["end_ns"]),
                shared.setdefault(pid, pid),
                None if cpu is None else int(cpu),
                None if status is None else int(status),
                attrs,
            ),
        )

    return decode


SegmentDecoder = Callable[[dict[str, Any], "bytes | None", Any], Segment]


def segment_decoder() -> SegmentDecoder:
    """A decoder of segment lines for one capture file: `decode(d, line=None, request_id=None)`.

    The layer must be one of report-v1's (or null). What repeats across a million segments is
    kept once: names and pids, and - given the raw `line` - the attribute dict of each distinct
    attribute text (up to `ATTRS_CACHE_MAX`). `request_id`, when given, is used instead of the
    line's (equal) one, so one string object serves every segment of a request.
    """
    layers = LAYER_INTERN
    shared: dict[Any, Any] = {}
    share_attrs = _attrs_sharer()
    no_attrs = NO_ATTRS
    # Build the named tuple without its Python-level __new__ (same object, a call cheaper).
    new_tuple = tuple.__new__

    def decode(d: dict[str, Any], line: bytes | None = None, request_id: Any = None) -> Segment:
        layer = layers.get(d.get("layer"), BAD_LAYER)
        if layer is BAD_LAYER:
            raise ValueError(f"unknown layer {d.get('layer')!r}")
        attrs = d.get("attrs")
        if attrs is not None:
            if type(attrs) is not dict:
                raise TypeError("attrs must be a JSON object")
            attrs = share_attrs(attrs, line)  # most segments repeat another's (pool, statement, model)
        else:
            attrs = no_attrs
        name = d["name"]
        pid = int(d["pid"])
        segment_id = d["segment_id"]
        parent_id = d.get("parent_id")
        if type(segment_id) is not str or type(name) is not str or (parent_id is not None and type(parent_id) is not str):
            raise TypeError("a segment's name, segment_id and parent_id must be strings")
        if request_id is None:
            request_id = d["request_id"]
            if type(request_id) is not str:
                raise TypeError("request_id must be a string")
        return new_tuple(
            Segment,
            (
                request_id,
                segment_id,
                parent_id,
                shared.setdefault(name, name),
                layer,
                int(d["start_ns"]),
                int(d["end_ns"]),
                shared.setdefault(pid, pid),
                attrs,
            ),
        )

    return decode


def _decode_segment(d: dict[str, Any]) -> Segment:
    return segment_decoder()(d, None, None)


def _decode_gauge(d: dict[str, Any]) -> Gauge:
    return Gauge(d["name"], float(d["value"]), int(d["ts_ns"]), int(d["pid"]), _attrs(d))


def _decode_stack(d: dict[str, Any]) -> StackSample:
    frames = tuple(Frame(str(f[0]), str(f[1]), int(f[2])) for f in d["frames"])
    return StackSample(
        int(d["ts_ns"]),
        int(d["pid"]),
        int(d["tid"]),
        str(d.get("thread_name", "")),
        frames,
        bool(d.get("active", True)),
        d.get("wchan"),
        int(d.get("weight", 1)),
    )


def _decode_quality(d: dict[str, Any]) -> QualityRecord:
    return QualityRecord(
        d["kind"], int(d["ts_ns"]), int(d["pid"]), str(d.get("message", "")), int(d.get("occurrences", 1)), _attrs(d)
    )


DECODERS: dict[str, Callable[[dict[str, Any]], Event]] = {
    "request": _decode_request,
    "segment": _decode_segment,
    "gauge": _decode_gauge,
    "stack": _decode_stack,
    "quality": _decode_quality,
}


def decode(d: dict[str, Any]) -> Event:
    """Return the event of one parsed wire line (not a header)."""
    return DECODERS[d["type"]](d)
