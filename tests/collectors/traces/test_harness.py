"""The OTLP harness itself: the receiver's JSON, and what each scenario's stock-instrumented service exports.

The files are read with plain `json` (not latprof's reader): these tests pin down what a real
Collector-style OTLP file from stock OpenTelemetry looks like, for the reader's tests to rely on.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otlp_harness import DBS, SCENARIOS
from otlp_receiver import MAX_BODY_BYTES, OtlpReceiver, file_exporter_json

pytestmark = [pytest.mark.slow, pytest.mark.long]  # real traced services under load, 10 s each: with the long runs (CI)

HEX32, HEX16 = re.compile(r"^[0-9a-f]{32}$"), re.compile(r"^[0-9a-f]{16}$")
DIGITS = re.compile(r"^[0-9]+$")
SERVER, CLIENT, INTERNAL = 2, 3, 1
FASTAPI, SQLALCHEMY = "opentelemetry.instrumentation.fastapi", "opentelemetry.instrumentation.sqlalchemy"
PSYCOPG, ASYNCPG = "opentelemetry.instrumentation.psycopg", "opentelemetry.instrumentation.asyncpg"
HTTPX = "opentelemetry.instrumentation.httpx"
STATEMENT_SCOPE = {"sqlalchemy": SQLALCHEMY, "psycopg_pool": PSYCOPG, "asyncpg": ASYNCPG}
OPENAI_ON_HTTPX = openai.__version__.startswith("2")  # openai 3.x runs on httpx2, which the httpx instrumentation does not see
SKIP_S = 2.0  # the analysis skips the first 2 s of traffic


# --- reading the files with plain json ------------------------------------------------------------


def read_lines(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines()
    assert lines, f"{path} is empty"
    docs = [json.loads(line) for line in lines]  # one ExportTraceServiceRequest object per line
    assert all(isinstance(d, dict) and set(d) == {"resourceSpans"} for d in docs)
    return docs


def flat_spans(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every span, with `_scope` (its scope's name) and `_service` (its resource's service.name)."""
    out = []
    for doc in docs:
        for rs in doc["resourceSpans"]:
            service = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}["service.name"]["stringValue"]
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    out.append({**span, "_scope": ss["scope"]["name"], "_service": service})
    return out


