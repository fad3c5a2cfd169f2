"""The OTLP protobuf trace reader: messages from the SDK's own encoder and built by hand, single or as the
Collector's length-prefixed stream, gzip, cut short, damaged, and read as the OTLP JSON reader reads their JSON."""

from __future__ import annotations

import base64
import copy
import gzip
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from fuzzing import damaged
from google.protobuf import json_format
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from latprof.collectors.traces import jaeger_json, otlp_json, zipkin_json
from latprof.collectors.traces.otlp_proto import Counters, OtlpProtoRead, read_otlp_proto, sniff, spans_from_request
from latprof.errors import InputError
from latprof.collectors.traces.spans import KIND_CLIENT, KIND_SERVER, STATUS_ERROR, Span
from otlp_receiver import file_exporter_json

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "otlp"  # real traces from outside the project (its README.md)
T0 = 1_764_000_000_000_000_000
MS = 1_000_000
TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
ROOT_ID = bytes.fromhex("b7ad6b7169203331")
CHILD_ID = bytes.fromhex("00f067aa0ba902b7")
CAPTURE_HEADER = b'{"type": "header", "schema": "latprof-capture/1", "source": "run", "pid": 4242}\n{"type": "segment"}\n'


# --- messages -----------------------------------------------------------------------------------


def sdk_spans() -> list[ReadableSpan]:
    """A request of two services' spans as stock instrumentation makes them: server, pool connect, query, a failing LLM call
    with an event and a link, and a worker's span."""
    exporter = InMemorySpanExporter()
    api = TracerProvider(resource=Resource.create({"service.name": "chat-api", "service.instance.id": "i-1"}))
    api.add_span_processor(SimpleSpanProcessor(exporter))
    worker = TracerProvider(resource=Resource.create({"service.name": "worker"}))
    worker.add_span_processor(SimpleSpanProcessor(exporter))
    fastapi = api.get_tracer("opentelemetry.instrumentation.fastapi", "0.48b0")
    sqlalchemy = api.get_tracer("opentelemetry.instrumentation.sqlalchemy")
    httpx = api.get_tracer("opentelemetry.instrumentation.httpx")
    root = fastapi.start_span("GET /v1/chat", kind=SpanKind.SERVER, start_time=T0,
                              attributes={"http.route": "/v1/chat", "http.response.status_code": 200})  # fmt: skip
    in_root = trace_api.set_span_in_context(root)
    sqlalchemy.start_span("connect", in_root, SpanKind.CLIENT, {"db.system.name": "postgresql"}, start_time=T0 + MS).end(T0 + 3 * MS)
    sqlalchemy.start_span("SELECT chat", in_root, SpanKind.CLIENT, {"db.system.name": "postgresql", "server.port": 5432},
                          start_time=T0 + 3 * MS).end(T0 + 8 * MS)  # fmt: skip
    background = worker.get_tracer("worker").start_span("refresh", start_time=T0)
    background.end(T0 + MS)
    llm = httpx.start_span("POST", in_root, SpanKind.CLIENT, start_time=T0 + 10 * MS,
                           attributes={"url.full": "https://api.openai.com/v1/chat/completions", "retry": True, "ratio": 0.5,
                                       "tags": ["a", "b"], "codes": [1, 2]},
                           links=[Link(background.get_span_context())])  # fmt: skip
    llm.add_event("exception", {"exception.type": "httpx.HTTPStatusError"}, timestamp=T0 + 150 * MS)
    llm.set_status(Status(StatusCode.ERROR, "Server Error"))
    llm.end(T0 + 160 * MS)
    root.end(T0 + 200 * MS)
    api.shutdown()
    worker.shutdown()
    return list(exporter.get_finished_spans())


def sdk_request() -> ExportTraceServiceRequest:
    """What the OTLP/HTTP exporter posts for `sdk_spans()` (its own encoder)."""
    return encode_spans(sdk_spans())


