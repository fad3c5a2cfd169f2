"""`latprof export --format otlp`: OTLP/JSON that OpenTelemetry's protobuf parser and latprof's reader both read,
with the capture's verdict, and the `latprof.layer` mapping that makes it so."""

from __future__ import annotations

import base64
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from latprof.collectors.traces.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, Span
from latprof.collectors.traces.tracemap import LATPROF_LAYER, REQUEST_CPU_NS, classify, map_spans
from latprof.events import Request, Segment
from latprof.export import EXPORT, read_input
from latprof.export.otlp import any_value, span_id_of, trace_id_of
from latprof.layers import DB_POOL, DB_QUERY, PROVIDER, TOOL
from latprof.pipeline import run_diagnosis
from latprof.report.renderers import REPORT

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.jsonl.gz"))
example = pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name.split(".")[0])
#: Attributes the export derives from a capture's own fields (route, status, CPU time, layer) rather than copies.
DERIVED = {LATPROF_LAYER, REQUEST_CPU_NS, "http.request.method", "http.route", "http.response.status_code"}


def export_to(path: Path, out_dir: Path) -> Path:
    target = out_dir / (path.name.split(".")[0] + ".otlp.jsonl")
    with open(target, "w", encoding="utf-8") as out:
        EXPORT.render("otlp", read_input([path]), out)
    return target


def verdict(path: Path) -> tuple[Any, Any, Any]:
    out = io.StringIO()
    REPORT.render("json", run_diagnosis([path]).report, out)
    v = json.loads(out.getvalue())["verdict"]
    return v["status"], v["layer"], v["rule"]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def spans_of(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [span for doc in documents for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]]


def attrs_of(span: dict[str, Any]) -> dict[str, Any]:
    return {kv["key"]: next(iter(kv["value"].values())) for kv in span["attributes"]}


@example
def test_analyze_of_the_export_gives_the_captures_verdict(path: Path, tmp_path: Path) -> None:
    exported = export_to(path, tmp_path)
    assert verdict(exported) == verdict(path)


@example
def test_the_export_reads_back_as_the_captures_requests_and_layers(path: Path, tmp_path: Path) -> None:
    data = read_input([path])
    back = read_input([export_to(path, tmp_path)])
    assert not back.warnings
    assert len(back.requests) == len({r.request_id for r in data.requests})
    original = {trace_id_of(r.request_id): r for r in data.requests}
    for request in back.requests:
        source = original[request.request_id]
        assert (request.route, request.start_ns, request.end_ns, request.cpu_ns, request.status_code) == (
            source.route, source.start_ns, source.end_ns, source.cpu_ns, source.status_code)  # fmt: skip
    layers = sorted((s.layer or "", s.start_ns, s.end_ns) for v in data.segments_by_request.values() for s in v)
    assert sorted((s.layer or "", s.start_ns, s.end_ns) for v in back.segments_by_request.values() for s in v) == layers


@example
def test_the_export_parses_as_otlp_protobuf_json(path: Path, tmp_path: Path) -> None:
    documents = lines(export_to(path, tmp_path))
    spans = spans_of(documents)
    for span in spans:
        assert len(span["traceId"]) == 32 and span["traceId"] == span["traceId"].lower()
        assert len(span["spanId"]) == 16 and int(span["spanId"], 16) != 0
        assert isinstance(span["startTimeUnixNano"], str) and isinstance(span["endTimeUnixNano"], str)
        assert LATPROF_LAYER in attrs_of(span)
    parsed = 0
    for doc in documents:
        for span in spans_of([doc]):  # protobuf's JSON mapping reads `bytes` fields as base64, OTLP/JSON writes hex
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in span:
                    span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        message = json_format.Parse(json.dumps(doc), ExportTraceServiceRequest())
        for rs in message.resource_spans:
            resource = {kv.key for kv in rs.resource.attributes}
            assert {"service.name", "process.pid"} <= resource
            for ss in rs.scope_spans:
                for span in ss.spans:
                    assert len(span.trace_id) == 16 and len(span.span_id) == 8
                    assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
                    parsed += 1
    assert parsed == len(spans) == len(read_input([path]).requests) + read_input([path]).segment_count


def test_roots_are_server_spans_and_calls_client_spans(tmp_path: Path) -> None:
    spans = spans_of(lines(export_to(EXAMPLES[0], tmp_path)))
    roots = [s for s in spans if "parentSpanId" not in s]
    assert roots and all(s["kind"] == KIND_SERVER and attrs_of(s)[LATPROF_LAYER] == "none" for s in roots)
    by_layer = {attrs_of(s)[LATPROF_LAYER]: s["kind"] for s in spans if "parentSpanId" in s}
    assert by_layer[DB_QUERY] == KIND_CLIENT and by_layer[PROVIDER] == KIND_CLIENT and by_layer[DB_POOL] == KIND_INTERNAL
    ids = {s["spanId"] for s in spans}
    assert all(s["parentSpanId"] in ids for s in spans if "parentSpanId" in s)


@example
def test_the_export_adds_no_attribute_the_capture_does_not_hold(path: Path, tmp_path: Path) -> None:
    data = read_input([path])
    held = {k for v in data.segments_by_request.values() for s in v for k in s.attrs}
    held |= {k for r in data.requests for k in r.attrs}
    exported = {k for s in spans_of(lines(export_to(path, tmp_path))) for k in attrs_of(s)}
    assert exported - DERIVED <= held


