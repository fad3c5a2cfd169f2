"""The OTLP JSON trace reader: every accepted shape from real encoders, real files, and every kind of bad input."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import random
from pathlib import Path
from typing import Any

import orjson
from fuzzing import mutations
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from latprof.collectors.traces import otlp_json
from latprof.collectors.traces.otlp_json import OtlpRead, read_otlp_json, sniff
from latprof.errors import InputError
from latprof.events import NO_ATTRS
from latprof.collectors.traces.spans import (
    KIND_CLIENT,
    KIND_INTERNAL,
    KIND_SERVER,
    KIND_UNSPECIFIED,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNSET,
    Span,
    SpanEvent,
    SpanLink,
)

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "otlp"  # real traces from outside the project (its README.md)
T0 = 1_764_000_000_000_000_000
MS = 1_000_000
TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACE2 = "4bf92f3577b34da6a3ce929d0e0e4736"
ROOT_ID = "b7ad6b7169203331"
CHILD_ID = "00f067aa0ba902b7"
GRANDCHILD_ID = "53995c3f42cd8ad8"


# --- documents built by hand, as the Collector's file exporter writes them ----------------


def kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def span(span_id: str = ROOT_ID, parent: str | None = None, trace: str = TRACE, name: str = "GET /x", kind: Any = 2,
         start: Any = None, end: Any = None, attrs: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"traceId": trace, "spanId": span_id}
    if parent is not None:
        out["parentSpanId"] = parent
    out.update(flags=257, name=name, kind=kind,
               startTimeUnixNano=str(T0) if start is None else start,
               endTimeUnixNano=str(T0 + 10 * MS) if end is None else end,
               attributes=[kv(k, v) for k, v in (attrs or {}).items()], status={})  # fmt: skip
    out.update(extra)
    return out


def request(*spans: dict[str, Any], service: str | None = "chat-api", scope: str = "opentelemetry.instrumentation.fastapi",
            resource: dict[str, Any] | None = None) -> dict[str, Any]:
    resource_attrs = dict(resource or {})
    if service is not None:
        resource_attrs = {"service.name": service, **resource_attrs}
    return {"resourceSpans": [{
        "resource": {"attributes": [kv(k, v) for k, v in resource_attrs.items()]},
        "scopeSpans": [{"scope": {"name": scope, "version": "0.48b0"}, "spans": list(spans)}],
        "schemaUrl": "https://opentelemetry.io/schemas/1.11.0",
    }]}  # fmt: skip


def three_spans() -> list[dict[str, Any]]:
    """A SERVER root, a db CLIENT child and an INTERNAL grandchild, children inside their parents."""
    return [
        span(GRANDCHILD_ID, CHILD_ID, name="parse", kind=1, start=str(T0 + 3 * MS), end=str(T0 + 4 * MS)),
        span(CHILD_ID, ROOT_ID, name="SELECT users", kind=3, start=str(T0 + 2 * MS), end=str(T0 + 6 * MS),
             attrs={"db.system.name": "postgresql", "server.port": 5432}),
        span(ROOT_ID, None, name="POST /chat", kind=2, start=str(T0), end=str(T0 + 10 * MS),
             attrs={"http.route": "/chat", "http.response.status_code": 200}),
    ]  # fmt: skip


def write_lines(path: Path, *docs: Any, gz: bool = False) -> Path:
    data = b"".join(orjson.dumps(doc) + b"\n" for doc in docs)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def by_id(read: OtlpRead) -> dict[str, Span]:
    return {s.span_id: s for s in read.spans}


# --- documents from real protobuf messages, as google.protobuf.json_format writes them -----


def pb_request() -> ExportTraceServiceRequest:
    """Two resources; every AnyValue kind; events, links, error status; no NaN (compared by equality)."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=common_pb2.AnyValue(string_value="chat-api"))
    rs.resource.attributes.add(key="service.instance.id", value=common_pb2.AnyValue(string_value="i-1"))
    ss = rs.scope_spans.add()
    ss.scope.name = "opentelemetry.instrumentation.fastapi"
    ss.scope.version = "0.48b0"
    root = ss.spans.add(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(ROOT_ID), name="POST /chat",
                        kind=trace_pb2.Span.SPAN_KIND_SERVER, start_time_unix_nano=T0, end_time_unix_nano=T0 + 10 * MS)
    root.attributes.add(key="http.route", value=common_pb2.AnyValue(string_value="/chat"))
    root.attributes.add(key="http.response.status_code", value=common_pb2.AnyValue(int_value=500))
    root.attributes.add(key="sampled", value=common_pb2.AnyValue(bool_value=True))
    root.attributes.add(key="ratio", value=common_pb2.AnyValue(double_value=0.25))
    root.attributes.add(key="payload", value=common_pb2.AnyValue(bytes_value=b"\x00\x01\xff"))
    tags = common_pb2.AnyValue()
    tags.array_value.values.add(string_value="a")
    tags.array_value.values.add(int_value=2)
    root.attributes.add(key="tags", value=tags)
    nested = common_pb2.AnyValue()
    nested.kvlist_value.values.add(key="inner", value=common_pb2.AnyValue(string_value="v"))
    root.attributes.add(key="nested", value=nested)
    root.status.code = trace_pb2.Status.STATUS_CODE_ERROR
    root.status.message = "boom"
    event = root.events.add(time_unix_nano=T0 + 5 * MS, name="exception")
    event.attributes.add(key="exception.type", value=common_pb2.AnyValue(string_value="ValueError"))
    link = root.links.add(trace_id=bytes.fromhex(TRACE2), span_id=bytes.fromhex(GRANDCHILD_ID))
    link.attributes.add(key="why", value=common_pb2.AnyValue(string_value="follows"))
    child = ss.spans.add(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(CHILD_ID),
                         parent_span_id=bytes.fromhex(ROOT_ID), name="SELECT users", kind=trace_pb2.Span.SPAN_KIND_CLIENT,
                         start_time_unix_nano=T0 + 2 * MS, end_time_unix_nano=T0 + 6 * MS)
    child.status.code = trace_pb2.Status.STATUS_CODE_OK
    other = req.resource_spans.add()
    other.resource.attributes.add(key="service.name", value=common_pb2.AnyValue(string_value="worker"))
    oss = other.scope_spans.add()  # no scope name
    oss.spans.add(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(GRANDCHILD_ID), parent_span_id=bytes.fromhex(CHILD_ID),
                  name="work", start_time_unix_nano=T0 + 3 * MS, end_time_unix_nano=T0 + 4 * MS)  # kind unset
    return req