def proto_span(span_id: bytes = ROOT_ID, parent: bytes = b"", trace_id: bytes = TRACE, name: str = "GET /x",
               start: int = T0, end: int = T0 + 10 * MS, kind: int = KIND_SERVER, **attrs: Any) -> trace_pb2.Span:  # fmt: skip
    span = trace_pb2.Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=name, kind=kind,
                          start_time_unix_nano=start, end_time_unix_nano=end)  # fmt: skip
    for key, value in attrs.items():
        span.attributes.append(key_value(key, value))
    return span


def any_value(value: Any) -> common_pb2.AnyValue:
    if isinstance(value, common_pb2.AnyValue):
        return value
    if isinstance(value, bool):
        return common_pb2.AnyValue(bool_value=value)
    if isinstance(value, int):
        return common_pb2.AnyValue(int_value=value)
    if isinstance(value, float):
        return common_pb2.AnyValue(double_value=value)
    if isinstance(value, bytes):
        return common_pb2.AnyValue(bytes_value=value)
    if isinstance(value, list):
        return common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[any_value(v) for v in value]))
    if isinstance(value, dict):
        return common_pb2.AnyValue(kvlist_value=common_pb2.KeyValueList(values=[key_value(k, v) for k, v in value.items()]))
    return common_pb2.AnyValue(string_value=value)


def key_value(key: str, value: Any) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=any_value(value))


def request(*spans: trace_pb2.Span, service: str = "chat-api", scope: str = "opentelemetry.instrumentation.fastapi") -> ExportTraceServiceRequest:
    msg = ExportTraceServiceRequest()
    rs = msg.resource_spans.add()
    rs.resource.attributes.append(key_value("service.name", service))
    ss = rs.scope_spans.add()
    ss.scope.name = scope
    ss.spans.extend(spans)
    return msg


def two_spans() -> ExportTraceServiceRequest:
    return request(proto_span(**{"http.route": "/x"}),
                   proto_span(CHILD_ID, ROOT_ID, name="SELECT 1", start=T0 + MS, end=T0 + 5 * MS, kind=KIND_CLIENT,
                              **{"db.system.name": "postgresql"}))  # fmt: skip


def stream(*messages: ExportTraceServiceRequest) -> bytes:
    """The Collector file exporter's `format: proto`: each request after its length, 4 bytes big-endian."""
    out = b""
    for msg in messages:
        data = msg.SerializeToString()
        out += len(data).to_bytes(4, "big") + data
    return out


def proto_from_json(doc: dict[str, Any]) -> ExportTraceServiceRequest:
    """An OTLP JSON document (hex ids) as the protobuf message it encodes (protobuf's JSON has base64 ids)."""
    doc = copy.deepcopy(doc)
    for rs in doc["resourceSpans"]:
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for holder in [span, *span.get("links", [])]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if holder.get(key):
                            holder[key] = base64.b64encode(bytes.fromhex(holder[key])).decode()
    return json_format.ParseDict(doc, ExportTraceServiceRequest())


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def json_read(tmp_path: Path, *messages: ExportTraceServiceRequest) -> otlp_json.OtlpRead:
    """What the OTLP JSON reader reads from the Collector's JSON lines of the same messages."""
    lines = b"".join(orjson.dumps(file_exporter_json(msg)) + b"\n" for msg in messages)
    return otlp_json.read_otlp_json(write(tmp_path / "same.jsonl", lines))


def without_path(warnings: list[str], path: Path) -> list[str]:
    assert all(w.startswith(f"{path}: ") for w in warnings), warnings
    return sorted(w[len(f"{path}: "):] for w in warnings)


# --- reading --------------------------------------------------------------------------------------


