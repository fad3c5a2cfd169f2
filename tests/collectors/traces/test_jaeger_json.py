"""The Jaeger JSON trace reader: documents as the Jaeger query API writes them, spans from the SDK through
the Collector's OpenTelemetry-to-Jaeger mapping, and every kind of bad input."""

from __future__ import annotations

import base64
import gzip
import json
import random
from pathlib import Path
from typing import Any

import orjson
from fuzzing import damaged, mutations
import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from latprof.collectors.traces import otlp_json, zipkin_json
from latprof.collectors.traces.jaeger_json import JaegerRead, read_jaeger_json, sniff
from latprof.errors import InputError
from latprof.events import NO_ATTRS
from latprof.collectors.traces.spans import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_INTERNAL,
    KIND_NAMES,
    KIND_PRODUCER,
    KIND_SERVER,
    KIND_UNSPECIFIED,
    STATUS_ERROR,
    STATUS_NAMES,
    STATUS_OK,
    STATUS_UNSET,
    Span,
    SpanEvent,
    SpanLink,
)

ROOT = Path(__file__).resolve().parents[3]
OTLP_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "otlp"  # real traces from outside the project (its README.md)
T0_US = 1_700_000_000_123_456  # startTime, microseconds since the epoch
T0 = T0_US * 1000
MS_US = 1000
TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACE2 = "4bf92f3577b34da6a3ce929d0e0e4736"
ROOT_ID = "b7ad6b7169203331"
CHILD_ID = "00f067aa0ba902b7"
GRANDCHILD_ID = "53995c3f42cd8ad8"


# --- documents built by hand, as jaeger-query writes them (model/json/model.go) -------------


def tag(key: str, value: Any, vtype: str | None = None) -> dict[str, Any]:
    """A KeyValue as `model/converter/json/from_domain.go` writes it: the type named, the value as JSON."""
    if vtype is None:
        vtype = {bool: "bool", int: "int64", float: "float64", str: "string"}[type(value)]
    return {"key": key, "type": vtype, "value": value}