EXPECTED_ROOT = Span(
    TRACE, ROOT_ID, None, "POST /chat", KIND_SERVER, T0, T0 + 10 * MS, "chat-api", "opentelemetry.instrumentation.fastapi",
    {"http.route": "/chat", "http.response.status_code": 500, "sampled": True, "ratio": 0.25, "payload": "AAH/",
     "tags": ["a", 2], "nested": {"inner": "v"}},
    STATUS_ERROR,
    (SpanEvent("exception", T0 + 5 * MS, {"exception.type": "ValueError"}),),
    (SpanLink(TRACE2, GRANDCHILD_ID),),
    {"service.name": "chat-api", "service.instance.id": "i-1"},
)  # fmt: skip


def check_pb_spans(read: OtlpRead) -> None:
    assert read.warnings == []
    assert read.documents == 1
    root, child, work = read.spans
    assert root == EXPECTED_ROOT
    assert child == Span(TRACE, CHILD_ID, ROOT_ID, "SELECT users", KIND_CLIENT, T0 + 2 * MS, T0 + 6 * MS, "chat-api",
                         "opentelemetry.instrumentation.fastapi", NO_ATTRS, STATUS_OK, (), (), root.resource)  # fmt: skip
    assert child.resource is root.resource  # one mapping per resource
    assert work == Span(TRACE, GRANDCHILD_ID, CHILD_ID, "work", KIND_UNSPECIFIED, T0 + 3 * MS, T0 + 4 * MS, "worker", "",
                        NO_ATTRS, STATUS_UNSET, (), (), {"service.name": "worker"})  # fmt: skip


def test_protobuf_json_camel_case_with_base64_ids_and_enum_names(tmp_path: Path) -> None:
    text = json_format.MessageToJson(pb_request())  # pretty-printed, one document
    assert '"traceId": "CvdlGRbNQ92ESOshHIAxnA=="' in text and '"SPAN_KIND_SERVER"' in text  # what protobuf writes
    path = tmp_path / "pb.json"
    path.write_text(text)
    check_pb_spans(read_otlp_json(path))


def test_protobuf_json_snake_case_field_names(tmp_path: Path) -> None:
    doc = json_format.MessageToDict(pb_request(), preserving_proto_field_name=True)
    assert "resource_spans" in doc and "start_time_unix_nano" in doc["resource_spans"][0]["scope_spans"][0]["spans"][0]
    check_pb_spans(read_otlp_json(write_lines(tmp_path / "snake.json", doc)))
    (tmp_path / "snake-pretty.json").write_text(json.dumps(doc, indent=1))
    check_pb_spans(read_otlp_json(tmp_path / "snake-pretty.json"))


def test_protobuf_doubles_nan_and_infinity_are_floats(tmp_path: Path) -> None:
    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add(
        trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(ROOT_ID), name="x", start_time_unix_nano=T0, end_time_unix_nano=T0)
    for key, number in (("nan", math.nan), ("inf", math.inf), ("neg", -math.inf)):
        sp.attributes.add(key=key, value=common_pb2.AnyValue(double_value=number))
    text = json_format.MessageToJson(req)
    assert '"NaN"' in text and '"Infinity"' in text and '"-Infinity"' in text
    (tmp_path / "d.json").write_text(text)
    (got,) = read_otlp_json(tmp_path / "d.json").spans
    assert math.isnan(got.attrs["nan"]) and got.attrs["inf"] == math.inf and got.attrs["neg"] == -math.inf
    assert got.service == "" and got.resource == {} and got.duration_ns == 0


# --- the Collector's file exporter: hex ids, one request a line ------------------------------