def test_sdk_spans_read_as_the_json_reader_reads_the_same_request(tmp_path: Path) -> None:
    msg = sdk_request()
    read = read_otlp_proto(write(tmp_path / "export.pb", msg.SerializeToString()))
    assert isinstance(read, OtlpProtoRead) and read.warnings == [] and read.documents == 1
    assert read.spans == json_read(tmp_path, msg).spans  # same ids, kinds, times, attributes, events, links, resources
    by_name = {s.name: s for s in read.spans}
    llm, root = by_name["POST"], by_name["GET /v1/chat"]
    assert llm.parent_id == root.span_id and root.parent_id is None and len(root.trace_id) == 32 and root.trace_id.islower()
    assert (root.kind, llm.kind, llm.status_code) == (KIND_SERVER, KIND_CLIENT, STATUS_ERROR)
    assert llm.attrs == {"url.full": "https://api.openai.com/v1/chat/completions", "retry": True, "ratio": 0.5,
                         "tags": ["a", "b"], "codes": [1, 2]}  # fmt: skip
    assert llm.events[0].name == "exception" and llm.events[0].ts_ns == T0 + 150 * MS
    assert llm.links[0].span_id == by_name["refresh"].span_id and llm.links[0].trace_id == by_name["refresh"].trace_id
    assert (root.service, root.scope, by_name["refresh"].service) == ("chat-api", "opentelemetry.instrumentation.fastapi", "worker")
    assert root.resource["service.instance.id"] == "i-1"
    # one resource mapping per ResourceSpans, shared by its spans
    assert len({id(s.resource) for s in read.spans}) == len(msg.resource_spans)


def test_dropped_events_count_is_kept_on_a_span_with_events_as_the_json_reader_keeps_it(tmp_path: Path) -> None:
    msg = ExportTraceServiceRequest()
    scope = msg.resource_spans.add().scope_spans.add()
    chunked, bare = proto_span(), proto_span(CHILD_ID, ROOT_ID)
    chunked.events.add(time_unix_nano=T0 + MS, name="gen_ai.content.completion.chunk")
    chunked.dropped_events_count = bare.dropped_events_count = 114
    scope.spans.extend([chunked, bare])
    read = read_otlp_proto(write(tmp_path / "dropped.pb", msg.SerializeToString()))
    assert [s.dropped_events for s in read.spans] == [114, 0]  # none kept: nothing to misread
    assert read.spans == json_read(tmp_path, msg).spans


def test_every_attribute_value_type_and_unreadable_ones_dropped(tmp_path: Path) -> None:
    values = {"s": "text", "b": True, "i": -7, "d": 2.5, "big": 2**63 - 1, "bytes": b"\x00\x01\xff",
              "array": ["a", 1, [True]], "kvlist": {"k": "v", "n": {"deep": 1.5}}, "empty_array": []}  # fmt: skip
    msg = request(proto_span(**values))
    span = msg.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.append(common_pb2.KeyValue(key="no value"))  # an AnyValue with nothing set
    span.attributes.append(common_pb2.KeyValue(key="strindex", value=common_pb2.AnyValue(string_value_strindex=3)))
    span.attributes.append(key_value("bad array", [common_pb2.AnyValue()]))
    path = write(tmp_path / "attrs.pb", msg.SerializeToString())
    read = read_otlp_proto(path)
    [got] = read.spans
    assert dict(got.attrs) == {**values, "bytes": base64.b64encode(b"\x00\x01\xff").decode()}  # bytes as OTLP JSON's base64 text
    assert read.warnings == [f"{path}: dropped 3 attribute(s) with an unreadable value"]
    assert got.attrs == json_read(tmp_path, msg).spans[0].attrs


def test_length_prefixed_stream_reads_every_record_in_order(tmp_path: Path) -> None:
    first, second = sdk_request(), two_spans()
    read = read_otlp_proto(write(tmp_path / "traces.binpb", stream(first, second, ExportTraceServiceRequest())))
    assert read.documents == 3 and read.warnings == []
    assert read.spans == json_read(tmp_path, first, second).spans
    single = read_otlp_proto(write(tmp_path / "one.pb", first.SerializeToString()))
    assert read.spans[: len(single.spans)] == single.spans