def jspan(span_id: str = ROOT_ID, parent: str | None = None, trace: str = TRACE, name: str = "GET /x",
          start: Any = T0_US, duration: Any = 10 * MS_US, tags: dict[str, Any] | None = None,
          logs: Any = None, process: str = "p1", refs: list[dict[str, Any]] | None = None,
          **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A Span in model.go's field order; `parent` becomes the CHILD_OF reference."""
    references = [] if parent is None else [{"refType": "CHILD_OF", "traceID": trace, "spanID": parent}]
    out: dict[str, Any] = {
        "traceID": trace, "spanID": span_id, "flags": 1, "operationName": name,
        "references": references + (refs or []), "startTime": start, "duration": duration,
        "tags": [tag(k, v) for k, v in (tags or {}).items()], "logs": logs or [], "processID": process, "warnings": None,
    }  # fmt: skip
    out.update(extra)
    return out


def jtrace(*spans: Any, trace: str = TRACE, processes: dict[str, Any] | None = None) -> dict[str, Any]:
    if processes is None:
        processes = {"p1": {"serviceName": "chat-api", "tags": [tag("host.name", "web-1")]}}
    return {"traceID": trace, "spans": list(spans), "processes": processes, "warnings": None}


def response(*traces: Any, errors: Any = None) -> dict[str, Any]:
    """The query API's envelope (`structuredResponse` in `cmd/query/app/http_handler.go`)."""
    return {"data": list(traces), "total": 0, "limit": 0, "offset": 0, "errors": errors}


def three_spans() -> list[dict[str, Any]]:
    """A SERVER root, a db CLIENT child and an INTERNAL grandchild, children inside their parents."""
    return [
        jspan(ROOT_ID, name="POST /chat", duration=10 * MS_US,
              tags={"span.kind": "server", "http.route": "/chat", "http.response.status_code": 200}),
        jspan(CHILD_ID, ROOT_ID, name="SELECT users", start=T0_US + 2 * MS_US, duration=4 * MS_US,
              tags={"span.kind": "client", "db.system.name": "postgresql", "server.port": 5432}),
        jspan(GRANDCHILD_ID, CHILD_ID, name="parse", start=T0_US + 3 * MS_US, duration=MS_US, tags={"span.kind": "internal"}),
    ]  # fmt: skip


def write(path: Path, doc: Any, gz: bool = False, indent: bool = False) -> Path:
    data = json.dumps(doc, indent=2).encode() if indent else orjson.dumps(doc)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def by_id(read: JaegerRead) -> dict[str, Span]:
    return {s.span_id: s for s in read.spans}


# A response of /api/traces/{id} for a service traced with the OpenTelemetry SDK and exported by
# OTLP to Jaeger, written out as jaeger-query does (keys, order and value types of model.go).
QUERY_RESPONSE = """
{
  "data": [
    {
      "traceID": "0af7651916cd43dd8448eb211c80319c",
      "spans": [
        {
          "traceID": "0af7651916cd43dd8448eb211c80319c",
          "spanID": "b7ad6b7169203331",
          "operationName": "GET /v1/chat",
          "references": [],
          "startTime": 1700000000123456,
          "duration": 200000,
          "tags": [
            {"key": "otel.scope.name", "type": "string", "value": "opentelemetry.instrumentation.fastapi"},
            {"key": "otel.scope.version", "type": "string", "value": "0.48b0"},
            {"key": "http.route", "type": "string", "value": "/v1/chat"},
            {"key": "http.request.method", "type": "string", "value": "GET"},
            {"key": "http.response.status_code", "type": "int64", "value": 200},
            {"key": "span.kind", "type": "string", "value": "server"},
            {"key": "otel.status_code", "type": "string", "value": "OK"},
            {"key": "internal.span.format", "type": "string", "value": "otlp"}
          ],
          "logs": [],
          "processID": "p1",
          "warnings": null
        },
        {
          "traceID": "0af7651916cd43dd8448eb211c80319c",
          "spanID": "00f067aa0ba902b7",
          "operationName": "connect",
          "references": [
            {"refType": "CHILD_OF", "traceID": "0af7651916cd43dd8448eb211c80319c", "spanID": "b7ad6b7169203331"}
          ],
          "startTime": 1700000000124456,
          "duration": 2000,
          "tags": [
            {"key": "otel.scope.name", "type": "string", "value": "opentelemetry.instrumentation.sqlalchemy"},
            {"key": "otel.scope.version", "type": "string", "value": "0.48b0"},
            {"key": "db.system.name", "type": "string", "value": "postgresql"},
            {"key": "db.client.connection.pool.name", "type": "string", "value": "main"},
            {"key": "server.port", "type": "int64", "value": 5432},
            {"key": "span.kind", "type": "string", "value": "client"}
          ],
          "logs": [],
          "processID": "p1",
          "warnings": null
        },
        {
          "traceID": "0af7651916cd43dd8448eb211c80319c",
          "spanID": "53995c3f42cd8ad8",
          "flags": 1,
          "operationName": "POST",
          "references": [
            {"refType": "CHILD_OF", "traceID": "0af7651916cd43dd8448eb211c80319c", "spanID": "b7ad6b7169203331"},
            {"refType": "FOLLOWS_FROM", "traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "1111111111111111"}
          ],
          "startTime": 1700000000133456,
          "duration": 150000,
          "tags": [
            {"key": "otel.scope.name", "type": "string", "value": "opentelemetry.instrumentation.httpx"},
            {"key": "http.request.method", "type": "string", "value": "POST"},
            {"key": "url.full", "type": "string", "value": "https://api.openai.com/v1/chat/completions"},
            {"key": "http.response.status_code", "type": "int64", "value": 500},
            {"key": "gen_ai.response.time_to_first_chunk", "type": "float64", "value": 0.25},
            {"key": "http.request.resend_count", "type": "int64", "value": 1},
            {"key": "sampled", "type": "bool", "value": true},
            {"key": "payload", "type": "binary", "value": "AAH/"},
            {"key": "span.kind", "type": "string", "value": "client"},
            {"key": "otel.status_code", "type": "string", "value": "ERROR"},
            {"key": "otel.status_description", "type": "string", "value": "Server Error"},
            {"key": "error", "type": "bool", "value": true}
          ],
          "logs": [
            {
              "timestamp": 1700000000283000,
              "fields": [
                {"key": "event", "type": "string", "value": "exception"},
                {"key": "exception.type", "type": "string", "value": "httpx.HTTPStatusError"},
                {"key": "exception.escaped", "type": "bool", "value": false}
              ]
            }
          ],
          "processID": "p1",
          "warnings": null
        },
        {
          "traceID": "0af7651916cd43dd8448eb211c80319c",
          "spanID": "8f2a0c9d3b4e5f60",
          "operationName": "POST /v1/chat/completions",
          "references": [
            {"refType": "CHILD_OF", "traceID": "0af7651916cd43dd8448eb211c80319c", "spanID": "53995c3f42cd8ad8"}
          ],
          "startTime": 1700000000134000,
          "duration": 140000,
          "tags": [
            {"key": "otel.library.name", "type": "string", "value": "opentelemetry.instrumentation.asgi"},
            {"key": "span.kind", "type": "string", "value": "server"},
            {"key": "http.route", "type": "string", "value": "/v1/chat/completions"}
          ],
          "logs": [
            {"timestamp": 1700000000135000, "fields": [{"key": "message", "type": "string", "value": "queued"}]}
          ],
          "processID": "p2",
          "warnings": ["clock skew adjustment disabled"]
        }
      ],
      "processes": {
        "p1": {
          "serviceName": "chat-api",
          "tags": [
            {"key": "host.name", "type": "string", "value": "web-1"},
            {"key": "process.pid", "type": "int64", "value": 4242},
            {"key": "telemetry.sdk.language", "type": "string", "value": "python"}
          ]
        },
        "p2": {"serviceName": "llm-proxy", "tags": []}
      },
      "warnings": null
    }
  ],
  "total": 0,
  "limit": 0,
  "offset": 0,
  "errors": null
}
"""


def test_query_api_response_as_jaeger_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(QUERY_RESPONSE)
    assert sniff(path.read_bytes())
    read = read_jaeger_json(path)
    assert read.warnings == [] and read.documents == 1
    server, connect, post, proxy = read.spans
    api = {"service.name": "chat-api", "host.name": "web-1", "process.pid": 4242, "telemetry.sdk.language": "python"}
    assert server == Span(
        TRACE, ROOT_ID, None, "GET /v1/chat", KIND_SERVER, 1_700_000_000_123_456_000, 1_700_000_000_323_456_000,
        "chat-api", "opentelemetry.instrumentation.fastapi",
        {"http.route": "/v1/chat", "http.request.method": "GET", "http.response.status_code": 200, "internal.span.format": "otlp"},
        STATUS_OK, (), (), api,
    )  # fmt: skip
    assert connect == Span(
        TRACE, CHILD_ID, ROOT_ID, "connect", KIND_CLIENT, T0 + 1_000_000, T0 + 3_000_000, "chat-api",
        "opentelemetry.instrumentation.sqlalchemy",
        {"db.system.name": "postgresql", "db.client.connection.pool.name": "main", "server.port": 5432},
        STATUS_UNSET, (), (), api,
    )  # fmt: skip
    assert post == Span(
        TRACE, GRANDCHILD_ID, ROOT_ID, "POST", KIND_CLIENT, T0 + 10_000_000, T0 + 160_000_000, "chat-api",
        "opentelemetry.instrumentation.httpx",
        {"http.request.method": "POST", "url.full": "https://api.openai.com/v1/chat/completions",
         "http.response.status_code": 500, "gen_ai.response.time_to_first_chunk": 0.25, "http.request.resend_count": 1,
         "sampled": True, "payload": "AAH/"},
        STATUS_ERROR,
        (SpanEvent("exception", 1_700_000_000_283_000_000, {"exception.type": "httpx.HTTPStatusError", "exception.escaped": False}),),
        (SpanLink(TRACE2, "1111111111111111"),),
        api,
    )  # fmt: skip
    assert proxy == Span(
        TRACE, "8f2a0c9d3b4e5f60", GRANDCHILD_ID, "POST /v1/chat/completions", KIND_SERVER, T0 + 10_544_000,
        T0 + 150_544_000, "llm-proxy", "opentelemetry.instrumentation.asgi", {"http.route": "/v1/chat/completions"},
        STATUS_UNSET, (SpanEvent("log", T0 + 11_544_000, {"message": "queued"}),), (), {"service.name": "llm-proxy"},
    )  # fmt: skip
    assert type(post.attrs["http.response.status_code"]) is int and type(post.attrs["gen_ai.response.time_to_first_chunk"]) is float
    assert server.resource is connect.resource is post.resource  # one mapping per process of a trace
    assert post.end_ns - post.start_ns == 150_000 * 1000


def test_microseconds_become_nanoseconds(tmp_path: Path) -> None:
    read = read_jaeger_json(write(tmp_path / "t.json", response(jtrace(jspan(start=1700000000123456, duration=1500)))))
    (span,) = read.spans
    assert span.start_ns == 1700000000123456000 and span.end_ns == 1700000000123456000 + 1_500_000
    assert span.duration_ns == 1_500_000


# --- real spans: the SDK's, through the Collector's translator and jaeger-query's JSON ------


def jaeger_tag(key: str, value: Any) -> dict[str, Any]:
    """An attribute as the Collector's `pkg/translator/jaeger` makes a tag of it (slices and maps as JSON text)."""
    if isinstance(value, bool):
        return tag(key, value, "bool")
    if isinstance(value, int):
        return tag(key, value, "int64")
    if isinstance(value, float):
        return tag(key, value, "float64")
    if isinstance(value, bytes):
        return tag(key, base64.b64encode(value).decode(), "binary")
    if isinstance(value, str):
        return tag(key, value, "string")
    return tag(key, json.dumps(list(value), separators=(",", ":")), "string")


def jaeger_from_sdk(spans: list[ReadableSpan]) -> dict[str, Any]:
    """SDK spans as `/api/traces` returns them once exported by OTLP to Jaeger (model.go's fields; times floored to µs)."""
    traces: dict[str, dict[str, Any]] = {}
    for s in spans:
        ctx = s.get_span_context()
        assert ctx is not None and s.start_time is not None and s.end_time is not None
        trace_id = format(ctx.trace_id, "032x")
        trace = traces.setdefault(trace_id, {"traceID": trace_id, "spans": [], "processes": {}, "warnings": None})
        resource = dict(s.resource.attributes)
        process = {"serviceName": resource.pop("service.name"), "tags": [jaeger_tag(k, v) for k, v in resource.items()]}
        process_id = next((pid for pid, p in trace["processes"].items() if p == process), f"p{len(trace['processes']) + 1}")
        trace["processes"][process_id] = process
        refs = []
        if s.parent is not None:
            refs.append({"refType": "CHILD_OF", "traceID": trace_id, "spanID": format(s.parent.span_id, "016x")})
        for link in s.links:
            refs.append({"refType": "FOLLOWS_FROM", "traceID": format(link.context.trace_id, "032x"),
                         "spanID": format(link.context.span_id, "016x")})  # fmt: skip
        tags = [jaeger_tag(k, v) for k, v in (s.attributes or {}).items()]
        scope = s.instrumentation_scope
        if scope is not None:
            tags.append(tag("otel.scope.name", scope.name))
            if scope.version:
                tags.append(tag("otel.scope.version", scope.version))
        tags.append(tag("span.kind", s.kind.name.lower()))
        if s.status.status_code is not StatusCode.UNSET:
            tags.append(tag("otel.status_code", s.status.status_code.name))
            if s.status.description:
                tags.append(tag("otel.status_description", s.status.description))
            if s.status.status_code is StatusCode.ERROR:
                tags.append(tag("error", True))
        logs = [{"timestamp": e.timestamp // 1000,
                 "fields": [tag("event", e.name)] + [jaeger_tag(k, v) for k, v in (e.attributes or {}).items()]}
                for e in s.events]  # fmt: skip
        trace["spans"].append({
            "traceID": trace_id, "spanID": format(ctx.span_id, "016x"), "flags": int(ctx.trace_flags),
            "operationName": s.name, "references": refs, "startTime": s.start_time // 1000,
            "duration": (s.end_time - s.start_time) // 1000, "tags": tags, "logs": logs, "processID": process_id,
            "warnings": None,
        })  # fmt: skip
    return response(*traces.values())


def sdk_spans() -> list[ReadableSpan]:
    """A FastAPI-like request (SQLAlchemy connect and query, an httpx LLM call that fails) and a worker's span, times off the µs grid."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "chat-api", "service.instance.id": "i-1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    worker = TracerProvider(resource=Resource.create({"service.name": "worker"}))
    worker.add_span_processor(SimpleSpanProcessor(exporter))
    fastapi = provider.get_tracer("opentelemetry.instrumentation.fastapi", "0.48b0")
    sqlalchemy = provider.get_tracer("opentelemetry.instrumentation.sqlalchemy", "0.48b0")
    httpx = provider.get_tracer("opentelemetry.instrumentation.httpx")
    t0 = T0 + 789
    root = fastapi.start_span("GET /v1/chat", kind=SpanKind.SERVER, start_time=t0,
                              attributes={"http.route": "/v1/chat", "http.request.method": "GET", "http.response.status_code": 200})  # fmt: skip
    in_root = trace_api.set_span_in_context(root)
    connect = sqlalchemy.start_span("connect", in_root, SpanKind.CLIENT, {"db.system.name": "postgresql"}, start_time=t0 + 1_000_501)
    connect.end(t0 + 2_999_999)
    select = sqlalchemy.start_span("SELECT chat", in_root, SpanKind.CLIENT, start_time=t0 + 3_000_000,
                                   attributes={"db.system.name": "postgresql", "db.query.text": "SELECT 1", "server.port": 5432})  # fmt: skip
    select.end(t0 + 8_000_000)
    background = worker.get_tracer("worker").start_span("refresh", start_time=t0)
    background.end(t0 + 1_000)
    llm = httpx.start_span("POST", in_root, SpanKind.CLIENT, start_time=t0 + 10_000_000,
                           attributes={"http.request.method": "POST", "url.full": "https://api.openai.com/v1/chat/completions",
                                       "http.response.status_code": 500, "retry": True, "ratio": 0.5, "tags": ["a", "b"]},
                           links=[Link(background.get_span_context())])  # fmt: skip
    llm.add_event("exception", {"exception.type": "httpx.HTTPStatusError"}, timestamp=t0 + 150_000_000)
    llm.set_status(Status(StatusCode.ERROR, "Server Error"))
    llm.end(t0 + 160_000_000)
    root.end(t0 + 200_000_000)
    provider.shutdown()
    worker.shutdown()
    return list(exporter.get_finished_spans())


def expected_from_sdk(s: ReadableSpan, start: int, end: int, attrs: dict[str, Any], events: tuple[SpanEvent, ...],
                      links: tuple[SpanLink, ...]) -> Span:  # fmt: skip
    ctx = s.get_span_context()
    assert ctx is not None
    resource = dict(s.resource.attributes)
    return Span(
        format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"), None if s.parent is None else format(s.parent.span_id, "016x"),
        s.name, KIND_NAMES[s.kind.name.lower()], start, end, str(resource["service.name"]),
        s.instrumentation_scope.name if s.instrumentation_scope else "", attrs or NO_ATTRS,
        STATUS_NAMES[s.status.status_code.name], events, links, resource,
    )  # fmt: skip


def test_spans_from_the_sdk_through_the_collectors_jaeger_mapping(tmp_path: Path) -> None:
    spans = sdk_spans()
    path = write(tmp_path / "sdk.json", jaeger_from_sdk(spans), indent=True)
    read = read_jaeger_json(path)
    assert read.warnings == [] and read.documents == 2
    expected = []
    for s in spans:
        assert s.start_time is not None and s.end_time is not None
        start = s.start_time // 1000 * 1000
        attrs = {k: (json.dumps(list(v), separators=(",", ":")) if isinstance(v, tuple) else v) for k, v in (s.attributes or {}).items()}
        events = tuple(SpanEvent(e.name, e.timestamp // 1000 * 1000, dict(e.attributes or {})) for e in s.events)
        links = tuple(SpanLink(format(lk.context.trace_id, "032x"), format(lk.context.span_id, "016x")) for lk in s.links)
        expected.append(expected_from_sdk(s, start, start + (s.end_time - s.start_time) // 1000 * 1000, attrs, events, links))
    assert sorted(read.spans) == sorted(expected)
    llm = next(s for s in read.spans if s.name == "POST")
    assert llm.status_code == STATUS_ERROR and llm.attrs["tags"] == '["a","b"]' and llm.links[0].span_id in by_id(read)


# --- ids, references, tags, logs, processes --------------------------------------------------


def test_ids_are_lowercased_and_left_padded(tmp_path: Path) -> None:
    """A 64-bit trace id has 16 digits; servers before Jaeger 1.16 wrote ids without their leading zeros."""
    spans = [
        jspan("ABCDEF0123456789", trace="0AF7651916CD43DD"),
        jspan("f067aa0ba902b7", "ABCDEF0123456789", trace="af7651916cd43dd"),
        jspan("1", trace="123456789abcdef0123456789abcdef"),
    ]
    spans[2]["references"] = [{"refType": "CHILD_OF", "traceID": "123456789abcdef0123456789abcdef", "spanID": "2a"}]
    read = read_jaeger_json(write(tmp_path / "t.json", response(jtrace(*spans, trace="ignored"))))
    assert [(s.trace_id, s.span_id, s.parent_id) for s in read.spans] == [
        ("00000000000000000af7651916cd43dd", "abcdef0123456789", None),
        ("00000000000000000af7651916cd43dd", "00f067aa0ba902b7", "abcdef0123456789"),
        ("0123456789abcdef0123456789abcdef", "0000000000000001", "000000000000002a"),
    ]
    assert read.spans[0].trace_id is read.spans[1].trace_id


def test_parent_is_the_child_of_reference_of_the_same_trace_and_other_references_are_links(tmp_path: Path) -> None:
    spans = [
        jspan(ROOT_ID),
        # FOLLOWS_FROM first, CHILD_OF after it: the parent is still the CHILD_OF one
        jspan(CHILD_ID, refs=[{"refType": "FOLLOWS_FROM", "traceID": TRACE2, "spanID": GRANDCHILD_ID},
                              {"refType": "CHILD_OF", "traceID": TRACE, "spanID": ROOT_ID}]),  # fmt: skip
        # a CHILD_OF into another trace is a link, not a parent; a second CHILD_OF of the same trace too
        jspan("1111111111111111", refs=[{"refType": "CHILD_OF", "traceID": TRACE2, "spanID": GRANDCHILD_ID},
                                        {"refType": "CHILD_OF", "traceID": TRACE, "spanID": CHILD_ID},
                                        {"refType": "CHILD_OF", "traceID": TRACE, "spanID": ROOT_ID}]),  # fmt: skip
        jspan("2222222222222222", parentSpanID=CHILD_ID),  # the older form, no references
        jspan("3333333333333333", parentSpanID="0000000000000000"),  # a root marked with zeros
        jspan("4444444444444444", refs=[{"refType": "CHILD_OF", "traceID": TRACE, "spanID": "0000000000000000"}]),
        jspan("5555555555555555", refs=[{"traceID": TRACE, "spanID": ROOT_ID}]),  # no refType: CHILD_OF (proto's default)
        jspan("6666666666666666", refs=[{"refType": "FOLLOWS_FROM", "traceID": "0af7651916cd43dd", "spanID": "2a"}]),
    ]  # fmt: skip
    spans[3]["references"] = None
    read = by_id(read_jaeger_json(write(tmp_path / "t.json", response(jtrace(*spans)))))
    assert read[ROOT_ID].parent_id is None and read[ROOT_ID].links == ()
    assert read[CHILD_ID].parent_id == ROOT_ID and read[CHILD_ID].links == (SpanLink(TRACE2, GRANDCHILD_ID),)
    assert read["1111111111111111"].parent_id == CHILD_ID
    assert read["1111111111111111"].links == (SpanLink(TRACE2, GRANDCHILD_ID), SpanLink(TRACE, ROOT_ID))
    assert read["2222222222222222"].parent_id == CHILD_ID
    assert read["3333333333333333"].parent_id is None and read["4444444444444444"].parent_id is None
    assert read["5555555555555555"].parent_id == ROOT_ID
    assert read["6666666666666666"].links == (SpanLink("00000000000000000af7651916cd43dd", "000000000000002a"),)


def test_tag_values_of_every_type_and_unreadable_ones_dropped(tmp_path: Path) -> None:
    tags = [
        tag("s", "text"), tag("b", True), tag("b2", "false", "bool"), tag("b3", "TRUE", "bool"),
        tag("i", 42), tag("i2", "-9007199254740993", "int64"), tag("i3", 2**63 - 1), tag("i4", 7.0, "int64"),
        tag("f", 0.5), tag("f2", 3, "float64"), tag("f3", "1e-3", "float64"), tag("raw", "AAH/", "binary"),
        {"key": "untyped", "value": 5}, {"key": "untyped_s", "value": "x"},
        # unreadable: dropped, counted
        tag("bad_i", "12a", "int64"), tag("bad_i2", " 5", "int64"), tag("bad_f", "one", "float64"), tag("bad_b", "yes", "bool"),
        tag("bad_s", 5, "string"), tag("bad_type", "x", "uint8"), {"key": "untyped_list", "value": [1]}, {"key": "no_value"},
        {"type": "string", "value": "no key"}, {"key": 7, "type": "string", "value": "int key"}, "a string", [1],
    ]  # fmt: skip
    doc = response(jtrace(jspan()))
    doc["data"][0]["spans"][0]["tags"] = tags
    read = read_jaeger_json(write(tmp_path / "t.json", doc))
    (span,) = read.spans
    assert span.attrs == {"s": "text", "b": True, "b2": False, "b3": True, "i": 42, "i2": -9007199254740993, "i3": 2**63 - 1,
                          "i4": 7, "f": 0.5, "f2": 3.0, "f3": 0.001, "raw": "AAH/", "untyped": 5, "untyped_s": "x"}  # fmt: skip
    assert [type(span.attrs[k]) for k in ("i2", "i4", "f2", "b2")] == [int, int, float, bool]
    assert sorted(read.warnings) == sorted(f"{tmp_path / 't.json'}: {w}" for w in [
        "dropped 7 tag(s) whose value does not match its type",
        "dropped 4 tag(s) that are not key/type/value objects",
        "dropped 1 tag(s) without a string key",
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("server", KIND_SERVER), ("client", KIND_CLIENT), ("producer", KIND_PRODUCER), ("consumer", KIND_CONSUMER),
     ("internal", KIND_INTERNAL), ("SERVER", KIND_SERVER), (None, KIND_UNSPECIFIED)],
)  # fmt: skip
def test_span_kind_tag(tmp_path: Path, kind: str | None, expected: int) -> None:
    tags = {"a": 1} if kind is None else {"span.kind": kind, "a": 1}
    read = read_jaeger_json(write(tmp_path / "t.json", response(jtrace(jspan(tags=tags)))))
    (span,) = read.spans
    assert span.kind == expected and span.attrs == {"a": 1} and read.warnings == []


def test_status_and_scope_from_otel_tags_dropped_from_attributes(tmp_path: Path) -> None:
    spans = [
        jspan("1111111111111111", tags={"otel.status_code": "OK", "otel.scope.name": "s1", "otel.scope.version": "1"}),
        jspan("2222222222222222", tags={"otel.status_code": "ERROR", "otel.status_description": "boom", "error": True}),
        jspan("3333333333333333", tags={"error": True}),  # OpenTracing's error flag alone
        jspan("4444444444444444", tags={"otel.status_code": "OK", "error": True}),  # the error tag is the last word
        jspan("5555555555555555", tags={"error": False, "otel.library.name": "old", "otel.library.version": "0.1"}),
        jspan("6666666666666666", tags={"otel.status_code": "error", "otel.scope.name": "new", "otel.library.name": "old"}),
        jspan("7777777777777777", tags={"otel.status_code": "MAYBE", "span.kind": "sideways", "keep": "me"}),
        jspan("8888888888888888", tags={"error": "true"}),
    ]  # fmt: skip
    path = write(tmp_path / "t.json", response(jtrace(*spans)))
    read = read_jaeger_json(path)
    assert [(s.status_code, s.scope, s.kind) for s in read.spans] == [
        (STATUS_OK, "s1", KIND_UNSPECIFIED), (STATUS_ERROR, "", KIND_UNSPECIFIED), (STATUS_ERROR, "", KIND_UNSPECIFIED),
        (STATUS_ERROR, "", KIND_UNSPECIFIED), (STATUS_UNSET, "old", KIND_UNSPECIFIED), (STATUS_ERROR, "new", KIND_UNSPECIFIED),
        (STATUS_UNSET, "", KIND_UNSPECIFIED), (STATUS_ERROR, "", KIND_UNSPECIFIED),
    ]  # fmt: skip
    assert [s.attrs for s in read.spans] == [NO_ATTRS] * 6 + [{"keep": "me"}, NO_ATTRS]
    assert sorted(read.warnings) == [
        f"{path}: read 1 span(s) with an unknown otel.status_code as unset",
        f"{path}: read 1 span(s) with an unknown span.kind as unspecified",
    ]


def test_logs_become_events_named_by_their_event_field(tmp_path: Path) -> None:
    logs = [
        {"timestamp": T0_US + 5, "fields": [tag("event", "exception"), tag("exception.type", "ValueError")]},
        {"timestamp": T0_US + 6, "fields": [tag("message", "cache miss"), tag("level", "info")]},
        {"timestamp": T0_US + 7, "fields": [tag("event", 3)]},  # not a string: the event is a "log", the field kept
        {"timestamp": T0_US + 8},  # no fields at all
        {"timestamp": "x", "fields": []},
        {"fields": []},
        {"timestamp": T0_US, "fields": "x"},
        7,
    ]
    path = write(tmp_path / "t.json", response(jtrace(jspan(logs=logs))))
    read = read_jaeger_json(path)
    assert read.spans[0].events == (
        SpanEvent("exception", T0 + 5000, {"exception.type": "ValueError"}),
        SpanEvent("log", T0 + 6000, {"message": "cache miss", "level": "info"}),
        SpanEvent("log", T0 + 7000, {"event": 3}),
        SpanEvent("log", T0 + 8000),
    )
    assert sorted(read.warnings) == [
        f"{path}: dropped 1 log(s) that are not objects",
        f"{path}: dropped 3 log(s) without a readable timestamp and field list",
    ]


def test_one_resource_per_process_per_trace(tmp_path: Path) -> None:
    processes = {"p1": {"serviceName": "chat-api", "tags": [tag("host.name", "web-1"), tag("service.name", "stale")]},
                 "p2": {"serviceName": "worker", "tags": None}}  # fmt: skip
    first = jtrace(jspan(ROOT_ID), jspan(CHILD_ID, ROOT_ID), jspan(GRANDCHILD_ID, CHILD_ID, process="p2"), processes=processes)
    second = jtrace(jspan(ROOT_ID, trace=TRACE2), processes=processes, trace=TRACE2)
    read = read_jaeger_json(write(tmp_path / "t.json", response(first, second)))
    a, b, c, d = read.spans
    assert a.resource is b.resource and a.resource == {"service.name": "chat-api", "host.name": "web-1"}
    assert c.service == "worker" and c.resource == {"service.name": "worker"}
    assert d.resource == a.resource and d.resource is not a.resource  # per trace, as the processes map is
    assert read.documents == 2 and read.warnings == []


def test_embedded_process_and_unknown_process(tmp_path: Path) -> None:
    """Some producers put the process in each span (`"process"`, no `processID`)."""
    proc = {"serviceName": "billing", "tags": [tag("host.name", "b-1")]}
    spans = [jspan(ROOT_ID), jspan(CHILD_ID, ROOT_ID), jspan(GRANDCHILD_ID, ROOT_ID, process="p9")]
    for sp in spans[:2]:
        del sp["processID"]
        sp["process"] = dict(proc)
    path = write(tmp_path / "t.json", response(jtrace(*spans, processes={})))
    read = read_jaeger_json(path)
    a, b, c = read.spans
    assert a.service == b.service == "billing" and a.resource is b.resource and a.resource == {"service.name": "billing", "host.name": "b-1"}
    assert c.service == "" and c.resource == NO_ATTRS
    assert read.warnings == [f"{path}: read 1 span(s) whose processID names no process of their trace, with no service"]


# --- shapes of file ----------------------------------------------------------------------


def test_bare_trace_array_of_traces_and_pretty_printed(tmp_path: Path) -> None:
    expected = [ROOT_ID, CHILD_ID, GRANDCHILD_ID]
    for i, doc in enumerate([jtrace(*three_spans()), [jtrace(*three_spans()[:2]), jtrace(three_spans()[2])],
                             response(jtrace(*three_spans()))]):  # fmt: skip
        for indent in (False, True):
            path = write(tmp_path / f"t{i}{indent}.json", doc, indent=indent)
            assert sniff(path.read_bytes())
            read = read_jaeger_json(path)
            assert [s.span_id for s in read.spans] == expected and read.warnings == []


def test_json_lines_of_responses_and_a_torn_last_line(tmp_path: Path) -> None:
    first, second, third = (orjson.dumps(response(jtrace(s))) for s in three_spans())
    path = tmp_path / "t.jsonl"
    path.write_bytes(first + b"\n" + second + b"\n\n" + third[:70] + b"\n")
    read = read_jaeger_json(path)
    assert [s.span_id for s in read.spans] == [ROOT_ID, CHILD_ID] and read.documents == 2
    (warning,) = read.warnings
    assert warning.startswith(f"{path}:4: skipped a torn last line (not valid JSON:")
    path.write_bytes(first + b"\n" + third[:70] + b"\n" + second + b"\n")
    with pytest.raises(InputError, match=rf"^{path}:2: malformed line \(not valid JSON: .*\); the file is damaged before its end$"):
        read_jaeger_json(path)


def test_gzip_is_told_by_its_magic_bytes_not_its_name(tmp_path: Path) -> None:
    path = write(tmp_path / "trace.json", response(jtrace(*three_spans())), gz=True)
    assert [s.span_id for s in read_jaeger_json(path).spans] == [ROOT_ID, CHILD_ID, GRANDCHILD_ID]
    assert sniff(gzip.decompress(path.read_bytes())) and not sniff(path.read_bytes())


def test_truncated_gzip(tmp_path: Path) -> None:
    one = gzip.compress(json.dumps(response(jtrace(*three_spans())), indent=2).encode())
    path = tmp_path / "one.json.gz"
    path.write_bytes(one[: len(one) * 2 // 3])
    with pytest.raises(InputError, match=rf"^{path}: compressed stream is truncated or damaged \("):
        read_jaeger_json(path)
    lines = b"".join(orjson.dumps(response(jtrace(jspan(f"{i:016x}")))) + b"\n" for i in range(1, 2000))
    packed = gzip.compress(lines, mtime=0)
    path.write_bytes(packed[: len(packed) - 200])  # the stream's end is gone, most lines are there
    read = read_jaeger_json(path)
    assert 1000 < len(read.spans) < 1999
    assert any(w.startswith(f"{path}: compressed stream is truncated or damaged (") for w in read.warnings)


# --- damage and wrong input ------------------------------------------------------------------


def test_unreadable_spans_are_skipped_and_counted_once_per_reason(tmp_path: Path) -> None:
    spans: list[Any] = [
        jspan(ROOT_ID),  # the one good span
        jspan("2222222222222222", start="1700000000123456"),  # a time as text: model.go writes numbers
        jspan("3333333333333333", duration=-5),
        jspan("4444444444444444", start=0),
        jspan("5555555555555555", duration=None),
        jspan("zz22222222222222"),
        jspan("0000000000000000"),
        jspan("12345678901234567"),  # 17 digits
        jspan("6666666666666666", trace="0" * 32),
        jspan("7777777777777777", trace="abc-"),
        jspan("8888888888888888", parent="not-an-id"),
        jspan("9999999999999999", parentSpanID="xyz", references=[]),
        {**jspan("aaaaaaaaaaaaaaaa"), "tags": "a string"},
        jspan("bbbbbbbbbbbbbbbb", operationName=7),
        jspan("cccccccccccccccc", logs={"not": "a list"}),
        jspan("dddddddddddddddd", references={"refType": "CHILD_OF"}),
        jspan("eeeeeeeeeeeeeeee", references=[{"refType": "CHILD_OF", "traceID": "nope", "spanID": ROOT_ID}]),
        "not a span",
        jspan("ffffffffffffffff", references=[7, {"refType": "SIBLING_OF", "traceID": TRACE, "spanID": ROOT_ID},
                                               {"refType": "FOLLOWS_FROM", "traceID": TRACE, "spanID": "0" * 16}]),  # kept
    ]  # fmt: skip
    del spans[4]["duration"]
    path = write(tmp_path / "bad.json", response(jtrace(*spans), "not a trace", {"traceID": TRACE, "spans": "x"}))
    read = read_jaeger_json(path)
    assert [s.span_id for s in read.spans] == [ROOT_ID, "ffffffffffffffff"]
    assert sorted(read.warnings) == sorted(f"{path}: {w}" for w in [
        "skipped 3 span(s) without a readable startTime and duration",
        "skipped 1 span(s) with a negative duration",
        "skipped 3 span(s) without a valid spanID",
        "skipped 2 span(s) without a valid traceID",
        "skipped 3 span(s) with an invalid CHILD_OF reference or parentSpanID",
        "skipped 1 span(s) whose tags is not a list",
        "skipped 1 span(s) whose operationName is not a string",
        "skipped 1 span(s) whose logs is not a list",
        "skipped 1 span(s) whose references is not a list",
        "skipped 1 span(s) that are not objects",
        "skipped 1 trace(s) that are not objects",
        "skipped 1 trace(s) whose spans is not a list",
        "dropped 1 reference(s) that are not objects",
        "dropped 1 reference(s) whose refType is neither CHILD_OF nor FOLLOWS_FROM",
        "dropped 1 reference(s) without a valid traceID and spanID",
    ])  # fmt: skip


def test_nothing_readable_lists_the_reasons(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.json", response(jtrace(jspan("zz"), jspan(CHILD_ID, start=None))))
    with pytest.raises(InputError, match=rf"^{path}: Jaeger JSON file holds no readable spans: skipped 1 span\(s\) without a valid"
                                         r" spanID; 1 span\(s\) without a readable startTime and duration$"):  # fmt: skip
        read_jaeger_json(path)


def test_query_api_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "404.json", {"data": None, "total": 0, "limit": 0, "offset": 0,
                                         "errors": [{"code": 404, "msg": "trace not found", "traceID": TRACE}]})  # fmt: skip
    with pytest.raises(InputError, match=rf"^{path}: Jaeger JSON file holds no readable spans \(0 trace\(s\), none with spans\);"
                                         r" the query API returned 1 error\(s\): 404 trace not found$"):  # fmt: skip
        read_jaeger_json(path)
    path = write(tmp_path / "partial.json", response(jtrace(jspan()), errors=[{"code": 500, "msg": "storage\ntimeout"}]))
    read = read_jaeger_json(path)
    assert len(read.spans) == 1 and read.warnings == [f"{path}: the query API returned 1 error(s): 500 storage timeout"]


CAPTURE_HEADER = b'{"type": "header", "schema": "latprof-capture/1", "source": "run", "pid": 4242}\n{"type": "segment"}\n'


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file is empty"),
        (b"\n  \n\t\n", "file is empty"),
        (b"hello, world\nthis is a log file\n", "not Jaeger JSON traces: not JSON"),
        (CAPTURE_HEADER, r"not Jaeger JSON traces: the first JSON object has no data, traceID or spans \(its keys: type, schema, source, pid\)"),
        (b'{"resourceSpans": []}', r"not Jaeger JSON traces: the first JSON object has no data, traceID or spans \(its keys: resourceSpans\)"),
        (b'[{"traceId": "0af7651916cd43dd", "id": "b7ad6b7169203331", "timestamp": 1}]',
         r"not Jaeger JSON traces: its first array element is not a trace \(no traceID or spans; its keys: traceId, id, timestamp\)"),
        (b"[1, 2]", "not Jaeger JSON traces: its first array element is a JSON number, not a trace object"),
        (b"{}", r"not Jaeger JSON traces: the first JSON object has no data, traceID or spans \(it is empty\)"),
        (b'"data"', "not Jaeger JSON traces: it starts with a JSON string, not an object or array"),
        (b"null", "not Jaeger JSON traces: it starts with a JSON null, not an object or array"),
        (b"[]", r"Jaeger JSON file holds no readable spans \(0 trace\(s\), none with spans\)"),
        (b'{"data": [], "total": 0, "limit": 0, "offset": 0, "errors": null}', r"Jaeger JSON file holds no readable spans \(0 trace\(s\)"),
        (b'{"data": [{"traceID": "0af7651916cd43dd", "spans": []}]}', r"Jaeger JSON file holds no readable spans \(1 trace\(s\), none"),
        (b'{"data": {"traceID": "x"}}', r"Jaeger JSON file holds no readable spans: skipped 1 response\(s\) whose data is not a list"),
        (b'{"data": [{"traceID": "0af7651916cd43dd", "spans": [', "truncated or not valid JSON: "),
        (b'\xef\xbb\xbf{"data": [{"traceID": "0af7651916cd43dd", "spans": [{"spanID": 5}]}]}',  # the trace's id stands in for the span's
         r"Jaeger JSON file holds no readable spans: skipped 1 span\(s\) without a valid spanID"),
        (b"\x1f\x8bnot really gzip", "compressed stream is truncated or damaged"),
        (b'{"data": [\xff]}', "truncated or not valid JSON: str is not valid UTF-8"),
    ],
    ids=["empty", "blank", "text", "capture", "otlp", "zipkin", "numbers", "empty-object", "string", "null", "empty-array",
         "no-traces", "no-spans", "data-object", "truncated", "bom-bad-ids", "bad-gzip", "not-utf8"],
)  # fmt: skip
def test_bad_files_are_one_line_input_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match=rf"^{path}: {message}") as caught:
        read_jaeger_json(path)
    assert "\n" not in str(caught.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=rf"^{tmp_path / 'nope.json'}: cannot open: No such file"):
        read_jaeger_json(tmp_path / "nope.json")
    with pytest.raises(InputError, match=rf"^{tmp_path}: is a directory"):
        read_jaeger_json(tmp_path)


def _mutations(doc: Any, rng: random.Random, count: int) -> list[Any]:
    """`count` copies of `doc`, each with one value somewhere replaced by junk of another type, or one key deleted."""
    junk = [None, 0, -1, 7, 2.5, -2.5, 1e300, 2**64 - 1, True, False, "", "x", " 5", "NaN", "true", "0" * 16, "A" * 32,
            "CHILD_OF", "FOLLOWS_FROM", "server", "ERROR", "int64", "float64", "bool", "binary", [], [1], [None], {}, {"a": 1},
            {"key": "k", "type": "int64", "value": "x"}, "1700000000123456"]  # fmt: skip
    return mutations(doc, rng, count, junk)


def _check_outcome(path: Path) -> str:
    """Read `path`: a result whose warnings are one line each and name the file, or such an InputError; nothing else."""
    try:
        read = read_jaeger_json(path)
    except InputError as exc:
        assert str(exc).startswith(f"{path}") and "\n" not in str(exc)
        return "error"
    assert read.spans and all(w.startswith(f"{path}") and "\n" not in w for w in read.warnings)
    for span in read.spans:
        assert len(span.trace_id) == 32 and len(span.span_id) == 16 and span.start_ns <= span.end_ns
        assert type(span.kind) is int and type(span.status_code) is int and type(span.name) is str
    return "read"


def fuzz_base() -> dict[str, Any]:
    doc = orjson.loads(QUERY_RESPONSE)
    doc["data"].append(jtrace(*three_spans(), processes={"p1": {"serviceName": "x", "tags": [tag("n", 3)]}}))
    return doc


def test_junk_anywhere_is_read_or_an_input_error(tmp_path: Path) -> None:
    rng = random.Random(7)
    outcomes: dict[str, int] = {}
    for i, doc in enumerate(_mutations(fuzz_base(), rng, 500)):
        outcome = _check_outcome(write(tmp_path / f"m{i}.json", doc))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes["read"] > 400 and outcomes["error"] >= 1  # both outcomes were exercised


def test_corrupt_bytes_are_read_or_an_input_error(tmp_path: Path) -> None:
    rng = random.Random(11)
    data = orjson.dumps(fuzz_base())
    lines = b"\n".join(orjson.dumps(response(t)) for t in fuzz_base()["data"]) + b"\n"
    outcomes: dict[str, int] = {}
    for i in range(300):
        base = [data, lines, gzip.compress(data, mtime=0)][i % 3]
        raw = damaged(base, rng)
        path = tmp_path / f"c{i}.json"
        path.write_bytes(raw)
        outcome = _check_outcome(path)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes["read"] > 20 and outcomes["error"] > 20


def test_many_spans_in_one_trace_read_in_linear_time(tmp_path: Path) -> None:
    spans = [jspan(f"{i:016x}", parent=f"{i - 1:016x}" if i > 1 else None, tags={"i": i, "span.kind": "internal"},
                   logs=[{"timestamp": T0_US, "fields": [tag("event", "e")]}]) for i in range(1, 30_001)]  # fmt: skip
    read = read_jaeger_json(write(tmp_path / "big.json", response(jtrace(*spans))))
    assert len(read.spans) == 30_000 and read.spans[-1].parent_id == f"{29_999:016x}"
    assert len({id(s.resource) for s in read.spans}) == 1 and len({id(s.events[0].name) for s in read.spans}) == 1


# --- sniff ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        b'{"data":[{"traceID":"0af7651916cd43dd","spans":[{"traceID":"0af7651916cd43dd","spanID":"b7ad',
        b'{\n  "data": [\n    {\n      "traceID": "0af7651916cd43dd8448eb211c80319c",\n      "spans": [\n',
        b'\xef\xbb\xbf{"traceID": "0af7651916cd43dd", "spans": []}',
        b'[{"traceID": "0af7651916cd43dd", "spans": [], "processes": {}}]',
        b'{"data": [{"processes": {"p1": {"serviceName": "a", "tags": []}}, "traceID": "0af7651916cd43dd", "spans": [',
        b'{"data":[{"traceID":"0af7651916cd43dd","spans":[{"traceID":"0af7651916cd43dd","spanID":"b7ad6b7169203331",'
        b'"operationName":"GET /x","references":[],"startTime":1700000000123456,"duration":10,"tags":[{"key":"traceId","type":"string","value":"x"}',
    ],
    ids=["compact", "pretty", "bom-bare-trace", "array-of-traces", "processes-first", "tag-named-traceId"],
)
def test_sniff_true(head: bytes) -> None:
    assert sniff(head)


@pytest.mark.parametrize(
    "head",
    [
        CAPTURE_HEADER,
        b'{"type":"header","schema":"latprof.capture/1","traceID":"x","spans":[]}',
        b'{"resourceSpans":[{"resource":{"attributes":[{"key":"traceID","value":{"stringValue":"spans"}}]}}]}',
        b'{"result": {"resourceSpans": []}}',
        b'[{"traceId":"0af7651916cd43dd","id":"b7ad6b7169203331","name":"get","timestamp":1,"duration":2}]',
        b'[[{"traceId":"0af7651916cd43dd","id":"b7ad6b7169203331"}]]',
        b'{"data":[],"total":0,"limit":0,"offset":0,"errors":null}',
        b'{"data":null,"errors":[{"code":404,"msg":"trace not found","traceID":"0af7651916cd43dd"}]}',
        b'{"padding": "' + b"x" * 5000 + b'", "traceID": "0af7651916cd43dd", "spans": []}',
        b"traceID spans",
        b"",
        b"\x1f\x8b\x08\x00",
    ],
    ids=["capture", "capture-with-keys", "otlp", "otlp-wrapped", "zipkin", "zipkin-traces", "no-traces", "api-error",
         "far-keys", "bare-words", "empty", "gzip"],
)  # fmt: skip
def test_sniff_false(head: bytes) -> None:
    assert not sniff(head)


def test_each_format_sniffs_as_its_own_only(tmp_path: Path) -> None:
    jaeger_docs = [orjson.dumps(response(jtrace(*three_spans()))), QUERY_RESPONSE.encode(), orjson.dumps(jaeger_from_sdk(sdk_spans()))]
    for head in jaeger_docs:
        assert sniff(head) and not zipkin_json.sniff(head) and not otlp_json.sniff(head)
    for path in OTLP_FIXTURES.glob("*.otlp.json"):
        head = path.read_bytes()[: 64 * 1024]
        assert otlp_json.sniff(head) and not sniff(head) and not zipkin_json.sniff(head)
    for path in sorted((ROOT / "examples").rglob("*.jsonl.gz"))[:3]:
        head = gzip.decompress(path.read_bytes())[: 64 * 1024]
        assert not sniff(head) and not zipkin_json.sniff(head) and not otlp_json.sniff(head)


def test_module_names_its_format_in_errors(tmp_path: Path) -> None:
    """Reading another format is an InputError that says it is not Jaeger JSON (what the lead's dispatch relies on)."""
    for path in OTLP_FIXTURES.glob("*.otlp.json"):
        with pytest.raises(InputError, match="not Jaeger JSON traces"):
            read_jaeger_json(path)