def test_collector_file_exporter_lines(tmp_path: Path) -> None:
    first, second, third = three_spans()
    path = write_lines(tmp_path / "traces.json", request(first, second), request(third))  # the trace straddles lines
    read = read_otlp_json(path)
    assert read.documents == 2 and read.warnings == []
    spans = by_id(read)
    assert [s.span_id for s in read.spans] == [GRANDCHILD_ID, CHILD_ID, ROOT_ID]  # file order
    assert spans[ROOT_ID] == Span(TRACE, ROOT_ID, None, "POST /chat", KIND_SERVER, T0, T0 + 10 * MS, "chat-api",
                                  "opentelemetry.instrumentation.fastapi", {"http.route": "/chat", "http.response.status_code": 200},
                                  STATUS_UNSET, (), (), {"service.name": "chat-api"})  # fmt: skip
    assert spans[CHILD_ID].parent_id == ROOT_ID and spans[GRANDCHILD_ID].parent_id == CHILD_ID
    assert spans[CHILD_ID].attrs == {"db.system.name": "postgresql", "server.port": 5432}
    assert spans[GRANDCHILD_ID].kind == KIND_INTERNAL and spans[GRANDCHILD_ID].attrs is NO_ATTRS
    assert spans[CHILD_ID].resource is spans[GRANDCHILD_ID].resource  # shared within a resourceSpans
    assert spans[CHILD_ID].trace_id is spans[GRANDCHILD_ID].trace_id is spans[ROOT_ID].trace_id  # one string per trace


