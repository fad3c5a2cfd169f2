"""Write a capture as OTLP/JSON traces, one `ExportTraceServiceRequest` a line, as the OTLP file exporter does.

Each request is a trace: its root a SERVER span named for the route, each segment a child span
(CLIENT for the calls out - `db.query`, `provider`, `model`, `tool` -, INTERNAL for the waits)
with the capture's own attributes, which already use OpenTelemetry's semantic-convention names
(`db.system.name`, `db.query.summary`, `gen_ai.*`, `server.address`); the root gets
`http.request.method`, `http.route` and `http.response.status_code` from the request's route
and status. Every span carries `latprof.layer` (`tracemap.LATPROF_LAYER`): the segment's layer,
or `none` for the root and for layer-less segments, and the root its measured CPU time
(`tracemap.REQUEST_CPU_NS`), so that `latprof analyze` of the export attributes each span's
time as the capture did. Resource attributes: `service.name` (the capture's, else OpenTelemetry's
`unknown_service`), `host.name` and `process.pid` where the capture holds them.

Ids are lowercase hex, as OTLP/JSON wants them: a request id that already is a trace id (a
capture read from traces) is kept, any other id is hashed (BLAKE2b) into one, so the same
capture always exports the same ids. Times are decimal strings of Unix nanoseconds. Gauges
are not trace data and are not written (docs/export.md says what that changes).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Iterator, Mapping, Sequence, TextIO

import orjson

from latprof import __version__
from latprof.capture.reader import CaptureData
from latprof.collectors.traces.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, STATUS_ERROR
from latprof.collectors.traces.tracemap import LATPROF_LAYER, NO_LAYER, REQUEST_CPU_NS
from latprof.events import Request, Segment
from latprof.export import EXPORT, process_about, requests_with_segments
from latprof.layers import DB_QUERY, MODEL, PROVIDER, TOOL
from latprof.semconv import HTTP_REQUEST_METHOD, HTTP_ROUTE, HTTP_STATUS_CODE, SPAN_STATUS_ERROR

#: The instrumentation scope of every exported span.
SCOPE_NAME = "latprof"
#: Spans per line at most (whole traces, so a trace may make a line longer): the OpenTelemetry
#: SDK's `BatchSpanProcessor` exports batches of 512 spans by default.
BATCH_SPANS = 512
#: OpenTelemetry's `service.name` when the capture names no service (the resource semantic conventions).
UNKNOWN_SERVICE = "unknown_service"
#: Layers whose segments are calls out of the process: CLIENT spans. The waits are INTERNAL.
CLIENT_LAYERS = frozenset({DB_QUERY, PROVIDER, MODEL, TOOL})

_HEX = frozenset("0123456789abcdef")


def _is_hex(text: str, digits: int) -> bool:
    return len(text) == digits and set(text) <= _HEX and text != "0" * digits


def _hashed(text: str, digits: int) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=digits // 2).hexdigest()


def trace_id_of(request_id: str) -> str:
    """The trace id (32 lowercase hex digits) of a request: its id when that is one already (or
    `TRACE:SPAN`, the id of one of several roots of a trace read from traces), else a hash of it."""
    trace = request_id.partition(":")[0]
    return trace if _is_hex(trace, 32) else _hashed(request_id, 32)


def root_span_id_of(request_id: str) -> str:
    """The span id (16 lowercase hex digits) of a request's root span."""
    trace, _, span = request_id.partition(":")
    return span if _is_hex(span, 16) and _is_hex(trace, 32) else _hashed(f"request\0{request_id}", 16)


def span_id_of(request_id: str, segment_id: str) -> str:
    """The span id of a segment: its id when that is a span id already (a capture read from
    traces), else a hash of the request and segment ids."""
    return segment_id if _is_hex(segment_id, 16) else _hashed(f"segment\0{request_id}\0{segment_id}", 16)