def attrs(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", ())}


def start(span: dict[str, Any]) -> int:
    return int(span["startTimeUnixNano"])


def end(span: dict[str, Any]) -> int:
    return int(span["endTimeUnixNano"])


def ms(span: dict[str, Any]) -> float:
    return (end(span) - start(span)) / 1e6


def by_trace(spans: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    traces: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        traces[span["traceId"]].append(span)
    return traces


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]  # nearest rank


def recorded_requests(path: Path) -> list[dict[str, Any]]:
    return list(json.loads((path.parent / "driver.json").read_text())["requests"])


def check_file_exporter_shape(path: Path, scenario: str) -> list[dict[str, Any]]:
    """The Collector file exporter's JSON: hex ids, decimal-string 64-bit ints, numeric enums; the spans."""
    spans = flat_spans(read_lines(path))
    for span in spans:
        assert HEX32.match(span["traceId"]) and HEX16.match(span["spanId"]), span
        assert "parentSpanId" not in span or HEX16.match(span["parentSpanId"]), span
        assert DIGITS.match(span["startTimeUnixNano"]) and DIGITS.match(span["endTimeUnixNano"]), span
        assert isinstance(span["kind"], int) and isinstance(span.get("status", {}).get("code", 0), int), span
        for a in span.get("attributes", ()):
            if "intValue" in a["value"]:
                assert isinstance(a["value"]["intValue"], str) and DIGITS.match(a["value"]["intValue"]), a
        assert span["_service"] == f"otlp-{scenario}"
    return spans


def check_server_spans(spans: list[dict[str, Any]], path: Path, route: str) -> dict[str, dict[str, Any]]:
    """One FastAPI server span (the root) per request the driver made, each with `http.route`; by trace id."""
    servers = [s for s in spans if s["kind"] == SERVER]
    assert all(s["_scope"] == FASTAPI and "parentSpanId" not in s for s in servers)
    assert all(attrs(s)["http.route"] == route for s in servers), {attrs(s).get("http.route") for s in servers}
    assert len(servers) == len(recorded_requests(path)), "a request without its server span: spans were lost"
    roots = {s["traceId"]: s for s in servers}
    assert len(roots) == len(servers), "one trace per request"
    ids = {s["spanId"] for s in spans}
    for span in spans:  # nothing lost at shutdown: every parent is in the file, every span in a request's trace
        assert span["traceId"] in roots, span
        assert "parentSpanId" not in span or span["parentSpanId"] in ids, span
    sends = [s for s in spans if s["kind"] == INTERNAL]
    assert sends and all(s["name"] == f"GET {route} http send" and s["_scope"] == FASTAPI for s in sends)
    assert {attrs(s)["asgi.event.type"] for s in sends} == {"http.response.start", "http.response.body"}
    return roots


def tail_ratio(roots: dict[str, dict[str, Any]]) -> tuple[int, float, float]:
    """(traces after the first 2 s, p50, p99) of the server spans' durations in ms."""
    t0 = min(start(s) for s in roots.values())
    durations = [ms(s) for s in roots.values() if start(s) - t0 >= SKIP_S * 1e9]
    return len(durations), percentile(durations, 0.5), percentile(durations, 0.99)


def children(trace: list[dict[str, Any]], root: dict[str, Any], scope: str, kind: int = CLIENT) -> list[dict[str, Any]]:
    """`trace`'s spans of `scope` and `kind` directly under `root`, by start time."""
    found = [s for s in trace if s["_scope"] == scope and s["kind"] == kind]
    assert all(s.get("parentSpanId") == root["spanId"] for s in found), "client spans are children of the server span"
    return sorted(found, key=start)


def check_db_spans(trace: list[dict[str, Any]], root: dict[str, Any], db: str) -> list[dict[str, Any]]:
    """The statement spans of one request; SQLAlchemy's `connect` spans come before its statements."""
    spans = children(trace, root, STATEMENT_SCOPE[db])
    statements = [s for s in spans if s["name"] != "connect"]
    assert statements and all(attrs(s)["db.system"] == "postgresql" and attrs(s)["db.statement"] for s in statements)
    connects = [s for s in spans if s["name"] == "connect"]
    if db == "sqlalchemy":
        assert connects and start(connects[0]) <= start(statements[0]) and end(connects[0]) <= start(statements[0])
    else:  # psycopg_pool / asyncpg: the checkout (the pool wait) has no span of its own
        assert not connects
    assert not [s for s in trace if s["kind"] == CLIENT and s["_scope"] not in (STATEMENT_SCOPE[db], HTTPX)]
    return statements


def check_llm_spans(trace: list[dict[str, Any]], calls: int) -> None:
    llm = [s for s in trace if s["_scope"] == HTTPX and "/v1/chat/completions" in str(url_of(s))]
    if OPENAI_ON_HTTPX:  # openai 2.x: its HTTP request is an httpx client span
        assert len(llm) == calls and all(s["kind"] == CLIENT and attrs(s).get("http.request.method", attrs(s).get("http.method")) == "POST" for s in llm)


def url_of(span: dict[str, Any]) -> str | None:
    a = attrs(span)
    return a.get("url.full", a.get("http.url"))


def tool_spans(trace: list[dict[str, Any]], root: dict[str, Any]) -> list[dict[str, Any]]:
    spans = [s for s in children(trace, root, HTTPX) if "/v1/" not in str(url_of(s))]  # not the LLM (openai 2.x)
    assert all(url_of(s) and s["name"] == "GET" for s in spans)
    return spans


# --- the receiver ---------------------------------------------------------------------------------


def _request() -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "unit"
    ss = rs.scope_spans.add()
    ss.scope.name = "unit.scope"
    root = ss.spans.add(trace_id=bytes(range(16)), span_id=bytes(range(8)), name="GET /x", kind=Span.SPAN_KIND_SERVER,
                        start_time_unix_nano=1_700_000_000_123_456_789, end_time_unix_nano=1_700_000_001_000_000_000)  # fmt: skip
    root.attributes.add(key="http.status_code").value.int_value = 200
    root.status.code = Status.STATUS_CODE_ERROR
    child = ss.spans.add(trace_id=bytes(range(16)), span_id=bytes(range(8, 16)), parent_span_id=bytes(range(8)),
                         name="SELECT", kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=1, end_time_unix_nano=2)  # fmt: skip
    child.links.add(trace_id=b"\xff" * 16, span_id=b"\xee" * 8)
    return request


def test_file_exporter_json_is_the_collector_format() -> None:
    doc = file_exporter_json(_request())
    root, child = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert root["traceId"] == bytes(range(16)).hex() and root["spanId"] == "0001020304050607" and "parentSpanId" not in root
    assert root["kind"] == 2 and root["status"] == {"code": 2}
    assert root["startTimeUnixNano"] == "1700000000123456789" and root["attributes"][0]["value"] == {"intValue": "200"}
    assert child["parentSpanId"] == "0001020304050607" and child["kind"] == 3
    assert child["links"] == [{"traceId": "ff" * 16, "spanId": "ee" * 8}]


def _post(receiver: OtlpReceiver, body: bytes, headers: dict[str, str], path: str = "/v1/traces") -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
    conn.request("POST", path, body=body, headers={"content-type": "application/x-protobuf", **headers})
    response = conn.getresponse()
    response.body = response.read()  # type: ignore[attr-defined]
    conn.close()
    return response


def test_receiver_modes_gzip_and_limits(tmp_path: Path) -> None:
    raw = _request().SerializeToString()
    for mode in ("file-exporter", "protobuf-json"):
        out = tmp_path / f"{mode}.jsonl"
        with OtlpReceiver(out, mode=mode) as receiver:
            assert receiver.endpoint == f"http://127.0.0.1:{receiver.port}/v1/traces"
            ok = _post(receiver, raw, {})
            assert ok.status == 200 and ok.getheader("content-type") == "application/x-protobuf"
            ExportTraceServiceResponse().ParseFromString(ok.body)  # type: ignore[attr-defined]
            assert _post(receiver, gzip.compress(raw), {"content-encoding": "gzip"}).status == 200
            assert receiver.wait_for_spans(4, timeout=5) and receiver.spans_received == 4
            assert _post(receiver, b"\xff\xfe not protobuf", {}).status == 400
            assert _post(receiver, b"", {"content-length": str(MAX_BODY_BYTES + 1)}).status == 413
            bomb = gzip.compress(b"\0" * (MAX_BODY_BYTES + 1024))
            assert _post(receiver, bomb, {"content-encoding": "gzip"}).status == 413
            assert _post(receiver, raw, {}, path="/v1/metrics").status == 404
            assert receiver.wait_idle(0.1, timeout=5)
        docs = read_lines(out)
        assert len(docs) == 2 and docs[0] == docs[1]  # one line per accepted request
        span = docs[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        if mode == "file-exporter":
            assert span["traceId"] == bytes(range(16)).hex() and span["kind"] == 2
        else:
            assert base64.b64decode(span["traceId"]) == bytes(range(16)) and span["kind"] == "SPAN_KIND_SERVER"
            assert span["status"] == {"code": "STATUS_CODE_ERROR"}


# --- the scenarios --------------------------------------------------------------------------------


@pytest.mark.parametrize("db", DBS)
def test_pool_held(recording: Callable[..., Path], db: str) -> None:
    """The pool held across the LLM call: the bursts wait for a connection, p99 >= 2x p50."""
    path = recording("pool_held", db)
    assert path.name == "traces.otlp.jsonl"
    spans = check_file_exporter_shape(path, "pool_held")
    roots = check_server_spans(spans, path, "/chat")
    traces = by_trace(spans)
    waits = []
    for trace_id, root in roots.items():
        trace = traces[trace_id]
        statements = check_db_spans(trace, root, db)
        assert len(statements) == (3 if db == "asyncpg" else 2)  # asyncpg: + the pool's reset query at release
        if db == "asyncpg":
            assert attrs(statements[-1])["db.statement"].startswith("SELECT pg_advisory_unlock_all()")
        check_llm_spans(trace, 1)
        waits.append((start(statements[0]) - start(root)) / 1e6)  # the checkout: from the request to its first statement
    n, p50, p99 = tail_ratio(roots)
    print(f"pool_held/{db}: {n} traces after {SKIP_S:g} s, p50 {p50:.0f} ms, p99 {p99:.0f} ms; "
          f"checkout p50 {percentile(waits, 0.5):.0f} ms, p99 {percentile(waits, 0.99):.0f} ms")  # fmt: skip
    assert n >= 50 and p99 >= 2 * p50
    assert percentile(waits, 0.5) < 20 and percentile(waits, 0.99) > p50  # the tail is the wait for a connection


@pytest.mark.parametrize("db", DBS)
def test_slow_query(recording: Callable[..., Path], db: str) -> None:
    path = recording("slow_query", db, duration_s=4)
    spans = check_file_exporter_shape(path, "slow_query")
    roots = check_server_spans(spans, path, "/query")
    traces = by_trace(spans)
    slow = []
    for trace_id, root in roots.items():
        sleeps = [s for s in check_db_spans(traces[trace_id], root, db) if "pg_sleep" in attrs(s)["db.statement"]]
        assert len(sleeps) == 1
        if ms(sleeps[0]) >= 380:
            slow.append(ms(root))
    share = len(slow) / len(roots)
    assert 0.02 <= share <= 0.05, share  # 1 in 30 sleeps 400 ms, the others 10 ms
    n, p50, p99 = tail_ratio(roots)
    print(f"slow_query/{db}: {n} traces, p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    assert p50 < 50 and p99 >= 380


@pytest.mark.parametrize("db", DBS)
def test_healthy(recording: Callable[..., Path], db: str) -> None:
    path = recording("healthy", db, duration_s=5)
    spans = check_file_exporter_shape(path, "healthy")
    roots = check_server_spans(spans, path, "/ok")
    traces = by_trace(spans)
    for trace_id, root in roots.items():
        check_db_spans(traces[trace_id], root, db)
        check_llm_spans(traces[trace_id], 1)
    n, p50, p99 = tail_ratio(roots)
    print(f"healthy/{db}: {n} traces, p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    assert n >= 50 and p99 < 2 * p50


def test_sequential_tools(recording: Callable[..., Path]) -> None:
    """Independent tool calls made one after another: 1 per request, 4 in ~3% of them (the tail)."""
    path = recording("sequential_tools")
    spans = check_file_exporter_shape(path, "sequential_tools")
    roots = check_server_spans(spans, path, "/tools")
    traces = by_trace(spans)
    counts = []
    for trace_id, root in roots.items():
        trace = traces[trace_id]
        assert not [s for s in trace if s["_scope"] in STATEMENT_SCOPE.values()]
        calls = tool_spans(trace, root)
        counts.append(len(calls))
        assert all(a_end <= b_start for a_end, b_start in zip(map(end, calls), map(start, calls[1:]))), "one after another"
        paths = [url_of(s).split("?")[0].rsplit("/", 1)[1] for s in calls]  # type: ignore[union-attr]
        assert len(set(paths)) == len(paths) and all(ms(s) >= 145 for s in calls)
        check_llm_spans(trace, 1)
    assert set(counts) == {1, 4} and 0.02 <= counts.count(4) / len(counts) <= 0.05
    n, p50, p99 = tail_ratio(roots)
    print(f"sequential_tools: {n} traces, p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    assert n >= 50 and p99 >= 2 * p50


def test_agent_loop(recording: Callable[..., Path]) -> None:
    """LLM -> tool -> ... -> LLM: each tool URL carries a word of the LLM's answer; 1 turn, 4 in ~3%."""
    from latprof.demo.provider import _WORDS

    path = recording("agent_loop")
    spans = check_file_exporter_shape(path, "agent_loop")
    roots = check_server_spans(spans, path, "/agent")
    traces = by_trace(spans)
    turns = []
    for trace_id, root in roots.items():
        calls = tool_spans(traces[trace_id], root)
        turns.append(len(calls))
        for turn, call in enumerate(calls):
            url = url_of(call)
            match = re.search(r"/search\?q=([a-z]+)&turn=(\d+)", str(url))
            assert match and match.group(1) in _WORDS and int(match.group(2)) == turn, url
        # every tool call waits for an LLM answer: none starts at the request's start
        assert all(start(c) - start(root) >= 100e6 for c in calls[:1])
        assert all(start(b) - end(a) >= 100e6 for a, b in zip(calls, calls[1:]))
        check_llm_spans(traces[trace_id], len(calls) + 1)
    assert set(turns) == {1, 4}
    n, p50, p99 = tail_ratio(roots)
    print(f"agent_loop: {n} traces, p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    assert n >= 50 and p99 >= 2 * p50


def test_protobuf_json_mode_with_gzip(recording: Callable[..., Path]) -> None:
    """mode="protobuf-json": MessageToDict as protobuf writes it (base64 ids, enum names); the exporter gzips."""
    path = recording("healthy", "asyncpg", duration_s=5, mode="protobuf-json", compression="gzip")
    spans = flat_spans(read_lines(path))
    assert spans and len([s for s in spans if s["kind"] == "SPAN_KIND_SERVER"]) == len(recorded_requests(path))
    for span in spans:
        assert len(base64.b64decode(span["traceId"], validate=True)) == 16
        assert len(base64.b64decode(span["spanId"], validate=True)) == 8
        assert "parentSpanId" not in span or len(base64.b64decode(span["parentSpanId"], validate=True)) == 8
        assert span["kind"] in ("SPAN_KIND_SERVER", "SPAN_KIND_CLIENT", "SPAN_KIND_INTERNAL")
        assert DIGITS.match(span["startTimeUnixNano"])
    assert {s["kind"] for s in spans} == {"SPAN_KIND_SERVER", "SPAN_KIND_CLIENT", "SPAN_KIND_INTERNAL"}


def test_scenarios_defaults() -> None:
    assert set(SCENARIOS) == {"pool_held", "sequential_tools", "agent_loop", "slow_query", "healthy", "queued_backend"}
    for spec in SCENARIOS.values():
        assert spec.duration_s <= 10 and spec.clients >= 1 and spec.paths