def test_benchmark_generator_file_reads_back(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_otlp", ROOT / "benchmarks" / "gen_otlp.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    path = tmp_path / "gen.json"
    lines = gen.generate(path, spans=1_000, spans_per_trace=10, batch_spans=64, seed=3)
    read = read_otlp_json(path)
    assert read.warnings == [] and read.documents == lines == 16 and len(read.spans) == 1_000
    traces: dict[str, list[Span]] = {}
    for s in read.spans:
        traces.setdefault(s.trace_id, []).append(s)
    assert len(traces) == 100 and {len(t) for t in traces.values()} == {10}
    for spans in traces.values():
        (root,) = [s for s in spans if s.parent_id is None]
        assert root.kind == KIND_SERVER and root.scope == "opentelemetry.instrumentation.fastapi"
        assert root.attrs["http.response.status_code"] == 200 and root.attrs["http.request.method"] == "POST"
        assert all(s.parent_id == root.span_id and root.start_ns <= s.start_ns <= s.end_ns <= root.end_ns for s in spans if s is not root)
        assert [s.name for s in spans if s.scope.endswith("sqlalchemy")][0] == "connect"
        (llm,) = [s for s in spans if s.attrs.get("url.full") == "http://127.0.0.1:8000/v1/chat/completions"]
        assert llm.kind == KIND_CLIENT and llm.attrs["server.port"] == 8000
    assert {s.resource["service.instance.id"] for s in read.spans} == {"chat-api-7d9f8-1", "chat-api-7d9f8-2"}
    assert {s.service for s in read.spans} == {"chat-api"}


def test_gzip_is_told_by_its_magic_bytes_not_its_name(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "traces.json", request(*three_spans()), gz=True)  # no .gz suffix
    read = read_otlp_json(path)
    assert len(read.spans) == 3 and read.warnings == []
    pretty = tmp_path / "pretty.otlp"
    pretty.write_bytes(gzip.compress(json.dumps(request(*three_spans()), indent=2).encode()))
    assert len(read_otlp_json(pretty).spans) == 3
    plain = write_lines(tmp_path / "plain.json.gz", request(*three_spans()))  # a .gz name, plain content
    assert len(read_otlp_json(plain).spans) == 3


def test_truncated_gzip_keeps_what_came_before_with_a_warning(tmp_path: Path) -> None:
    docs = [request(span(f"{i:016x}", trace=f"{i:032x}", attrs={"n": "x" * 50})) for i in range(1, 301)]
    data = gzip.compress(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    read = read_otlp_json(path)
    assert 0 < len(read.spans) < 300
    assert [s.span_id for s in read.spans] == [f"{i:016x}" for i in range(1, len(read.spans) + 1)]
    (warning,) = read.warnings
    assert warning.startswith(f"{path}: compressed stream is truncated or damaged after line {len(read.spans)} (")
    assert warning.endswith("; read what came before it")


def test_truncated_gzip_of_one_document_is_an_input_error(tmp_path: Path) -> None:
    data = gzip.compress(json.dumps(request(*three_spans()), indent=2).encode())
    path = tmp_path / "cut.json"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=rf"^{path}: compressed stream is truncated or damaged"):
        read_otlp_json(path)


def test_one_document_pretty_printed(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(request(*three_spans()), indent=4))
    read = read_otlp_json(path)
    assert read.documents == 1 and len(read.spans) == 3 and by_id(read)[CHILD_ID].parent_id == ROOT_ID


def test_wrapped_result_and_arrays_of_documents(tmp_path: Path) -> None:
    first, second, third = three_spans()
    wrapped = tmp_path / "v3.json"
    wrapped.write_text(json.dumps({"result": request(first, second, third)}, indent=2))  # Jaeger api/v3
    read = read_otlp_json(wrapped)
    assert read.documents == 1 and {s.span_id for s in read.spans} == {ROOT_ID, CHILD_ID, GRANDCHILD_ID}
    array = tmp_path / "array.json"
    array.write_text(json.dumps([request(first), {"result": request(second)}, request(third)]))
    read = read_otlp_json(array)
    assert read.documents == 3 and [s.span_id for s in read.spans] == [GRANDCHILD_ID, CHILD_ID, ROOT_ID]
    stream = write_lines(tmp_path / "stream.json", {"result": request(first)}, {"result": request(second, third)})
    assert read_otlp_json(stream).documents == 2


def test_hex_ids_any_case_times_as_numbers_and_enum_names(tmp_path: Path) -> None:
    spans = [
        span(ROOT_ID.upper(), trace=TRACE.upper(), kind="SPAN_KIND_SERVER", start=T0, end=T0 + 9 * MS,
             status={"code": "STATUS_CODE_ERROR", "message": "x"}),
        span(CHILD_ID, ROOT_ID.upper(), kind=3, start=str(T0 + MS), end=T0 + 2 * MS, status={"code": 1}),
        span(GRANDCHILD_ID, "", name="root too", kind=None, status=None),  # empty parent: a root
        span("1111111111111111", "0000000000000000", name="zero parent", start=float(T0), end=float(T0 + MS)),
    ]  # fmt: skip
    del spans[2]["kind"], spans[2]["status"]
    read = read_otlp_json(write_lines(tmp_path / "t.json", request(*spans)))
    assert read.warnings == []
    got = by_id(read)
    assert got[ROOT_ID].trace_id == TRACE and got[ROOT_ID].kind == KIND_SERVER and got[ROOT_ID].status_code == STATUS_ERROR
    assert (got[ROOT_ID].start_ns, got[ROOT_ID].end_ns) == (T0, T0 + 9 * MS)
    assert got[CHILD_ID].parent_id == ROOT_ID and got[CHILD_ID].status_code == STATUS_OK
    assert (got[CHILD_ID].start_ns, got[CHILD_ID].end_ns) == (T0 + MS, T0 + 2 * MS)
    assert got[GRANDCHILD_ID].parent_id is None and got[GRANDCHILD_ID].kind == KIND_UNSPECIFIED
    assert got[GRANDCHILD_ID].status_code == STATUS_UNSET
    assert got["1111111111111111"].parent_id is None and got["1111111111111111"].start_ns == T0


def test_instrumentation_library_spans_of_pre_1_0_otlp(tmp_path: Path) -> None:
    doc = {"resourceSpans": [{"resource": {"attributes": [kv("service.name", "old")]}, "instrumentationLibrarySpans": [
        {"instrumentationLibrary": {"name": "io.opentelemetry.jdbc"}, "spans": [span()]}]}]}
    (got,) = read_otlp_json(write_lines(tmp_path / "old.json", doc)).spans
    assert (got.service, got.scope, got.span_id) == ("old", "io.opentelemetry.jdbc", ROOT_ID)


def test_unknown_fields_are_ignored(tmp_path: Path) -> None:
    doc = request(span(traceState="k=v", droppedAttributesCount=2, futureField={"x": [1]}))
    doc["futureTopLevel"] = 1
    doc["resourceSpans"][0]["resource"]["droppedAttributesCount"] = 0
    doc["resourceSpans"][0]["scopeSpans"][0]["scope"]["attributes"] = [kv("a", "b")]
    read = read_otlp_json(write_lines(tmp_path / "t.json", doc))
    assert read.warnings == [] and [s.span_id for s in read.spans] == [ROOT_ID]


def test_attribute_values_of_every_kind_and_unreadable_ones_dropped(tmp_path: Path) -> None:
    attributes = [
        {"key": "s", "value": {"stringValue": "v"}},
        {"key": "i_str", "value": {"intValue": "-42"}},
        {"key": "i_num", "value": {"intValue": 7}},
        {"key": "d_num", "value": {"doubleValue": 1}},
        {"key": "d_str", "value": {"doubleValue": "2.5"}},
        {"key": "b", "value": {"boolValue": False}},
        {"key": "bytes", "value": {"bytesValue": "AAE="}},
        {"key": "arr", "value": {"arrayValue": {"values": [{"stringValue": "x"}, {"arrayValue": {}}]}}},
        {"key": "kvl", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"intValue": "1"}}]}}},
        {"key": "bad_int", "value": {"intValue": "abc"}},
        {"key": "bad_str", "value": {"stringValue": 5}},
        {"key": "empty", "value": {}},
        {"key": "no_value"},
        {"key": 5, "value": {"stringValue": "not a string key"}},
        "not an object",
    ]
    read = read_otlp_json(write_lines(tmp_path / "a.json", request(span(attributes=attributes))))
    (got,) = read.spans
    assert got.attrs == {"s": "v", "i_str": -42, "i_num": 7, "d_num": 1.0, "d_str": 2.5, "b": False, "bytes": "AAE=",
                         "arr": ["x", []], "kvl": {"k": 1}}  # fmt: skip
    assert type(got.attrs["d_num"]) is float
    assert sorted(read.warnings) == [
        f"{tmp_path / 'a.json'}: dropped 1 attribute(s) that are not key/value objects",
        f"{tmp_path / 'a.json'}: dropped 1 attribute(s) without a string key",
        f"{tmp_path / 'a.json'}: dropped 4 attribute(s) with an unreadable value",
    ]


