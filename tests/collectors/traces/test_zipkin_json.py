"""The Zipkin v2 JSON trace reader: documents as Zipkin's API writes them, spans from the SDK as
OpenTelemetry's Zipkin JSON exporter encodes them, every kind of bad input, and one trace read from
Jaeger JSON and from Zipkin JSON mapping to the same requests and layers."""

from __future__ import annotations

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
from opentelemetry.trace import SpanKind, Status, StatusCode

from latprof.collectors.traces import jaeger_json, otlp_json
from latprof.collectors.traces.jaeger_json import read_jaeger_json
from latprof.collectors.traces.zipkin_json import ZipkinRead, read_zipkin_json, sniff
from latprof.errors import InputError
from latprof.events import NO_ATTRS
from latprof.layers import DB_POOL, DB_QUERY, PROVIDER
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
)
from latprof.collectors.traces.tracemap import map_spans

ROOT = Path(__file__).resolve().parents[3]
OTLP_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "otlp"  # real traces from outside the project (its README.md)
T0_US = 1_700_000_000_123_456  # timestamp, microseconds since the epoch
T0 = T0_US * 1000
MS_US = 1000
TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACE2 = "4bf92f3577b34da6a3ce929d0e0e4736"
ROOT_ID = "b7ad6b7169203331"
CHILD_ID = "00f067aa0ba902b7"
GRANDCHILD_ID = "53995c3f42cd8ad8"
CAPTURE_HEADER = b'{"type": "header", "schema": "latprof-capture/1", "source": "run", "pid": 4242}\n{"type": "segment"}\n'


# --- documents built by hand, as zipkin2's JSON_V2 encoder writes them ----------------------