def test_gzip_is_told_by_its_magic_bytes_not_its_name(tmp_path: Path) -> None:
    data = stream(two_spans(), two_spans())
    packed = read_otlp_proto(write(tmp_path / "traces.pb", gzip.compress(data)))
    plain = read_otlp_proto(write(tmp_path / "traces.pb.gz", data))
    assert packed.spans == plain.spans and len(packed.spans) == 4 and packed.warnings == plain.warnings == []


def test_a_single_message_cut_anywhere_keeps_the_complete_spans_before_the_cut(tmp_path: Path) -> None:
    msg = sdk_request()
    data = msg.SerializeToString()
    full = read_otlp_proto(write(tmp_path / "full.pb", data)).spans
    kept_counts = []
    for cut in range(len(data) - 1, 0, -7):
        path = write(tmp_path / f"cut{cut}.pb", data[:cut])
        try:
            read = read_otlp_proto(path)
        except InputError as exc:
            assert str(exc).startswith(str(path)) and "\n" not in str(exc)
            continue
        assert all(span in full for span in read.spans) and len(read.spans) < len(full)
        assert any("truncated" in w for w in read.warnings), read.warnings
        kept_counts.append(len(read.spans))
    assert max(kept_counts) == len(full) - 1  # a cut inside the last span keeps all the others
    assert len(set(kept_counts)) >= 3


def test_a_stream_cut_short_keeps_its_complete_records_and_spans(tmp_path: Path) -> None:
    data = stream(two_spans(), two_spans(), two_spans())
    record = len(data) // 3
    path = write(tmp_path / "cut.pb", data[: 2 * record + 2])  # inside the third record's length
    read = read_otlp_proto(path)
    assert len(read.spans) == 4 and read.documents == 2
    assert read.warnings == [f"{path}: truncated: the file ends inside the message that starts at byte {2 * record};"
                             " read the 4 complete span(s) before the cut"]  # fmt: skip
    one_more = read_otlp_proto(write(tmp_path / "cut2.pb", data[:-3]))  # inside the last span of the last record
    assert len(one_more.spans) == 5 and "truncated" in one_more.warnings[0]