def test_events_and_links_with_hex_ids(tmp_path: Path) -> None:
    events = [{"timeUnixNano": str(T0 + MS), "name": "gen_ai.content.completion", "attributes": [kv("tokens", 3)]},
              {"timeUnixNano": T0 + 2 * MS, "name": "first token"},
              {"name": "no time"}]  # fmt: skip
    links = [{"traceId": TRACE2, "spanId": CHILD_ID.upper()}, {"traceId": "0" * 32, "spanId": CHILD_ID}, {"spanId": CHILD_ID}]
    read = read_otlp_json(write_lines(tmp_path / "e.json", request(span(events=events, links=links), span(CHILD_ID, ROOT_ID))))
    root, child = read.spans
    assert root.events == (SpanEvent("gen_ai.content.completion", T0 + MS, {"tokens": 3}), SpanEvent("first token", T0 + 2 * MS))
    assert root.links == (SpanLink(TRACE2, CHILD_ID),)
    assert child.parent_id == ROOT_ID and child.events == () and child.links == ()
    assert sorted(read.warnings) == [
        f"{tmp_path / 'e.json'}: dropped 1 event(s) without a readable time, name or attributes",
        f"{tmp_path / 'e.json'}: dropped 2 link(s) without a valid traceId and spanId",
    ]


def test_dropped_events_are_read_and_written_back(tmp_path: Path) -> None:
    """`droppedEventsCount` (the SDK's limit dropped the oldest events) rides on the span: a recurring first-token
    event is then not the first (`genai_spans.read_llm_call`); `latprof receive` writes it back."""
    from latprof.collectors.traces.receive import encode_request

    chunk = [{"timeUnixNano": str(T0 + 5 * MS), "name": "gen_ai.content.completion.chunk"}]
    dropped = span(events=chunk)
    dropped["droppedEventsCount"] = 114
    read = read_otlp_json(write_lines(tmp_path / "d.json", request(dropped, span(CHILD_ID, ROOT_ID))))
    root, child = read.spans
    assert (root.dropped_events, child.dropped_events) == (114, 0)
    again = read_otlp_json(write_lines(tmp_path / "again.json", orjson.loads(encode_request(read.spans))))
    assert [s.dropped_events for s in again.spans] == [114, 0] and again.spans == read.spans


# --- real files from outside this project ---------------------------------------------------


def test_jaeger_fixture_error_timeout_masked() -> None:
    read = read_otlp_json(FIXTURES / "error_timeout_masked.otlp.json")
    assert read.warnings == [] and read.documents == 1 and len(read.spans) == 26
    assert {s.trace_id for s in read.spans} == {"3e241b731fcf87976a3d50f5a7cc4d94"}
    assert {s.service for s in read.spans} == {"frontend-proxy", "frontend", "cart", "load-generator", "product-catalog"}
    spans = by_id(read)
    assert [s.span_id for s in read.spans if s.parent_id is None] == ["3e77d7cad1306af6"]
    root = spans["3e77d7cad1306af6"]
    assert (root.name, root.service, root.kind) == ("user_checkout_multi", "load-generator", KIND_CLIENT)
    assert all(s.parent_id in spans for s in read.spans if s is not root)  # one connected trace
    timed_out = spans["247a43490cfe60cd"]  # the 15 s route timeout at the proxy
    assert timed_out.status_code == STATUS_ERROR and timed_out.parent_id == "3e77d7cad1306af6"
    assert timed_out.duration_ns == 15_001_462_000 and timed_out.service == "frontend-proxy"
    assert spans["fb403de242b50b18"].parent_id == "247a43490cfe60cd"
    assert [s.span_id for s in read.spans if s.status_code == STATUS_ERROR] == ["247a43490cfe60cd"]
    assert spans["8098b17b3047cba7"].attrs["http.url"] == "http://frontend-proxy:8080/api/products/9SIQT8TOJO"
    assert spans["8a6cc5e0a19e94e9"].attrs["next.rsc"] is False
    assert spans["2743b416bcc31d52"].events[0] == SpanEvent("Enqueued", 1786060425569361900)
    assert spans["8098b17b3047cba7"].resource["host.cpu.cache.l2.size"] == 512  # an intValue
    assert spans["252303db5f016cf2"].resource["process.command_args"] == ["/nodejs/bin/node", "--require=./Instrumentation.js", "/app/server.js"]


def test_jaeger_fixture_sibling_errors() -> None:
    read = read_otlp_json(FIXTURES / "sibling_errors.otlp.json")
    assert read.warnings == [] and len(read.spans) == 6
    spans = by_id(read)
    assert [s.service for s in read.spans] == ["checkout"] * 4 + ["payment", "email"]
    root = spans["a1b2c3d4e5f60718"]
    assert root.parent_id is None and root.kind == KIND_SERVER and root.status_code == STATUS_ERROR
    assert spans["d4e5f60718293a4b"].parent_id == "c3d4e5f60718293a" and spans["d4e5f60718293a4b"].kind == KIND_CLIENT
    assert spans["b2c3d4e5f6071829"].status_code == STATUS_UNSET
    assert sum(s.status_code == STATUS_ERROR for s in read.spans) == 5
    assert spans["a1b2c3d4e5f60718"].resource is spans["e5f60718293a4b5c"].resource