def zspan(span_id: str = ROOT_ID, parent: str | None = None, trace: str = TRACE, name: Any = "get /x", kind: Any = "SERVER",
          start: Any = T0_US, duration: Any = 10 * MS_US, service: str | None = "chat-api", tags: Any = None,
          **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A Span in zipkin2's field order (traceId, parentId, id, kind, name, timestamp, duration, localEndpoint, ..., tags)."""
    out: dict[str, Any] = {"traceId": trace}
    if parent is not None:
        out["parentId"] = parent
    out["id"] = span_id
    if kind is not None:
        out["kind"] = kind
    out.update(name=name, timestamp=start, duration=duration)
    if service is not None:
        out["localEndpoint"] = {"serviceName": service, "ipv4": "10.0.0.7"}
    if tags:
        out["tags"] = tags
    out.update(extra)
    return out


def three_spans() -> list[dict[str, Any]]:
    """A SERVER root, a db CLIENT child and a local (kind-less) grandchild, children inside their parents."""
    return [
        zspan(ROOT_ID, name="post /chat", tags={"http.route": "/chat", "http.response.status_code": "200"}),
        zspan(CHILD_ID, ROOT_ID, name="select users", kind="CLIENT", start=T0_US + 2 * MS_US, duration=4 * MS_US,
              tags={"db.system.name": "postgresql", "server.port": "5432"}),
        zspan(GRANDCHILD_ID, CHILD_ID, name="parse", kind=None, start=T0_US + 3 * MS_US, duration=MS_US),
    ]  # fmt: skip


def write(path: Path, doc: Any, gz: bool = False, indent: bool = False) -> Path:
    data = json.dumps(doc, indent=2).encode() if indent else orjson.dumps(doc)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def by_id(read: ZipkinRead) -> dict[str, Span]:
    return {s.span_id: s for s in read.spans}


# What GET /api/v2/trace/{traceId} returns for a trace of Brave-instrumented services (zipkin2's
# JSON_V2 writer: its field order, names lowercased, a 64-bit trace id, the B3 server span that
# shares its client's id).
API_TRACE = """[
  {"traceId":"0af7651916cd43dd","id":"b7ad6b7169203331","kind":"SERVER","name":"get /v1/chat","timestamp":1700000000123456,
   "duration":200000,"localEndpoint":{"serviceName":"frontend","ipv4":"172.17.0.13"},
   "remoteEndpoint":{"ipv4":"110.170.201.178","port":63678},
   "tags":{"http.method":"GET","http.path":"/v1/chat","http.route":"/v1/chat","http.status_code":"200","mvc.controller.class":"Frontend"}},
  {"traceId":"0af7651916cd43dd","parentId":"b7ad6b7169203331","id":"00f067aa0ba902b7","kind":"CLIENT","name":"post",
   "timestamp":1700000000133456,"duration":150000,"localEndpoint":{"serviceName":"frontend","ipv4":"172.17.0.13"},
   "remoteEndpoint":{"serviceName":"llm-proxy","ipv4":"172.17.0.9","port":8080},
   "annotations":[{"timestamp":1700000000134000,"value":"ws"},{"timestamp":1700000000283000,"value":"wr"}],
   "tags":{"http.method":"POST","http.path":"/v1/chat/completions","http.url":"http://llm-proxy:8080/v1/chat/completions",
           "error":"500"}},
  {"traceId":"0af7651916cd43dd","parentId":"b7ad6b7169203331","id":"00f067aa0ba902b7","kind":"SERVER","name":"post /v1/chat/completions",
   "timestamp":1700000000134500,"duration":148000,"localEndpoint":{"serviceName":"llm-proxy","ipv4":"172.17.0.9"},
   "remoteEndpoint":{"ipv4":"172.17.0.13","port":40444},"tags":{"http.method":"POST"},"shared":true},
  {"traceId":"0af7651916cd43dd","parentId":"00f067aa0ba902b7","id":"53995c3f42cd8ad8","name":"render","timestamp":1700000000140000,
   "duration":1,"localEndpoint":{"serviceName":"llm-proxy","ipv4":"172.17.0.9"},"tags":{"lc":"template"}}
]
"""


def test_api_trace_as_zipkin_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(API_TRACE)
    assert sniff(path.read_bytes())
    read = read_zipkin_json(path)
    trace = "0" * 16 + "0af7651916cd43dd"
    server, client, render = read.spans
    frontend = {"service.name": "frontend"}
    assert server == Span(
        trace, ROOT_ID, None, "get /v1/chat", KIND_SERVER, 1_700_000_000_123_456_000, 1_700_000_000_323_456_000, "frontend", "",
        {"http.method": "GET", "http.path": "/v1/chat", "http.route": "/v1/chat", "http.status_code": 200,
         "mvc.controller.class": "Frontend"},
        STATUS_UNSET, (), (), frontend,
    )  # fmt: skip
    assert client == Span(
        trace, CHILD_ID, ROOT_ID, "post", KIND_CLIENT, T0 + 10_000_000, T0 + 160_000_000, "frontend", "",
        {"http.method": "POST", "http.path": "/v1/chat/completions", "http.url": "http://llm-proxy:8080/v1/chat/completions",
         "server.address": "172.17.0.9", "server.port": 8080, "peer.service": "llm-proxy"},
        STATUS_ERROR, (SpanEvent("ws", T0 + 10_544_000), SpanEvent("wr", 1_700_000_000_283_000_000)), (), frontend,
    )  # fmt: skip
    assert render == Span(trace, GRANDCHILD_ID, CHILD_ID, "render", KIND_INTERNAL, T0 + 16_544_000, T0 + 16_545_000, "llm-proxy",
                          "", {"lc": "template"}, STATUS_UNSET, (), (), {"service.name": "llm-proxy"})  # fmt: skip
    assert server.resource is client.resource  # one mapping per service
    assert type(server.attrs["http.status_code"]) is int
    assert read.warnings == [
        f"{path}: skipped 1 span(s) whose id repeats within their trace (1 marked shared: a server span reusing its client's id,"
        " B3 style); kept the first of each"
    ]
    assert read.documents == 1


def test_api_traces_is_an_array_of_traces(tmp_path: Path) -> None:
    first = three_spans()
    second = [zspan(ROOT_ID, trace=TRACE2), zspan(CHILD_ID, ROOT_ID, trace=TRACE2, kind="PRODUCER")]
    read = read_zipkin_json(write(tmp_path / "traces.json", [first, second, []]))
    assert [(s.trace_id, s.span_id) for s in read.spans] == [(TRACE, ROOT_ID), (TRACE, CHILD_ID), (TRACE, GRANDCHILD_ID),
                                                             (TRACE2, ROOT_ID), (TRACE2, CHILD_ID)]  # fmt: skip
    assert read.documents == 3 and read.warnings == []
    assert [s.kind for s in read.spans] == [KIND_SERVER, KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, KIND_PRODUCER]


def test_microseconds_become_nanoseconds(tmp_path: Path) -> None:
    read = read_zipkin_json(write(tmp_path / "t.json", [zspan(start=1700000000123456, duration=1500)]))
    (span,) = read.spans
    assert span.start_ns == 1700000000123456000 and span.end_ns == 1700000000123456000 + 1_500_000


# --- real spans: the SDK's, as opentelemetry-exporter-zipkin-json's JsonV2Encoder writes them -


def zipkin_tag(value: Any) -> str:
    """An attribute as the exporter makes a tag of it: booleans lower-case, numbers as text, sequences as JSON."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(list(value), separators=(",", ":"))


def usec(ns: int) -> int:
    """The exporter's `_nsec_to_usec_round`."""
    return (ns + 500) // 10**3


def zipkin_from_sdk(spans: list[ReadableSpan]) -> list[dict[str, Any]]:
    """SDK spans as the Python Zipkin JSON exporter (protocol v2) encodes them.

    As `opentelemetry.exporter.zipkin.encoder`: tags are the span's attributes then the
    resource's, the scope under both `otel.library.*` and `otel.scope.*` (a missing version is
    null), `otel.status_code` and `error` (the description, "" without one) unless unset, an
    event as the annotation `{"name": {attributes}}`; `kind` is null for an internal span,
    `debug` is set on a sampled one, `parentId` comes last. Links are not encoded.
    """
    out = []
    kinds = {SpanKind.INTERNAL: None, SpanKind.SERVER: "SERVER", SpanKind.CLIENT: "CLIENT", SpanKind.PRODUCER: "PRODUCER",
             SpanKind.CONSUMER: "CONSUMER"}  # fmt: skip
    for s in spans:
        ctx = s.get_span_context()
        assert ctx is not None and s.start_time is not None and s.end_time is not None
        tags: dict[str, Any] = {k: zipkin_tag(v) for k, v in (s.attributes or {}).items()}
        tags.update({k: zipkin_tag(v) for k, v in s.resource.attributes.items()})
        scope = s.instrumentation_scope
        if scope is not None:
            tags.update({"otel.library.name": scope.name, "otel.library.version": scope.version,
                         "otel.scope.name": scope.name, "otel.scope.version": scope.version})  # fmt: skip
        if s.status.status_code is not StatusCode.UNSET:
            tags["otel.status_code"] = s.status.status_code.name
            if s.status.status_code is StatusCode.ERROR:
                tags["error"] = s.status.description or ""
        encoded: dict[str, Any] = {
            "traceId": format(ctx.trace_id, "032x"), "id": format(ctx.span_id, "016x"), "name": s.name,
            "timestamp": usec(s.start_time), "duration": usec(s.end_time - s.start_time),
            "localEndpoint": {"serviceName": s.resource.attributes["service.name"]}, "kind": kinds[s.kind], "tags": tags,
        }  # fmt: skip
        if s.events:
            encoded["annotations"] = [{"timestamp": usec(e.timestamp), "value": json.dumps({e.name: dict(e.attributes or {})}, sort_keys=True)}
                                      for e in s.events]  # fmt: skip
        if ctx.trace_flags.sampled:
            encoded["debug"] = True
        if s.parent is not None:
            encoded["parentId"] = format(s.parent.span_id, "016x")
        out.append(encoded)
    return out


def sdk_spans() -> list[ReadableSpan]:
    """A FastAPI-like request: SQLAlchemy connect and query, an httpx LLM call that fails with an event, an internal step."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "chat-api", "service.instance.id": "i-1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fastapi = provider.get_tracer("opentelemetry.instrumentation.fastapi", "0.48b0")
    sqlalchemy = provider.get_tracer("opentelemetry.instrumentation.sqlalchemy", "0.48b0")
    httpx = provider.get_tracer("opentelemetry.instrumentation.httpx")
    t0 = T0 + 789
    root = fastapi.start_span("GET /v1/chat", kind=SpanKind.SERVER, start_time=t0,
                              attributes={"http.route": "/v1/chat", "http.request.method": "GET", "http.response.status_code": 200})  # fmt: skip
    root.set_status(Status(StatusCode.OK))
    in_root = trace_api.set_span_in_context(root)
    connect = sqlalchemy.start_span("connect", in_root, SpanKind.CLIENT, {"db.system.name": "postgresql"}, start_time=t0 + 1_000_501)
    connect.end(t0 + 2_999_999)
    select = sqlalchemy.start_span("SELECT chat", in_root, SpanKind.CLIENT, start_time=t0 + 3_000_000,
                                   attributes={"db.system.name": "postgresql", "db.query.text": "SELECT 1", "server.port": 5432})  # fmt: skip
    select.end(t0 + 8_000_000)
    llm = httpx.start_span("POST", in_root, SpanKind.CLIENT, start_time=t0 + 10_000_000,
                           attributes={"http.request.method": "POST", "url.full": "https://api.openai.com/v1/chat/completions",
                                       "http.response.status_code": 500, "gen_ai.usage.output_tokens": 12,
                                       "gen_ai.response.time_to_first_chunk": 0.25, "retry": True, "tags": ["a", "b"]})  # fmt: skip
    llm.add_event("exception", {"exception.type": "httpx.HTTPStatusError", "exception.escaped": False}, timestamp=t0 + 150_000_000)
    llm.set_status(Status(StatusCode.ERROR))
    llm.end(t0 + 160_000_000)
    step = fastapi.start_span("render", in_root, start_time=t0 + 160_000_000)
    step.end(t0 + 160_000_400)  # under a microsecond: the exporter writes a duration of 0
    root.end(t0 + 200_000_000)
    provider.shutdown()
    return list(exporter.get_finished_spans())


def test_spans_from_the_sdk_as_the_zipkin_json_exporter_encodes_them(tmp_path: Path) -> None:
    spans = sdk_spans()
    read = read_zipkin_json(write(tmp_path / "sdk.json", zipkin_from_sdk(spans)))
    assert read.warnings == [] and read.documents == 1
    expected = []
    for s in spans:
        ctx = s.get_span_context()
        assert ctx is not None and s.start_time is not None and s.end_time is not None
        start = usec(s.start_time) * 1000
        # every attribute comes back as text but for the numeric ones latprof reads; the resource's ride along as tags
        attrs: dict[str, Any] = {k: zipkin_tag(v) for k, v in (s.attributes or {}).items()}
        for key in ("http.response.status_code", "server.port", "gen_ai.usage.output_tokens", "gen_ai.response.time_to_first_chunk"):
            if key in attrs:
                attrs[key] = (s.attributes or {})[key]
        attrs.update({k: zipkin_tag(v) for k, v in s.resource.attributes.items()})
        events = tuple(SpanEvent(e.name, usec(e.timestamp) * 1000, dict(e.attributes or {})) for e in s.events)
        expected.append(Span(
            format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"), None if s.parent is None else format(s.parent.span_id, "016x"),
            s.name, KIND_NAMES[s.kind.name.lower()], start, start + usec(s.end_time - s.start_time) * 1000, "chat-api",
            s.instrumentation_scope.name if s.instrumentation_scope else "", attrs, STATUS_NAMES[s.status.status_code.name],
            events, (), {"service.name": "chat-api"},
        ))  # fmt: skip
    assert read.spans == expected
    spans_by_name = {s.name: s for s in read.spans}
    llm = spans_by_name["POST"]
    assert llm.status_code == STATUS_ERROR and llm.attrs["retry"] == "true" and llm.attrs["tags"] == '["a","b"]'
    assert type(llm.attrs["gen_ai.response.time_to_first_chunk"]) is float and type(llm.attrs["gen_ai.usage.output_tokens"]) is int
    assert spans_by_name["GET /v1/chat"].status_code == STATUS_OK and spans_by_name["render"].kind == KIND_INTERNAL
    assert spans_by_name["render"].duration_ns == 0


# --- ids, tags, annotations, endpoints, status -------------------------------------------------


def test_ids_are_lowercased_and_left_padded(tmp_path: Path) -> None:
    spans = [
        zspan("ABCDEF0123456789", trace="0AF7651916CD43DD"),
        zspan("f067aa0ba902b7", "ABCDEF0123456789", trace="af7651916cd43dd"),
        zspan("1", parent="0000000000000000", trace=TRACE),  # zeros: a root
        zspan("2", parent="", trace=TRACE),
    ]
    read = read_zipkin_json(write(tmp_path / "t.json", spans))
    assert [(s.trace_id, s.span_id, s.parent_id) for s in read.spans] == [
        ("00000000000000000af7651916cd43dd", "abcdef0123456789", None),
        ("00000000000000000af7651916cd43dd", "00f067aa0ba902b7", "abcdef0123456789"),
        (TRACE, "0000000000000001", None),
        (TRACE, "0000000000000002", None),
    ]
    assert read.spans[0].trace_id is read.spans[1].trace_id


def test_numeric_attributes_read_back_from_text_and_other_tags_kept(tmp_path: Path) -> None:
    tags: dict[str, Any] = {
        "http.response.status_code": "503", "http.status_code": "200", "server.port": "5432", "net.peer.port": "443",
        "gen_ai.usage.input_tokens": "100", "gen_ai.usage.output_tokens": "-1", "gen_ai.response.time_to_first_chunk": "0.125",
        "http.route": "/chat", "user.id": "42", "flag": "true",
        # unreadable numbers stay text
        "client.port": "80 ", "rpc.grpc.status_code": "1_0", "gen_ai.request.temperature": "NaN",
        # not Zipkin's (tags are text), but kept when scalar
        "n": 7, "ratio": 0.5, "ok": False,
        # dropped
        "list": [1], "map": {"a": 1}, "none": None,
    }  # fmt: skip
    path = write(tmp_path / "t.json", [zspan(tags=tags)])
    read = read_zipkin_json(path)
    (span,) = read.spans
    assert span.attrs == {
        "http.response.status_code": 503, "http.status_code": 200, "server.port": 5432, "net.peer.port": 443,
        "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": -1, "gen_ai.response.time_to_first_chunk": 0.125,
        "http.route": "/chat", "user.id": "42", "flag": "true", "client.port": "80 ", "rpc.grpc.status_code": "1_0",
        "gen_ai.request.temperature": "NaN", "n": 7, "ratio": 0.5, "ok": False,
    }  # fmt: skip
    assert read.warnings == [f"{path}: dropped 2 tag(s) whose value is not a string, number or boolean"]  # null: silently


def test_status_and_scope_from_tags_dropped_from_attributes(tmp_path: Path) -> None:
    spans = [
        zspan("1111111111111111", tags={"otel.status_code": "OK", "otel.scope.name": "s1", "otel.scope.version": "1"}),
        zspan("2222222222222222", tags={"otel.status_code": "ERROR", "error": ""}),  # the Python exporter without a description
        zspan("3333333333333333", tags={"error": "connection refused"}),  # Zipkin's: the tag's presence is the error
        zspan("4444444444444444", tags={"otel.status_code": "OK", "error": "boom"}),
        zspan("5555555555555555", tags={"error": "false", "otel.library.name": "old", "otel.library.version": "0.1"}),
        zspan("6666666666666666", tags={"otel.status_code": "error", "otel.scope.name": "new", "otel.library.name": "old"}),
        zspan("7777777777777777", tags={"otel.status_code": "SOMETIMES", "keep": "me"}),
        zspan("8888888888888888", tags={"otel.status_description": "x", "otel.status_code": "UNSET"}),
    ]  # fmt: skip
    path = write(tmp_path / "t.json", spans)
    read = read_zipkin_json(path)
    assert [(s.status_code, s.scope) for s in read.spans] == [
        (STATUS_OK, "s1"), (STATUS_ERROR, ""), (STATUS_ERROR, ""), (STATUS_ERROR, ""), (STATUS_UNSET, "old"),
        (STATUS_ERROR, "new"), (STATUS_UNSET, ""), (STATUS_UNSET, ""),
    ]  # fmt: skip
    assert [s.attrs for s in read.spans] == [NO_ATTRS] * 6 + [{"keep": "me"}, NO_ATTRS]
    assert read.warnings == [f"{path}: read 1 span(s) with an unknown otel.status_code as unset"]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("SERVER", KIND_SERVER), ("CLIENT", KIND_CLIENT), ("PRODUCER", KIND_PRODUCER), ("CONSUMER", KIND_CONSUMER),
     (None, KIND_INTERNAL), ("client", KIND_CLIENT)],
)  # fmt: skip
def test_kind(tmp_path: Path, kind: str | None, expected: int) -> None:
    read = read_zipkin_json(write(tmp_path / "t.json", [zspan(kind=kind)]))
    assert read.spans[0].kind == expected and read.warnings == []


def test_kind_null_is_internal_and_an_unknown_kind_unspecified(tmp_path: Path) -> None:
    null_kind = zspan("1111111111111111", kind=None)
    null_kind["kind"] = None  # as the Python exporter writes an internal span
    path = write(tmp_path / "t.json", [null_kind, zspan("2222222222222222", kind="SIDEWAYS")])
    read = read_zipkin_json(path)
    assert [s.kind for s in read.spans] == [KIND_INTERNAL, KIND_UNSPECIFIED]
    assert read.warnings == [f"{path}: read 1 span(s) with an unknown kind as unspecified"]


def test_remote_endpoint_of_a_client_span_is_the_server_it_called(tmp_path: Path) -> None:
    remote = {"serviceName": "postgres", "ipv4": "10.0.0.9", "port": 5432}
    spans = [
        zspan("1111111111111111", kind="CLIENT", remoteEndpoint=remote),
        zspan("2222222222222222", kind="PRODUCER", remoteEndpoint={"ipv6": "2001:db8::1", "port": 70000}),
        zspan("3333333333333333", kind="CLIENT", remoteEndpoint=remote, tags={"server.address": "db.internal", "server.port": "6432"}),
        zspan("4444444444444444", kind="SERVER", remoteEndpoint=remote),  # the caller: not a server address
        zspan("5555555555555555", kind="CLIENT", remoteEndpoint={}),
    ]
    read = read_zipkin_json(write(tmp_path / "t.json", spans))
    assert [s.attrs for s in read.spans] == [
        {"server.address": "10.0.0.9", "server.port": 5432, "peer.service": "postgres"},
        {"server.address": "2001:db8::1"},
        {"server.address": "db.internal", "server.port": 6432, "peer.service": "postgres"},
        NO_ATTRS,
        NO_ATTRS,
    ]


def test_annotations_become_events_with_the_attributes_exporters_encode(tmp_path: Path) -> None:
    annotations: list[Any] = [
        {"timestamp": T0_US + 1, "value": "ws"},
        # opentelemetry-exporter-zipkin-json: {"name": {attributes}} as JSON
        {"timestamp": T0_US + 2, "value": '{"exception": {"exception.escaped": false, "exception.type": "ValueError"}}'},
        # the OpenTelemetry Collector's zipkin exporter: name|{attributes}|dropped count
        {"timestamp": T0_US + 3, "value": 'gen_ai.content.completion|{"gen_ai.completion":"hi","n":2}|0'},
        {"timestamp": T0_US + 4, "value": "{not json}"},
        {"timestamp": T0_US + 5, "value": '{"a": 1, "b": 2}'},
        {"timestamp": T0_US + 6, "value": "a|b|3"},
        {"timestamp": T0_US + 7},
        {"timestamp": "1700000000123456", "value": "text time"},
        {"value": "no time"},
        "not an object",
    ]
    path = write(tmp_path / "t.json", [zspan(annotations=annotations)])
    read = read_zipkin_json(path)
    assert read.spans[0].events == (
        SpanEvent("ws", T0 + 1000),
        SpanEvent("exception", T0 + 2000, {"exception.escaped": False, "exception.type": "ValueError"}),
        SpanEvent("gen_ai.content.completion", T0 + 3000, {"gen_ai.completion": "hi", "n": 2}),
        SpanEvent("{not json}", T0 + 4000),
        SpanEvent('{"a": 1, "b": 2}', T0 + 5000),
        SpanEvent("a|b|3", T0 + 6000),
    )
    assert read.warnings == [f"{path}: dropped 4 annotation(s) without a readable timestamp and string value"]


def test_a_repeated_id_keeps_the_first_span(tmp_path: Path) -> None:
    spans = [zspan(ROOT_ID), zspan(CHILD_ID, ROOT_ID, kind="CLIENT"), zspan(CHILD_ID, ROOT_ID, shared=True),
             zspan(CHILD_ID, ROOT_ID, kind="CLIENT", name="again"), zspan(CHILD_ID, ROOT_ID, trace=TRACE2)]  # fmt: skip
    path = write(tmp_path / "t.json", [spans[:3], spans[3:]])
    read = read_zipkin_json(path)
    assert [(s.trace_id, s.span_id, s.kind) for s in read.spans] == [(TRACE, ROOT_ID, KIND_SERVER), (TRACE, CHILD_ID, KIND_CLIENT),
                                                                     (TRACE2, CHILD_ID, KIND_SERVER)]  # fmt: skip
    assert read.warnings == [f"{path}: skipped 2 span(s) whose id repeats within their trace (1 marked shared: a server span"
                             " reusing its client's id, B3 style); kept the first of each"]  # fmt: skip


def test_a_span_without_a_duration_is_zero_length(tmp_path: Path) -> None:
    """Zipkin writes no duration for an incomplete span, nor for one under a microsecond (the exporter rounds it to 0)."""
    span = zspan(CHILD_ID, ROOT_ID)
    del span["duration"]
    path = write(tmp_path / "t.json", [zspan(ROOT_ID), span])
    read = read_zipkin_json(path)
    assert read.spans[1].start_ns == read.spans[1].end_ns == T0
    assert read.warnings == [f"{path}: read 1 span(s) without a duration (incomplete, or under 1 us) as zero-length"]


def test_services_share_one_resource_each(tmp_path: Path) -> None:
    spans = [zspan(ROOT_ID), zspan(CHILD_ID, ROOT_ID, service="db"), zspan(GRANDCHILD_ID, CHILD_ID, trace=TRACE2),
             zspan("1111111111111111", service=None), zspan("2222222222222222", localEndpoint={"ipv4": "10.0.0.1"})]  # fmt: skip
    read = read_zipkin_json(write(tmp_path / "t.json", spans))
    a, b, c, d, e = read.spans
    assert a.resource is c.resource and a.resource == {"service.name": "chat-api"} and b.resource == {"service.name": "db"}
    assert (d.service, d.resource, e.service, e.resource) == ("", NO_ATTRS, "", NO_ATTRS)


# --- shapes of file ----------------------------------------------------------------------


def test_pretty_printed_json_lines_and_gzip(tmp_path: Path) -> None:
    expected = [ROOT_ID, CHILD_ID, GRANDCHILD_ID]
    for gz in (False, True):
        path = write(tmp_path / f"p{gz}.json", three_spans(), gz=gz, indent=True)
        assert [s.span_id for s in read_zipkin_json(path).spans] == expected
    first, second, third = (orjson.dumps([s]) for s in three_spans())
    path = tmp_path / "t.jsonl"
    path.write_bytes(first + b"\n" + second + b"\n\n" + third[:40] + b"\n")
    read = read_zipkin_json(path)
    assert [s.span_id for s in read.spans] == [ROOT_ID, CHILD_ID] and read.documents == 2
    (warning,) = read.warnings
    assert warning.startswith(f"{path}:4: skipped a torn last line (not valid JSON:")
    path.write_bytes(first + b"\n" + third[:40] + b"\n" + second + b"\n")
    with pytest.raises(InputError, match=rf"^{path}:2: malformed line \(not valid JSON: .*\); the file is damaged before its end$"):
        read_zipkin_json(path)


def test_truncated_gzip(tmp_path: Path) -> None:
    one = gzip.compress(json.dumps(three_spans() * 50, indent=2).encode())
    path = tmp_path / "one.json"
    path.write_bytes(one[: len(one) // 2])
    with pytest.raises(InputError, match=rf"^{path}: compressed stream is truncated or damaged \("):
        read_zipkin_json(path)


# --- damage and wrong input ------------------------------------------------------------------


def test_unreadable_spans_are_skipped_and_counted_once_per_reason(tmp_path: Path) -> None:
    spans: list[Any] = [
        zspan(ROOT_ID),  # the one good span
        zspan("2222222222222222", start="1700000000123456"),
        zspan("3333333333333333", duration=-5),
        zspan("4444444444444444", start=0),
        zspan("5555555555555555", duration="10"),
        zspan("zz22222222222222"),
        zspan("0000000000000000"),
        zspan("12345678901234567"),
        zspan("6666666666666666", trace="0" * 32),
        zspan("7777777777777777", trace="abc-"),
        zspan("8888888888888888", parent="not-an-id"),
        zspan("9999999999999999", name=7),
        zspan("aaaaaaaaaaaaaaaa", kind=3),
        zspan("bbbbbbbbbbbbbbbb", localEndpoint="frontend"),
        zspan("cccccccccccccccc", localEndpoint={"serviceName": 5}),
        zspan("dddddddddddddddd", remoteEndpoint=[1]),
        zspan("eeeeeeeeeeeeeeee", tags=[["k", "v"]]),
        zspan("ffffffffffffffff", annotations={"timestamp": 1}),
        zspan("1212121212121212", parentId=5),
        "not a span",
        7,
    ]  # fmt: skip
    del spans[4]["timestamp"]
    path = write(tmp_path / "bad.json", [spans])
    read = read_zipkin_json(path)
    assert [s.span_id for s in read.spans] == [ROOT_ID]
    assert sorted(read.warnings) == sorted(f"{path}: {w}" for w in [
        "skipped 3 span(s) without a readable timestamp",
        "skipped 1 span(s) with a negative duration",
        "skipped 3 span(s) without a valid id",
        "skipped 2 span(s) without a valid traceId",
        "skipped 2 span(s) with an invalid parentId",
        "skipped 1 span(s) whose name is not a string",
        "skipped 1 span(s) whose kind is not a string",
        "skipped 2 span(s) whose localEndpoint is not an object with a string serviceName",
        "skipped 1 span(s) whose remoteEndpoint is not an object",
        "skipped 1 span(s) whose tags is not an object",
        "skipped 1 span(s) whose annotations is not a list",
        "skipped 2 span(s) that are not objects",
    ])  # fmt: skip
    spans = [zspan(ROOT_ID), zspan(CHILD_ID, duration="10")]
    path = write(tmp_path / "bad2.json", spans)
    assert read_zipkin_json(path).warnings == [f"{path}: skipped 1 span(s) whose duration is not a number"]


def test_nothing_readable_lists_the_reasons(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.json", [zspan("zz"), zspan(CHILD_ID, start=None)])
    with pytest.raises(InputError, match=rf"^{path}: Zipkin JSON file holds no readable spans: skipped 1 span\(s\) without a valid id;"
                                         r" 1 span\(s\) without a readable timestamp$"):  # fmt: skip
        read_zipkin_json(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file is empty"),
        (b"\n  \n\t\n", "file is empty"),
        (b"hello, world\nthis is a log file\n", "not Zipkin JSON spans: not JSON"),
        (CAPTURE_HEADER, r"not Zipkin JSON spans: it is a JSON object \(its keys: type, schema, source, pid\), not an array of spans"),
        (b'{"resourceSpans": []}', r"not Zipkin JSON spans: it is a JSON object \(its keys: resourceSpans\), not an array of spans"),
        (b'{"data": [{"traceID": "0af7651916cd43dd", "spans": []}]}', r"not Zipkin JSON spans: it is a JSON object \(its keys: data\)"),
        (b'[{"traceID": "0af7651916cd43dd", "spans": []}]',
         r"not Zipkin JSON spans: its first array element is not a span \(no traceId or id; its keys: traceID, spans\)"),
        (b'[{"resourceSpans": []}]', r"not Zipkin JSON spans: its first array element is not a span \(no traceId or id"),
        (b"[[1]]", "not Zipkin JSON spans: its first array element is a JSON number, not a span object"),
        (b'[{}]', r"not Zipkin JSON spans: its first array element is not a span \(no traceId or id; it is empty\)"),
        (b"7", "not Zipkin JSON spans: it starts with a JSON number, not an array of spans"),
        (b"[]", r"Zipkin JSON file holds no readable spans \(1 span list\(s\), none with spans\)"),
        (b"[[], []]", r"Zipkin JSON file holds no readable spans \(2 span list\(s\), none with spans\)"),
        (b'[{"traceId": "0af7651916cd43dd", "id": "b7ad6b7169203331", "timestamp": ', "truncated or not valid JSON: "),
        (b'\xef\xbb\xbf[{"traceId": "0af7651916cd43dd", "id": "x"}]',
         r"Zipkin JSON file holds no readable spans: skipped 1 span\(s\) without a valid id"),
        (b"\x1f\x8bnot really gzip", "compressed stream is truncated or damaged"),
        (b'[{"name": "\xff"}]', "truncated or not valid JSON: str is not valid UTF-8"),
    ],
    ids=["empty", "blank", "text", "capture", "otlp", "jaeger", "jaeger-traces", "otlp-array", "numbers", "empty-object",
         "number", "empty-array", "empty-traces", "truncated", "bom-bad-id", "bad-gzip", "not-utf8"],
)  # fmt: skip
def test_bad_files_are_one_line_input_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match=rf"^{path}: {message}") as caught:
        read_zipkin_json(path)
    assert "\n" not in str(caught.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=rf"^{tmp_path / 'nope.json'}: cannot open: No such file"):
        read_zipkin_json(tmp_path / "nope.json")
    with pytest.raises(InputError, match=rf"^{tmp_path}: is a directory"):
        read_zipkin_json(tmp_path)


def _mutations(doc: Any, rng: random.Random, count: int) -> list[Any]:
    """`count` copies of `doc`, each with one value somewhere replaced by junk of another type, or one key deleted."""
    junk = [None, 0, -1, 7, 2.5, -2.5, 1e300, 2**64 - 1, True, False, "", "x", " 5", "NaN", "true", "false", "0" * 16, "A" * 32,
            "CLIENT", "SERVER", "ERROR", "OK", "{}", '{"e": {"a": 1}}', "n|{}|0", [], [1], [None], {}, {"a": 1},
            {"serviceName": 3}, {"timestamp": 1, "value": "v"}, "1700000000123456"]  # fmt: skip
    return mutations(doc, rng, count, junk)


def _check_outcome(path: Path) -> str:
    """Read `path`: a result whose warnings are one line each and name the file, or such an InputError; nothing else."""
    try:
        read = read_zipkin_json(path)
    except InputError as exc:
        assert str(exc).startswith(f"{path}") and "\n" not in str(exc)
        return "error"
    assert read.spans and all(w.startswith(f"{path}") and "\n" not in w for w in read.warnings)
    for span in read.spans:
        assert len(span.trace_id) == 32 and len(span.span_id) == 16 and span.start_ns <= span.end_ns
        assert type(span.kind) is int and type(span.status_code) is int and type(span.name) is str
    return "read"


def fuzz_base() -> list[Any]:
    return [orjson.loads(API_TRACE), zipkin_from_sdk(sdk_spans()), three_spans()]


def test_junk_anywhere_is_read_or_an_input_error(tmp_path: Path) -> None:
    rng = random.Random(5)
    outcomes: dict[str, int] = {}
    for i, doc in enumerate(_mutations(fuzz_base(), rng, 500)):
        outcome = _check_outcome(write(tmp_path / f"m{i}.json", doc))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes["read"] > 400 and outcomes["error"] >= 1  # both outcomes were exercised


def test_corrupt_bytes_are_read_or_an_input_error(tmp_path: Path) -> None:
    rng = random.Random(13)
    data = orjson.dumps(fuzz_base())
    lines = b"\n".join(orjson.dumps(trace) for trace in fuzz_base()) + b"\n"
    outcomes: dict[str, int] = {}
    for i in range(300):
        raw = damaged([data, lines, gzip.compress(data, mtime=0)][i % 3], rng)
        path = tmp_path / f"c{i}.json"
        path.write_bytes(raw)
        outcome = _check_outcome(path)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes["read"] > 20 and outcomes["error"] > 20


def test_many_spans_read_in_linear_time(tmp_path: Path) -> None:
    spans = [zspan(f"{i:016x}", parent=f"{i - 1:016x}" if i > 1 else None, tags={"http.status_code": "200", "i": str(i)},
                   annotations=[{"timestamp": T0_US, "value": "ws"}]) for i in range(1, 30_001)]  # fmt: skip
    read = read_zipkin_json(write(tmp_path / "big.json", spans))
    assert len(read.spans) == 30_000 and read.spans[-1].parent_id == f"{29_999:016x}"
    assert len({id(s.resource) for s in read.spans}) == 1 and len({id(s.events[0].name) for s in read.spans}) == 1


# --- sniff ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        b'[{"traceId":"0af7651916cd43dd","parentId":"b7ad6b7169203331","id":"00f067aa0ba902b7","kind":"CLIENT"',
        b'[\n  {\n    "traceId": "0af7651916cd43dd8448eb211c80319c",\n    "id": "b7ad6b7169203331",\n',
        b'\xef\xbb\xbf[[{"traceId": "0af7651916cd43dd", "id": "b7ad6b7169203331"}], [',
        b'[{"id":"b7ad6b7169203331","traceId":"0af7651916cd43dd","name":"x","tags":{"traceID":"a tag named so"}}]',
        b'[ [ {"traceId": "0af7651916cd43dd", "name": "get", "id": "b7ad',
        b'[{"traceId":"0af7651916cd43dd","id":"b7ad6b7169203331","tags":{"spans":"3","processes":"2"}}]',
    ],
    ids=["compact", "pretty", "bom-traces", "tag-traceID", "spaced-traces", "tags-spans-processes"],
)
def test_sniff_true(head: bytes) -> None:
    assert sniff(head)


@pytest.mark.parametrize(
    "head",
    [
        CAPTURE_HEADER,
        b'{"type":"header","schema":"latprof.capture/1","traceId":"x","id":"y"}',
        b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad"',
        b'[{"resourceSpans": []}]',
        b'[{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203331","name":"x","attributes":[{"key":"id"',
        b'{"data":[{"traceID":"0af7651916cd43dd","spans":[{"traceID":"0af7651916cd43dd","spanID":"b7ad6b7169203331"',
        b'[{"traceID":"0af7651916cd43dd","spans":[],"processes":{}}]',
        b'{"traceId": "0af7651916cd43dd", "id": "b7ad6b7169203331"}',
        b"[]",
        b'["traceId", "id"]',
        b"",
        b"\x1f\x8b\x08\x00",
    ],
    ids=["capture", "capture-with-keys", "otlp", "otlp-array", "otlp-spans", "jaeger", "jaeger-traces", "bare-span", "empty-array",
         "strings", "empty", "gzip"],
)  # fmt: skip
def test_sniff_false(head: bytes) -> None:
    assert not sniff(head)


def test_each_format_sniffs_as_its_own_only(tmp_path: Path) -> None:
    for head in [API_TRACE.encode(), orjson.dumps(zipkin_from_sdk(sdk_spans())), orjson.dumps([three_spans(), three_spans()]),
                 ZIPKIN_TRACE.encode()]:  # fmt: skip
        assert sniff(head) and not jaeger_json.sniff(head) and not otlp_json.sniff(head)
    assert jaeger_json.sniff(JAEGER_TRACE.encode()) and not sniff(JAEGER_TRACE.encode())
    for path in OTLP_FIXTURES.glob("*.otlp.json"):
        head = path.read_bytes()[: 64 * 1024]
        assert otlp_json.sniff(head) and not sniff(head)
    for path in sorted((ROOT / "examples").rglob("*.jsonl.gz"))[:3]:
        assert not sniff(gzip.decompress(path.read_bytes())[: 64 * 1024])


# --- one trace, two formats, the same requests and layers ---------------------------------------

# A FastAPI service (chat-api) reading the database through SQLAlchemy and calling its LLM through
# httpx; an LLM proxy (llm-proxy) serves the call. The same spans written by each format's
# published shape: Jaeger's query API (the Collector's OpenTelemetry mapping) and Zipkin (the
# OpenTelemetry Zipkin exporter's mapping).
JAEGER_TRACE = """{"data": [{"traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spans": [
  {"traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "a000000000000001", "operationName": "GET /v1/chat", "references": [],
   "startTime": 1700000000000000, "duration": 300000, "processID": "p1", "warnings": null, "logs": [],
   "tags": [{"key": "otel.scope.name", "type": "string", "value": "opentelemetry.instrumentation.fastapi"},
            {"key": "http.route", "type": "string", "value": "/v1/chat"},
            {"key": "http.request.method", "type": "string", "value": "GET"},
            {"key": "http.response.status_code", "type": "int64", "value": 200},
            {"key": "span.kind", "type": "string", "value": "server"}]},
  {"traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "a000000000000002", "operationName": "connect",
   "references": [{"refType": "CHILD_OF", "traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "a000000000000001"}],
   "startTime": 1700000000001000, "duration": 40000, "processID": "p1", "warnings": null, "logs": [],
   "tags": [{"key": "otel.scope.name", "type": "string", "value": "opentelemetry.instrumentation.sqlalchemy"},
            {"key": "db.system.name", "type": "string", "value": "postgresql"},
            {"key": "span.kind", "type": "string", "value": "client"}]},
  {"traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "a000000000000003", "operationName": "SELECT chat",
   "references": [{"refType": "CHILD_OF", "traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "a000000000000001"}],
   "startTime": 1700000000041000, "duration": 9000, "processID": "p1", "warnings": null, "logs": [],
   "tags": [{"key": "otel.scope.name", "type": "string", "value": "opentelemetry.instrumentation.sqlalchemy"},
            {"key": "db.system.name", "type": "string", "value": "postgresql"},
            {"key": "db.query.text", "type": "string", "value": "SELECT * FROM chat WHERE id = %(id)s"},
            {"key": "server.port", "type": "int64", "value": 5432},
            {"key": "span.kind", "type": "string", "value": "client"}]},
  {"traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "a000000000000004", "operationName": "POST",
   "references": [{"refType": "CHILD_OF", "traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "a000000000000001"}],
   "startTime": 1700000000052000, "duration": 180000, "processID": "p1", "warnings": null, "logs": [],
   "tags": [{"key": "otel.scope.name", "type": "string", "value": "opentelemetry.instrumentation.httpx"},
            {"key": "http.request.method", "type": "string", "value": "POST"},
            {"key": "url.full", "type": "string", "value": "http://llm-proxy:8080/v1/chat/completions"},
            {"key": "http.response.status_code", "type": "int64", "value": 200},
            {"key": "span.kind", "type": "string", "value": "client"}]},
  {"traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "b000000000000001", "operationName": "POST /v1/chat/completions",
   "references": [{"refType": "CHILD_OF", "traceID": "4bf92f3577b34da6a3ce929d0e0e4736", "spanID": "a000000000000004"}],
   "startTime": 1700000000053000, "duration": 175000, "processID": "p2", "warnings": null, "logs": [],
   "tags": [{"key": "otel.scope.name", "type": "string", "value": "opentelemetry.instrumentation.fastapi"},
            {"key": "http.route", "type": "string", "value": "/v1/chat/completions"},
            {"key": "span.kind", "type": "string", "value": "server"}]}
 ],
 "processes": {"p1": {"serviceName": "chat-api", "tags": [{"key": "service.instance.id", "type": "string", "value": "i-1"}]},
               "p2": {"serviceName": "llm-proxy", "tags": []}},
 "warnings": null}], "total": 0, "limit": 0, "offset": 0, "errors": null}
"""

ZIPKIN_TRACE = """[
 {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "id": "a000000000000001", "name": "GET /v1/chat", "timestamp": 1700000000000000,
  "duration": 300000, "localEndpoint": {"serviceName": "chat-api"}, "kind": "SERVER", "debug": true,
  "tags": {"http.route": "/v1/chat", "http.request.method": "GET", "http.response.status_code": "200", "service.instance.id": "i-1",
           "otel.library.name": "opentelemetry.instrumentation.fastapi", "otel.library.version": null}},
 {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "id": "a000000000000002", "name": "connect", "timestamp": 1700000000001000,
  "duration": 40000, "localEndpoint": {"serviceName": "chat-api"}, "kind": "CLIENT",
  "tags": {"db.system.name": "postgresql", "otel.library.name": "opentelemetry.instrumentation.sqlalchemy"},
  "parentId": "a000000000000001"},
 {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "id": "a000000000000003", "name": "SELECT chat", "timestamp": 1700000000041000,
  "duration": 9000, "localEndpoint": {"serviceName": "chat-api"}, "kind": "CLIENT",
  "tags": {"db.system.name": "postgresql", "db.query.text": "SELECT * FROM chat WHERE id = %(id)s", "server.port": "5432",
           "otel.library.name": "opentelemetry.instrumentation.sqlalchemy"},
  "parentId": "a000000000000001"},
 {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "id": "a000000000000004", "name": "POST", "timestamp": 1700000000052000,
  "duration": 180000, "localEndpoint": {"serviceName": "chat-api"}, "kind": "CLIENT",
  "tags": {"http.request.method": "POST", "url.full": "http://llm-proxy:8080/v1/chat/completions",
           "http.response.status_code": "200", "otel.library.name": "opentelemetry.instrumentation.httpx"},
  "parentId": "a000000000000001"},
 {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "id": "b000000000000001", "name": "POST /v1/chat/completions",
  "timestamp": 1700000000053000, "duration": 175000, "localEndpoint": {"serviceName": "llm-proxy"}, "kind": "SERVER",
  "tags": {"http.route": "/v1/chat/completions", "otel.scope.name": "opentelemetry.instrumentation.fastapi"},
  "parentId": "a000000000000004"}
]
"""


def test_one_trace_in_jaeger_and_zipkin_json_maps_to_the_same_requests_and_layers(tmp_path: Path) -> None:
    (tmp_path / "jaeger.json").write_text(JAEGER_TRACE)
    (tmp_path / "zipkin.json").write_text(ZIPKIN_TRACE)
    from_jaeger = read_jaeger_json(tmp_path / "jaeger.json")
    from_zipkin = read_zipkin_json(tmp_path / "zipkin.json")
    assert from_jaeger.warnings == [] and from_zipkin.warnings == []
    fields = [(s.trace_id, s.span_id, s.parent_id, s.name, s.kind, s.start_ns, s.end_ns, s.service, s.scope, s.status_code)
              for s in from_jaeger.spans]  # fmt: skip
    assert fields == [(s.trace_id, s.span_id, s.parent_id, s.name, s.kind, s.start_ns, s.end_ns, s.service, s.scope, s.status_code)
                      for s in from_zipkin.spans]  # fmt: skip
    events = [map_spans(from_jaeger.spans), map_spans(from_zipkin.spans)]
    for mapped in events:
        assert mapped.warnings == []
        (request,) = mapped.requests
        assert (request.request_id, request.route, request.start_ns, request.end_ns, request.status_code) == (
            "4bf92f3577b34da6a3ce929d0e0e4736", "GET /v1/chat", 1_700_000_000_000_000_000, 1_700_000_000_300_000_000, 200)
    jaeger_segments, zipkin_segments = (
        sorted((s.segment_id, s.parent_id, s.name, s.layer, s.start_ns, s.end_ns) for s in m.segments_by_request[m.requests[0].request_id])
        for m in events
    )  # fmt: skip
    assert jaeger_segments == zipkin_segments
    layers = {segment_id: layer for segment_id, _, _, layer, _, _ in jaeger_segments}
    assert layers == {"a000000000000002": DB_POOL, "a000000000000003": DB_QUERY, "a000000000000004": PROVIDER,
                      "b000000000000001": None}  # fmt: skip
    assert events[0].requests[0].pid == events[1].requests[0].pid == 1