def test_truncated_gzip_keeps_what_came_before(tmp_path: Path) -> None:
    packed = gzip.compress(stream(*[two_spans() for _ in range(3000)]), mtime=0)  # decompressed, several read chunks
    path = write(tmp_path / "cut.pb.gz", packed[: len(packed) * 2 // 3])
    read = read_otlp_proto(path)
    assert 0 < len(read.spans) < 6000
    assert read.warnings[0].startswith(f"{path}: compressed stream is truncated or damaged")


def test_unreadable_spans_are_skipped_and_counted_in_the_json_readers_words(tmp_path: Path) -> None:
    good = proto_span(name="kept")
    bad = [
        proto_span(trace_id=bytes(16)),
        proto_span(trace_id=b"\x01" * 8),
        proto_span(span_id=bytes(8)),
        proto_span(span_id=b"\x01\x02\x03\x04"),
        proto_span(CHILD_ID, parent=b"\x01\x02\x03"),
        proto_span(start=0),
        proto_span(start=T0 + 5, end=T0),
    ]
    odd = proto_span(b"\x01" * 8, kind=9, name="odd kind")  # kept, as unspecified
    odd.status.code = 7
    odd.events.add(name="no time")
    odd.events.add(name="mark", time_unix_nano=T0 + 1)
    odd.links.add(trace_id=TRACE, span_id=b"\x02")
    odd.links.add(trace_id=TRACE, span_id=ROOT_ID)
    zero_parent = proto_span(b"\x03" * 8, parent=bytes(8), name="root marked by zeros")
    msg = request(good, *bad, odd, zero_parent)
    path = write(tmp_path / "bad.pb", msg.SerializeToString())
    read = read_otlp_proto(path)
    assert [s.name for s in read.spans] == ["kept", "odd kind", "root marked by zeros"]
    odd_read = read.spans[1]
    assert (odd_read.kind, odd_read.status_code, [e.name for e in odd_read.events]) == (0, 0, ["mark"])
    assert [link.span_id for link in odd_read.links] == [ROOT_ID.hex()] and read.spans[2].parent_id is None
    assert without_path(read.warnings, path) == sorted([
        "skipped 2 span(s) without a valid traceId",
        "skipped 2 span(s) without a valid spanId",
        "skipped 1 span(s) with an invalid parentSpanId",
        "skipped 1 span(s) without a readable start and end time",
        "skipped 1 span(s) that end before they start",
        "read 1 span(s) with an unknown kind as unspecified",
        "read 1 span(s) with an unknown status code as unset",
        "dropped 1 event(s) without a readable time, name or attributes",
        "dropped 1 link(s) without a valid traceId and spanId",
    ])  # fmt: skip
    same = json_read(tmp_path, msg)
    assert read.spans == same.spans
    assert without_path(read.warnings, path) == without_path(same.warnings, tmp_path / "same.jsonl")


def test_spans_from_request_counts_what_it_met(tmp_path: Path) -> None:
    counters = Counters()
    spans = spans_from_request(request(proto_span(), proto_span(span_id=bytes(8))), counters)
    assert len(spans) == 1 and counters.offered == 2 and counters.skipped == {"span(s) without a valid spanId": 1}
    assert counters.warnings() == ["skipped 1 span(s) without a valid spanId"]
    again = spans_from_request(two_spans(), Counters(counters.shared, counters.hex_ids))
    assert again[0].trace_id is spans[0].trace_id  # the caches are shared: one string per trace id


def test_an_id_cached_as_one_kind_is_still_checked_as_the_other() -> None:
    """Trace ids (16 bytes) and parent ids (8 bytes) share one cache of hex strings: a trace id
    seen before is no valid parent id, nor a parent id a trace id (found by fuzzing `latprof
    receive`, whose requests share the cache: it kept a span the file reader skipped)."""
    counters = Counters()
    other_trace = bytes(range(1, 17))
    assert len(spans_from_request(two_spans(), counters)) == 2  # TRACE and ROOT_ID are cached now
    spans = spans_from_request(request(proto_span(CHILD_ID, parent=TRACE), proto_span(CHILD_ID, trace_id=ROOT_ID),
                                       proto_span(CHILD_ID, trace_id=other_trace, parent=ROOT_ID)),
                               Counters(counters.shared, counters.hex_ids))  # fmt: skip
    assert [(s.trace_id, s.parent_id) for s in spans] == [(other_trace.hex(), ROOT_ID.hex())]
    fresh = spans_from_request(request(proto_span(CHILD_ID, parent=TRACE), proto_span(CHILD_ID, trace_id=ROOT_ID)), Counters())
    assert fresh == []  # as a reader that never saw them before says


def test_the_real_fixtures_as_protobuf_read_as_their_json(tmp_path: Path) -> None:
    for fixture in sorted(FIXTURES.glob("*.otlp.json")):
        msg = proto_from_json(json.loads(fixture.read_text()))
        read = read_otlp_proto(write(tmp_path / f"{fixture.stem}.pb", msg.SerializeToString()))
        assert read.spans == otlp_json.read_otlp_json(fixture).spans, fixture.name


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file is empty"),
        (b'{"resourceSpans": []}', r"not OTLP protobuf traces \(JSON or text\)"),
        (CAPTURE_HEADER, r"not OTLP protobuf traces \(JSON or text\)"),
        (bytes(range(256)) * 4, r"not OTLP protobuf traces \(no trace request's wire format\)"),
        (request().SerializeToString() + b"\x00", "not OTLP protobuf traces"),  # resources, no span
        (two_spans().SerializeToString() + b'{"more": 1}', r"damaged at byte \d+: not a resourceSpans field \(after 1 resourceSpans\)"),
        (stream(two_spans()) + b"\x00\x00\x00\x03\x0a\xff\xff", r"damaged at byte \d+: record 2 is not a protobuf ExportTraceServiceRequest"),
        (gzip.compress(b"")[:5], "compressed stream is truncated or damaged"),
    ],
    ids=["empty", "otlp-json", "capture", "binary", "no-spans", "garbage-after", "bad-record", "cut-gzip"],
)  # fmt: skip
def test_bad_files_are_one_line_input_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = write(tmp_path / "bad.pb", content)
    with pytest.raises(InputError, match=message) as caught:
        read_otlp_proto(path)
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot open"):
        read_otlp_proto(tmp_path / "nope.pb")
    with pytest.raises(InputError, match="is a directory"):
        read_otlp_proto(tmp_path)