# --- damage and wrong input ------------------------------------------------------------------


def test_torn_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    first, second, third = three_spans()
    whole = orjson.dumps(request(third))
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps(request(first)) + b"\n" + orjson.dumps(request(second)) + b"\n" + whole[:50])
    read = read_otlp_json(path)
    assert [s.span_id for s in read.spans] == [GRANDCHILD_ID, CHILD_ID]
    (warning,) = read.warnings
    assert warning.startswith(f"{path}:3: skipped a torn last line (not valid JSON:")


def test_malformed_line_before_the_last_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    good = orjson.dumps(request(span()))
    path.write_bytes(good + b"\n" + good[:40] + b"\n\n" + good + b"\n")
    with pytest.raises(InputError, match=rf"^{path}:2: malformed line \(not valid JSON"):
        read_otlp_json(path)
    path.write_bytes(good + b"\n42\n" + good + b"\n")  # JSON, but not a request
    with pytest.raises(InputError, match=rf"^{path}:2: malformed line \(a JSON number"):
        read_otlp_json(path)
    path.write_bytes(good[:40] + b"\n" + good + b"\n")  # the first line itself
    with pytest.raises(InputError, match=rf"^{path}:1: malformed line"):
        read_otlp_json(path)


def test_truncated_single_document_is_an_input_error(tmp_path: Path) -> None:
    text = json.dumps(request(*three_spans()), indent=2)
    path = tmp_path / "one.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(InputError, match=rf"^{path}: truncated or not valid JSON: "):
        read_otlp_json(path)
    path.write_text(json.dumps(request(*three_spans()))[:300])  # one line, cut
    with pytest.raises(InputError, match=rf"^{path}: truncated or not valid JSON: "):
        read_otlp_json(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file is empty"),
        (b"\n  \n\t\n", "file is empty"),
        (b"hello, world\nthis is a log file\n", "not OTLP JSON traces: not JSON"),
        (b'{"type": "header", "schema": "latprof-capture/1", "source": "run"}\n{"type": "request"}\n',
         r"not OTLP JSON traces: the first JSON object has no resourceSpans \(its keys: type, schema, source\)"),
        (b'{"data": [{"traceID": "abc", "spans": []}]}', "not OTLP JSON traces: the first JSON object has no resourceSpans"),
        (b"[1, 2, 3]\n", "not OTLP JSON traces: it starts with a JSON number"),
        (b'"resourceSpans"\n', "not OTLP JSON traces: it starts with a JSON string"),
        (b"null", "not OTLP JSON traces: it starts with a JSON null"),
        (b"[]", r"OTLP JSON file holds no readable spans \(0 request\(s\), none with spans\)"),
        (b'{"result": {"result": {"resourceSpans": [{"scopeSpans": [{"spans": [1]}]}]}}}',
         r"not OTLP JSON traces: the first JSON object has no resourceSpans \(its keys: result\)"),
        (b'{"resourceMetrics": []}\n', "not OTLP JSON traces: it holds OTLP metrics, logs or profiles only"),
        (b'{"resourceSpans": []}\n', r"OTLP JSON file holds no readable spans \(1 request\(s\), none with spans\)"),
        (b"{}\n", r"OTLP JSON file holds no readable spans \(1 request\(s\), none with spans\)"),
        (b'\xef\xbb\xbf{"resourceSpans": [{"scopeSpans": [{"spans": "nope"}]}]}',
         r"OTLP JSON file holds no readable spans: skipped 1 scopeSpans element\(s\) whose spans is not a list"),
        (b"\x1f\x8bnot really gzip", "compressed stream is truncated or damaged"),
    ],
    ids=["empty", "blank", "text", "capture", "jaeger", "array", "string", "null", "empty-array", "double-wrap", "metrics", "no-spans", "empty-request", "bom-bad-spans", "bad-gzip"],
)  # fmt: skip
def test_bad_files_are_one_line_input_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match=rf"^{path}: {message}") as caught:
        read_otlp_json(path)
    assert "\n" not in str(caught.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=rf"^{tmp_path / 'nope.json'}: cannot open: No such file"):
        read_otlp_json(tmp_path / "nope.json")
    with pytest.raises(InputError, match=rf"^{tmp_path}: is a directory"):
        read_otlp_json(tmp_path)