def any_value(value: Any) -> dict[str, Any] | None:
    """The OTLP/JSON `AnyValue` of an attribute value; None for a null (the attribute is left out).

    int64s are decimal strings and non-finite doubles `"NaN"`/`"Infinity"`/`"-Infinity"`, as the
    protobuf JSON mapping writes them; bools are checked before ints (a bool is an int in Python).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        return {"doubleValue": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": attributes(value)}}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [v for v in (any_value(item) for item in value) if v is not None]}}
    return {"stringValue": str(value)}


def attributes(mapping: Mapping[str, Any]) -> list[dict[str, Any]]:
    """OTLP `KeyValue`s of an attribute mapping, in its order, nulls left out."""
    out = []
    for key, value in mapping.items():
        encoded = any_value(value)
        if encoded is not None:
            out.append({"key": str(key), "value": encoded})
    return out


def _route_attrs(route: str) -> dict[str, Any]:
    """`http.request.method` and `http.route` of a route template `METHOD /path`; none for another name."""
    method, _, path = route.partition(" ")
    if method.isalpha() and method.isupper() and path.startswith("/"):
        return {HTTP_REQUEST_METHOD: method, HTTP_ROUTE: path}
    return {}


def request_span(request: Request) -> dict[str, Any]:
    """The SERVER root span of a request."""
    attrs: dict[str, Any] = {**request.attrs, **_route_attrs(request.route)}
    if request.status_code is not None:
        attrs[HTTP_STATUS_CODE] = request.status_code
    if request.cpu_ns is not None:
        attrs[REQUEST_CPU_NS] = request.cpu_ns
    attrs[LATPROF_LAYER] = NO_LAYER
    span: dict[str, Any] = {
        "traceId": trace_id_of(request.request_id),
        "spanId": root_span_id_of(request.request_id),
        "name": request.route,
        "kind": KIND_SERVER,
        "startTimeUnixNano": str(request.start_ns),
        "endTimeUnixNano": str(request.end_ns),
        "attributes": attributes(attrs),
    }
    if request.status_code is not None and request.status_code >= 500:  # a server span's error, by HTTP's semantic conventions
        span["status"] = {"code": STATUS_ERROR}
    return span


def segment_span(segment: Segment, trace_id: str, parent_span_id: str) -> dict[str, Any]:
    """The span of one segment, below `parent_span_id`."""
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id_of(segment.request_id, segment.segment_id),
        "parentSpanId": parent_span_id,
        "name": segment.name,
        "kind": KIND_CLIENT if segment.layer in CLIENT_LAYERS else KIND_INTERNAL,
        "startTimeUnixNano": str(segment.start_ns),
        "endTimeUnixNano": str(segment.end_ns),
        "attributes": attributes({**segment.attrs, LATPROF_LAYER: segment.layer or NO_LAYER}),
    }
    if segment.attrs.get(SPAN_STATUS_ERROR) is True:
        span["status"] = {"code": STATUS_ERROR}
    return span


def trace_spans(request: Request, segments: Sequence[Segment]) -> list[dict[str, Any]]:
    """The spans of one request: its root, then its segments; a segment whose parent is not among
    them hangs off the root."""
    trace_id = trace_id_of(request.request_id)
    root_id = root_span_id_of(request.request_id)
    known = {s.segment_id for s in segments}
    spans = [request_span(request)]
    for segment in segments:
        parent = segment.parent_id
        parent_span_id = span_id_of(segment.request_id, parent) if parent is not None and parent in known else root_id
        spans.append(segment_span(segment, trace_id, parent_span_id))
    return spans


def resource(data: CaptureData, pid: int) -> dict[str, Any]:
    """The OTLP resource of process (or service instance) `pid`."""
    about = process_about(data, pid)
    attrs = {"service.name": about.get("service.name") or UNKNOWN_SERVICE}
    attrs.update({k: about[k] for k in ("host.name", "process.pid") if k in about})
    return {"attributes": attributes(attrs)}


def export_requests(data: CaptureData) -> Iterator[dict[str, Any]]:
    """The `ExportTraceServiceRequest` documents of the capture: whole traces, about `BATCH_SPANS`
    spans each, a `resourceSpans` element per process in it."""
    by_pid: dict[int, list[dict[str, Any]]] = {}
    count = 0
    for request, segments in requests_with_segments(data):
        spans = trace_spans(request, segments)
        by_pid.setdefault(request.pid, []).extend(spans)
        count += len(spans)
        if count >= BATCH_SPANS:
            yield _document(data, by_pid)
            by_pid, count = {}, 0
    if by_pid:
        yield _document(data, by_pid)


def _document(data: CaptureData, by_pid: Mapping[int, list[dict[str, Any]]]) -> dict[str, Any]:
    scope = {"name": SCOPE_NAME, "version": __version__}
    return {
        "resourceSpans": [
            {"resource": resource(data, pid), "scopeSpans": [{"scope": scope, "spans": spans}]} for pid, spans in by_pid.items()
        ]
    }


@EXPORT.register("otlp")
def write_otlp(data: CaptureData, out: TextIO) -> None:
    """Write the capture to `out` as OTLP/JSON lines (`export_requests`)."""
    for document in export_requests(data):
        out.write(orjson.dumps(document).decode())
        out.write("\n")