def test_corrupt_bytes_are_read_or_an_input_error(tmp_path: Path) -> None:
    rng = random.Random(13)
    single = sdk_request().SerializeToString()
    lines = stream(sdk_request(), two_spans(), sdk_request())
    outcomes: dict[str, int] = {}
    for i in range(300):
        raw = damaged([single, lines, gzip.compress(lines, mtime=0)][i % 3], rng)
        path = write(tmp_path / f"c{i}.pb", raw)
        try:
            read = read_otlp_proto(path)
        except InputError as exc:
            assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)
            outcomes["error"] = outcomes.get("error", 0) + 1
            continue
        assert read.spans and all(w.startswith(f"{path}: ") and "\n" not in w for w in read.warnings)
        for span in read.spans:
            assert len(span.trace_id) == 32 and len(span.span_id) == 16 and 0 < span.start_ns <= span.end_ns
            assert 0 <= span.kind <= 5 and 0 <= span.status_code <= 2 and type(span.name) is str
        outcomes["read"] = outcomes.get("read", 0) + 1
    assert outcomes["read"] > 30 and outcomes["error"] > 30, outcomes


# --- sniff ----------------------------------------------------------------------------------------


def big_resource_request() -> ExportTraceServiceRequest:
    msg = two_spans()
    for i in range(300):  # ~15 KiB of resource before the first span
        msg.resource_spans[0].resource.attributes.append(key_value(f"k8s.label.{i}", "x" * 40))
    return msg


def many_spans_request() -> bytes:
    msg = request(*[proto_span(i.to_bytes(8, "big"), name=f"span {i}", **{"a": "x" * 50}) for i in range(1, 2000)])
    data = msg.SerializeToString()
    assert len(data) > 64 * 1024
    return data[: 64 * 1024]  # the head of a bigger file


@pytest.mark.parametrize(
    "head",
    [
        two_spans().SerializeToString(),
        sdk_request().SerializeToString(),
        stream(two_spans(), two_spans()),
        stream(ExportTraceServiceRequest(), request(), two_spans()),  # an empty record, one without spans, then spans
        big_resource_request().SerializeToString(),
        many_spans_request(),
        stream(sdk_request())[:-5],  # cut, after complete spans
    ],
    ids=["single", "sdk", "stream", "stream-empty-first", "big-resource", "head-of-a-big-file", "cut"],
)
def test_sniff_true(head: bytes) -> None:
    assert sniff(head)


@pytest.mark.parametrize(
    "head",
    [
        CAPTURE_HEADER,
        b'{"resourceSpans":[{"resource":{"attributes":[]},"scopeSpans":[]}]}',
        b"\n\n\n" + orjson.dumps(file_exporter_json(two_spans())),  # JSON after newlines (0x0a is the message's first byte)
        b"\n" * 100,
        b'{"data":[{"traceID":"0af7651916cd43dd","spans":[]}]}',
        b'[{"traceId":"0af7651916cd43dd","id":"b7ad6b7169203331","name":"get","timestamp":1,"duration":2}]',
        b"2026-12-01 10:00:00 INFO started\n",
        two_spans().SerializeToString()[:40],  # before the first span ends
        request().SerializeToString(),  # no span
        bytes(range(256)),
        b"",
        b"\x1f\x8b\x08\x00",
    ],
    ids=["capture", "otlp-json", "json-after-newlines", "newlines", "jaeger", "zipkin", "log", "cut-before-a-span",
         "no-span", "binary", "empty", "gzip"],
)  # fmt: skip
def test_sniff_false(head: bytes) -> None:
    assert not sniff(head)