def test_unreadable_spans_are_skipped_and_counted_once_per_reason(tmp_path: Path) -> None:
    spans = [
        span(ROOT_ID),  # the one good span
        span("2222222222222222", start="abc"),
        span("3333333333333333", start=str(T0 + 5 * MS), end=str(T0 + 4 * MS)),
        span("4444444444444444", end="-1"),
        span("zz22222222222222"),
        span("0000000000000000"),
        span("12345"),
        span("5555555555555555", trace="0" * 32),
        span("6666666666666666", trace="abc"),
        span("7777777777777777", parent="not-an-id"),
        span("8888888888888888", attributes="a string"),
        span("9999999999999999", name=7),
        span("aaaaaaaaaaaaaaaa", status=[1]),
        span("bbbbbbbbbbbbbbbb", events={"not": "a list"}),
        span("cccccccccccccccc", kind="SPAN_KIND_SIDEWAYS"),  # kept, as unspecified
        span("dddddddddddddddd", status={"code": 9}),  # kept, as unset
        "not a span",
    ]  # fmt: skip
    del spans[6]["spanId"]  # "12345": no spanId at all
    del spans[8]["traceId"]
    path = write_lines(tmp_path / "bad.json", request(*spans))
    read = read_otlp_json(path)
    assert [s.span_id for s in read.spans] == [ROOT_ID, "cccccccccccccccc", "dddddddddddddddd"]
    assert read.spans[1].kind == KIND_UNSPECIFIED and read.spans[2].status_code == STATUS_UNSET
    assert sorted(read.warnings) == sorted(f"{path}: {w}" for w in [
        "skipped 2 span(s) without a readable start and end time",
        "skipped 1 span(s) that end before they start",
        "skipped 3 span(s) without a valid spanId",
        "skipped 2 span(s) without a valid traceId",
        "skipped 1 span(s) with an invalid parentSpanId",
        "skipped 1 span(s) whose attributes is not a list",
        "skipped 1 span(s) whose name is not a string",
        "skipped 1 span(s) whose status is not an object",
        "skipped 1 span(s) whose events is not a list",
        "skipped 1 span(s) that are not objects",
        "read 1 span(s) with an unknown kind as unspecified",
        "read 1 span(s) with an unknown status code as unset",
    ])  # fmt: skip


def test_containers_of_the_wrong_type_are_skipped(tmp_path: Path) -> None:
    doc = request(span())
    doc["resourceSpans"] += [
        "not an object",
        {"resource": "x", "scopeSpans": [{"spans": [span(CHILD_ID)]}]},
        {"resource": {"attributes": "x"}, "scopeSpans": []},
        {"scopeSpans": {"spans": []}},
        {"scopeSpans": [7, {"scope": "x", "spans": [span(CHILD_ID)]}, {"spans": {"a": 1}}, {"scope": {"name": None}, "spans": [span(GRANDCHILD_ID)]}]},
    ]  # fmt: skip
    path = write_lines(tmp_path / "c.json", doc, {"resourceSpans": "x"}, [doc["resourceSpans"][0]["scopeSpans"], {"resourceLogs": []}])
    read = read_otlp_json(path)
    assert [(s.span_id, s.scope, s.service) for s in read.spans] == [
        (ROOT_ID, "opentelemetry.instrumentation.fastapi", "chat-api"), (GRANDCHILD_ID, "", "")]  # fmt: skip
    assert sorted(read.warnings) == sorted(f"{path}: {w}" for w in [
        "skipped 1 resourceSpans element(s) that are not objects",
        "skipped 2 resourceSpans element(s) whose resource is not an object with an attribute list",
        "skipped 1 resourceSpans element(s) whose scopeSpans is not a list",
        "skipped 1 scopeSpans element(s) that are not objects",
        "skipped 1 scopeSpans element(s) whose scope is not an object with a string name",
        "skipped 1 scopeSpans element(s) whose spans is not a list",
        "skipped 1 request(s) whose resourceSpans is not a list",
        "skipped 1 array element(s) that are not request objects",
        "skipped 1 OTLP metrics, logs or profiles request(s) (not traces)",
    ])  # fmt: skip


def test_nothing_readable_lists_the_reasons(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "bad.json", request(span("zz"), span(ROOT_ID, start="x"), span(CHILD_ID, trace="q" * 32)))
    with pytest.raises(InputError, match=rf"^{path}: OTLP JSON file holds no readable spans: skipped 1 span\(s\) without a valid spanId;"
                                         r" 1 span\(s\) without a readable start and end time; 1 span\(s\) without a valid traceId$"):
        read_otlp_json(path)


def test_a_bad_id_among_good_spans_costs_only_that_span(tmp_path: Path) -> None:
    """The fast path checks a list's ids at once; when that fails the list is read again, counted once."""
    spans = [span(f"{i:016x}", parent=ROOT_ID if i > 1 else None, trace=f"{i % 3 + 1:032x}") for i in range(1, 41)]
    spans[7]["spanId"] = "G" * 16
    spans[20]["parentSpanId"] = "00f067aa0ba902bZ"
    spans[30]["traceId"] = "x" * 32
    spans[35]["spanId"] = spans[35]["spanId"].upper().replace("0", "A")
    read = read_otlp_json(write_lines(tmp_path / "t.json", request(*spans), request(span(CHILD_ID, ROOT_ID, trace=f"{2:032x}"))))
    assert len(read.spans) == 38
    assert read.spans[32].span_id == spans[35]["spanId"].lower()  # three skipped before it
    assert {s.trace_id for s in read.spans} == {f"{n:032x}" for n in (1, 2, 3)}
    assert sorted(read.warnings) == sorted(f"{tmp_path / 't.json'}: {w}" for w in [
        "skipped 1 span(s) without a valid spanId", "skipped 1 span(s) with an invalid parentSpanId",
        "skipped 1 span(s) without a valid traceId"])  # fmt: skip