def test_any_value_follows_the_otlp_json_mapping() -> None:
    assert any_value(True) == {"boolValue": True}
    assert any_value(7) == {"intValue": "7"}
    assert any_value(0.5) == {"doubleValue": 0.5}
    assert any_value(math.nan) == {"doubleValue": "NaN"} and any_value(-math.inf) == {"doubleValue": "-Infinity"}
    assert any_value(["a", None, 1]) == {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "1"}]}}
    assert any_value({"k": "v"}) == {"kvlistValue": {"values": [{"key": "k", "value": {"stringValue": "v"}}]}}
    assert any_value(None) is None


def test_ids_are_kept_when_they_are_trace_ids_and_hashed_otherwise() -> None:
    trace = "0af7651916cd43dd8448eb211c80319c"
    assert trace_id_of(trace) == trace and trace_id_of(f"{trace}:b7ad6b7169203331") == trace
    assert span_id_of("r1", "b7ad6b7169203331") == "b7ad6b7169203331"
    assert trace_id_of("r1") == trace_id_of("r1") != trace_id_of("r2")
    assert span_id_of("r1", "s1") != span_id_of("r2", "s1") and len(span_id_of("r1", "s1")) == 16


# --- the mapping of spans that carry latprof.layer ---------------------------------------------


def span(name: str, attrs: dict[str, Any], kind: int = KIND_INTERNAL, parent: str | None = "a" * 16, sid: str = "b" * 16,
         scope: str = "") -> Span:  # fmt: skip
    return Span("c" * 32, sid, parent, name, kind, 1_000, 2_000, "svc", scope, attrs)


def test_an_explicit_layer_beats_the_table() -> None:
    db = {"db.system.name": "postgresql"}
    assert classify(span("SELECT", db, KIND_CLIENT)) == DB_QUERY  # stock: the table
    assert classify(span("checkout", {**db, LATPROF_LAYER: DB_POOL})) == DB_POOL
    assert classify(span("hold", {**db, LATPROF_LAYER: "none"})) is None
    assert classify(span("call", {LATPROF_LAYER: "tool"})) is TOOL  # the layer's own string object


def test_spans_without_a_valid_explicit_layer_map_as_stock_spans_do() -> None:
    db = {"db.system.name": "postgresql"}
    for odd in ("bogus", "unattributed", 3, ["db.pool"]):
        assert classify(span("SELECT", {**db, LATPROF_LAYER: odd}, KIND_CLIENT)) == DB_QUERY
    assert classify(span("GET", {"http.request.method": "GET"}, KIND_CLIENT)) == TOOL
    assert classify(span("work", {})) is None


def test_the_cpu_time_of_a_root_is_read_only_when_it_is_a_count() -> None:
    root = "a" * 16
    events = map_spans([
        span("GET /a", {REQUEST_CPU_NS: 5_000}, KIND_SERVER, parent=None, sid=root),
    ])  # fmt: skip
    assert [r.cpu_ns for r in events.requests] == [5_000]
    for odd in ("5000", -1, 1.5, True):
        assert [r.cpu_ns for r in map_spans([span("GET /a", {REQUEST_CPU_NS: odd}, KIND_SERVER, parent=None, sid=root)]).requests] == [None]


def test_a_hand_built_capture_round_trips_its_layers(tmp_path: Path) -> None:
    from latprof.capture.reader import CaptureData
    from latprof.export.otlp import write_otlp

    request = Request("req-1", "POST /chat", 1_000_000, 9_000_000, 42, cpu_ns=1_500, status_code=503)
    segments = [
        Segment("req-1", "hold", None, "db.connection.hold", None, 2_000_000, 5_000_000, 42, {"db.system.name": "sqlite"}),
        Segment("req-1", "q", "hold", "SELECT t", "db.query", 3_000_000, 4_000_000, 42, {"db.system.name": "sqlite"}),
        Segment("req-1", "w", "missing", "checkout", "db.pool", 1_500_000, 2_000_000, 42),
    ]
    data = CaptureData(headers=[{"type": "header", "pid": 42, "service.name": "chat", "host": "h"}], requests=[request],
                       segments_by_request={"req-1": segments}, segment_count=3)  # fmt: skip
    target = tmp_path / "x.jsonl"
    with open(target, "w") as out:
        write_otlp(data, out)
    doc = lines(target)
    assert len(doc) == 1
    resource = attrs_of(doc[0]["resourceSpans"][0]["resource"])
    assert resource == {"service.name": "chat", "host.name": "h", "process.pid": "42"}
    back = read_input([target])
    (got,) = back.requests
    assert (got.route, got.cpu_ns, got.status_code, got.attrs.get("service.name")) == ("POST /chat", 1_500, 503, "chat")
    by_name = {s.name: s for s in back.segments_by_request[got.request_id]}
    assert by_name["db.connection.hold"].layer is None and by_name["SELECT t"].layer == DB_QUERY
    assert by_name["SELECT t"].parent_id == by_name["db.connection.hold"].segment_id
    assert by_name["checkout"].layer == DB_POOL and by_name["checkout"].parent_id is None  # its parent was not in the capture