def test_each_format_sniffs_as_its_own_only() -> None:
    for head in (sdk_request().SerializeToString(), stream(sdk_request(), two_spans())):
        assert sniff(head) and not otlp_json.sniff(head) and not jaeger_json.sniff(head) and not zipkin_json.sniff(head)
    for path in FIXTURES.glob("*.otlp.json"):
        assert not sniff(path.read_bytes()[: 64 * 1024])
    for path in sorted((ROOT / "examples").rglob("*.jsonl.gz"))[:3]:
        assert not sniff(gzip.decompress(path.read_bytes())[: 64 * 1024])


# --- latprof analyze ------------------------------------------------------------------------------


def analyze(*args: Path | str, fmt: str = "json") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "latprof", "analyze", "--format", fmt, *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip


def report(*args: Path | str) -> dict[str, Any]:
    done = analyze(*args)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def comparable(rep: dict[str, Any]) -> dict[str, Any]:
    """A report without what names its inputs."""
    return {key: value for key, value in rep.items() if key not in ("source", "collection")}


def test_analyze_reads_protobuf_as_it_reads_the_same_json(tmp_path: Path) -> None:
    fixture = FIXTURES / "error_timeout_masked.otlp.json"
    msg = proto_from_json(json.loads(fixture.read_text()))
    single = write(tmp_path / "checkout.pb", msg.SerializeToString())
    packed = write(tmp_path / "checkout-stream.bin", gzip.compress(stream(msg)))
    from_json = report(fixture, "--skip-warmup", "0")
    for path in (single, packed):
        from_proto = report(path, "--skip-warmup", "0")
        assert from_proto["source"]["kind"] == "otlp" and from_proto["collection"]["collectors"] == ["otlp-proto"]
        assert comparable(from_proto) == comparable(from_json)
        assert from_proto["window"]["requests"] == 1 and from_proto["layers"]


def test_analyze_a_directory_of_protobuf_and_json_files(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    write(tmp_path / "export" / "a.pb", stream(sdk_request()))
    write(tmp_path / "export" / "b.json", orjson.dumps(file_exporter_json(two_spans())))
    write(tmp_path / "export" / "notes.pb", b"not a trace file")  # a .pb that is not traces: left alone
    rep = report(tmp_path / "export", "--skip-warmup", "0")
    assert rep["source"]["kind"] == "otlp" and sorted(rep["collection"]["collectors"]) == ["otlp-json", "otlp-proto"]
    assert sorted(Path(p).name for p in rep["source"]["inputs"]) == ["a.pb", "b.json"]
    assert rep["window"]["requests"] == 3  # the roots of three traces: the two services' requests and the worker's span


def test_analyze_a_cut_file_warns_and_a_garbage_file_is_one_line(tmp_path: Path) -> None:
    cut = write(tmp_path / "cut.pb", stream(sdk_request(), sdk_request())[:-9])
    rep = report(cut, "--skip-warmup", "0")
    assert any("truncated" in w for w in rep["collection"]["warnings"]), rep["collection"]["warnings"]
    garbage = write(tmp_path / "garbage.pb", bytes(range(256)) * 8)
    done = analyze(garbage)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "not a latprof capture" in done.stderr and "OTLP JSON or protobuf" in done.stderr
    damaged = write(tmp_path / "damaged.pb", stream(two_spans()) + b"\x00\x00\x00\x03\x0a\xff\xff")
    done = analyze(damaged)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "damaged at byte" in done.stderr, done.stderr


def test_span_of_the_reader_is_the_shared_span_model() -> None:
    [span] = spans_from_request(request(proto_span()), Counters())
    assert type(span) is Span