def test_metrics_and_logs_lines_among_traces_are_skipped(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "all.json", {"resourceMetrics": []}, request(span()), {"resourceLogs": []}, {"unrelated": 1})
    read = read_otlp_json(path)
    assert [s.span_id for s in read.spans] == [ROOT_ID] and read.documents == 1
    assert sorted(read.warnings) == [
        f"{path}: skipped 1 object(s) that are not trace requests (no resourceSpans)",
        f"{path}: skipped 2 OTLP metrics, logs or profiles request(s) (not traces)",
    ]


def _careful_only(self: Any, spans: list[Any], service: str, scope: str, resource: Any) -> None:
    for sp in spans:
        got = self._careful_span(sp, service, scope, resource)
        if got is not None:
            self.spans.append(got)


def _mutations(doc: dict[str, Any], rng: random.Random, count: int) -> list[Any]:
    """`count` copies of `doc`, each with one value somewhere replaced by junk of another type, or one key deleted."""
    junk = [None, 0, -1, 7, 2.5, 1e29, 2**64 - 1, True, "", "x", " 5", "1_0", "NaN", "0" * 16, "A" * 32, TRACE.upper(), "t61rcWkgMzE=",
            "AAAAAAAAAAA=", "SPAN_KIND_CLIENT", "STATUS_CODE_ERROR", [], [1], {}, {"a": 1}, {"stringValue": "s"},
            {"intValue": "12"}, "1764000000000000000"]  # fmt: skip
    return mutations(doc, rng, count, junk)


def test_junk_anywhere_is_read_or_an_input_error_and_both_paths_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace any one value of a request by junk: never another exception, and the fast path reads as the careful one."""
    events = [{"timeUnixNano": str(T0 + MS), "name": "e", "attributes": [kv("k", "v")]}]
    base = request(*three_spans(), span("1111111111111111", ROOT_ID, events=events, links=[{"traceId": TRACE2, "spanId": CHILD_ID}]),
                   resource={"service.instance.id": "i-1", "n": 3})  # fmt: skip
    rng = random.Random(20)
    outcomes: dict[str, int] = {}
    for i, doc in enumerate(_mutations(base, rng, 400)):
        path = write_lines(tmp_path / f"m{i}.json", doc)
        try:
            fast = read_otlp_json(path)
        except InputError as exc:
            assert str(exc).startswith(f"{path}:") and "\n" not in str(exc)
            outcomes["error"] = outcomes.get("error", 0) + 1
            continue
        with monkeypatch.context() as patch:
            patch.setattr(otlp_json._Reader, "_spans", _careful_only)
            careful = read_otlp_json(path)
        assert fast.spans == careful.spans, doc
        assert sorted(fast.warnings) == sorted(careful.warnings)
        outcomes["read"] = outcomes.get("read", 0) + 1
    assert outcomes["read"] > 300 and outcomes["error"] > 5  # both outcomes were exercised


def test_fast_path_reads_as_the_careful_one_on_the_benchmark_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("gen_otlp", ROOT / "benchmarks" / "gen_otlp.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    path = tmp_path / "gen.json"
    gen.generate(path, spans=500, batch_spans=100, seed=1)
    fast = read_otlp_json(path)
    monkeypatch.setattr(otlp_json._Reader, "_spans", _careful_only)
    assert read_otlp_json(path).spans == fast.spans


# --- sniff ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        b'{"resourceSpans":[{"resource":{}}]}',
        b'\n\n   {\n  "resourceSpans": [\n',
        b'\xef\xbb\xbf{"resourceSpans": []}',
        b'{"result": {"resourceSpans": [',
        b'[{"resourceSpans": []}, {"resourceSpans": []}]',
        b'[\n  {\n    "resource_spans": [',
        b'{"resource_spans": [{"scope_spans": []}]}',
        b'{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"a',  # a cut head
    ],
)
def test_sniff_true(head: bytes) -> None:
    assert sniff(head)


@pytest.mark.parametrize(
    "head",
    [
        b'{"type": "header", "schema": "latprof-capture/1", "source": "run", "pid": 4242}\n{"type": "segment"}',
        b'{"type":"header","schema":"latprof-capture/1","note":"resourceSpans"}',  # a value, not the key
        b'{"data": [{"traceID": "0af7651916cd43dd", "spans": [], "processes": {}}]}',
        b'{"resourceMetrics": []}',
        b"resourceSpans",
        b"",
        b"   ",
        b"\x1f\x8b\x08\x00",
        b'{"padding": "' + b"x" * 2000 + b'", "resourceSpans": []}',
        b'["resourceSpans"]',
    ],
    ids=["capture", "capture-value", "jaeger", "metrics", "bare-word", "empty", "blank", "gzip", "far-key", "string-array"],
)
def test_sniff_false(head: bytes) -> None:
    assert not sniff(head)


def test_sniff_agrees_with_the_fixtures_and_a_real_capture() -> None:
    for path in FIXTURES.glob("*.otlp.json"):
        assert sniff(path.read_bytes()[: 64 * 1024])
    captures = sorted((ROOT / "examples").rglob("*.jsonl"))
    for path in captures[:3]:
        assert not sniff(path.read_bytes()[: 64 * 1024])
