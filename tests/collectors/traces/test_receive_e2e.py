"""`latprof receive` as a user runs it: a real stock-instrumented service exporting OTLP/HTTP to it, bodies of
every kind posted by hand, and the verdict when it stops - the same as the service's file export gets.

The receiver runs as `python -m latprof receive ...` in a subprocess and is stopped by its PID (SIGINT,
SIGTERM) or by `--duration`. The service is tests/collectors/traces/apps/traced_app.py under uvicorn, driven by
`otlp_harness.record_otlp` with `exporter_env` pointing its OTLPSpanExporter (protobuf) at the receiver.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import signal
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from attach.procs import free_port
from latprof.collectors.traces.otlp_json import read_otlp_json
from latprof.collectors.traces.receive import is_loopback, parse_listen
from otlp_harness import record_otlp
from otlp_receiver import file_exporter_json
from report_schema import assert_valid, printed_report

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
PROTOBUF, JSON = "application/x-protobuf", "application/json"
LIMIT = 16 * 1024 * 1024
T0 = 1_764_000_000_000_000_000
MS = 1_000_000
POOL_VERDICT = ("db.pool", "db-pool-exhaustion")


# --- the receiver process -------------------------------------------------------------------------


class Receive:
    """`python -m latprof receive --listen 127.0.0.1:PORT --out OUT --format json ARGS...`, ready when its port answers."""

    def __init__(self, tmp_path: Path, *args: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.out = tmp_path / "received.otlp.jsonl"
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._stdout, self._stderr = tmp_path / "receive.stdout", tmp_path / "receive.stderr"
        command = [sys.executable, "-m", "latprof", "receive", "--listen", f"127.0.0.1:{self.port}", "--out", str(self.out),
                   "--format", "json", *args]  # fmt: skip
        with open(self._stdout, "wb") as stdout, open(self._stderr, "wb") as stderr:
            self.proc = subprocess.Popen(command, cwd=ROOT, stdout=stdout, stderr=stderr)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"latprof receive did not start:\n{self.stderr}")
                time.sleep(0.05)

    @property
    def stderr(self) -> str:
        return self._stderr.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 90) -> tuple[int, str, str]:
        """Signal it by its PID (unless it has exited) and wait: (exit code, stdout, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        stdout = self._stdout.read_text(errors="replace")
        report = printed_report(stdout)
        if report is not None:  # what it printed is a report-v1 document
            assert_valid(report)
        return code, stdout, self.stderr

    def wait(self, timeout: float = 90) -> tuple[int, str, str]:
        """Wait for it to exit by itself (`--duration`)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        return self.stop(timeout=timeout)

    def report(self, sig: int = signal.SIGINT) -> dict[str, Any]:
        code, stdout, stderr = self.stop(sig)
        assert code == 0, stderr
        assert "Traceback" not in stderr, stderr
        return dict(json.loads(stdout))


@pytest.fixture
def receive(tmp_path: Path) -> Any:
    """`receive(*args)` starts a `Receive` in `tmp_path`; any still running at the end is killed (by its PID)."""
    started: list[Receive] = []

    def start(*args: str) -> Receive:
        started.append(Receive(tmp_path, *args))
        return started[-1]

    yield start
    for receiver in started:
        if receiver.proc.poll() is None:
            receiver.proc.kill()
            receiver.proc.wait()


def post(port: int, body: bytes | None, content_type: str | None = PROTOBUF, *, encoding: str | None = None,
         path: str = "/v1/traces", method: str = "POST", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        sent = {"Content-Type": content_type} if content_type else {}
        if encoding:
            sent["Content-Encoding"] = encoding
        sent.update(headers or {})
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def analyze(*paths: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "latprof", "analyze", "--format", "json", *map(str, paths)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def verdict(report: dict[str, Any]) -> tuple[str, str]:
    return report["verdict"]["layer"], report["verdict"]["rule"]


# --- requests built by hand -----------------------------------------------------------------------


def span(n: int, *, trace: int | None = None, span_id: bytes | None = None, start: int | None = None) -> trace_pb2.Span:
    begin = T0 + n * 100 * MS if start is None else start
    out = trace_pb2.Span(trace_id=(trace or n).to_bytes(16, "big"), span_id=span_id if span_id is not None else n.to_bytes(8, "big"),
                         name="GET /x", kind=2, start_time_unix_nano=begin, end_time_unix_nano=begin + 10 * MS)  # fmt: skip
    out.attributes.append(common_pb2.KeyValue(key="http.route", value=common_pb2.AnyValue(string_value="/x")))
    return out


def export_request(*spans: trace_pb2.Span) -> ExportTraceServiceRequest:
    msg = ExportTraceServiceRequest()
    rs = msg.resource_spans.add()
    rs.resource.attributes.append(common_pb2.KeyValue(key="service.name", value=common_pb2.AnyValue(string_value="by-hand")))
    rs.scope_spans.add().spans.extend(spans)
    return msg


def good(n: int = 1) -> bytes:
    return export_request(*[span(i) for i in range(1, n + 1)]).SerializeToString()


def response_of(body: bytes) -> ExportTraceServiceResponse:
    return ExportTraceServiceResponse.FromString(body)


def status_message(body: bytes, content_type: str) -> str:
    """The message of a `google.rpc.Status` body, protobuf or JSON."""
    if content_type == JSON:
        return str(json.loads(body)["message"])
    return str(status_pb2.Status.FromString(body).message)


# --- a real service -------------------------------------------------------------------------------


def test_a_service_exporting_protobuf_gets_its_file_exports_verdict_when_the_receiver_is_stopped(
    tmp_path: Path, receive: Any, recording: Callable[..., Path]
) -> None:
    receiver = receive()
    record_otlp(tmp_path / "app", "pool_held", db="sqlalchemy",
                exporter_env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.base_url}/v1/traces"})  # fmt: skip
    assert "Failed to export" not in (tmp_path / "app" / "server.log").read_text()
    report = receiver.report(signal.SIGINT)
    stderr = receiver.stderr
    assert f"listening on {receiver.base_url}/v1/traces" in stderr and "capture written to" in stderr
    assert report["source"]["kind"] == "receive" and report["source"]["inputs"] == [str(receiver.out)]
    assert verdict(report) == POOL_VERDICT, report["verdict"]
    assert report["window"]["requests"] >= 50
    later = analyze(receiver.out)  # the file it wrote, read again: plain OTLP JSON
    assert later["source"]["kind"] == "otlp" and verdict(later) == verdict(report)
    assert later["layers"] == report["layers"] and later["latency_ms"] == report["latency_ms"]
    file_export = analyze(recording("pool_held", "sqlalchemy"))  # the same scenario through the Collector-style file
    assert verdict(file_export) == verdict(report)


def test_only_the_base_endpoint_gzip_bodies_and_sigterm(tmp_path: Path, receive: Any) -> None:
    receiver = receive()
    record_otlp(tmp_path / "app", "pool_held", db="sqlalchemy", compression="gzip",
                exporter_env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url,  # the exporter appends /v1/traces
                              "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})  # fmt: skip
    assert "Failed to export" not in (tmp_path / "app" / "server.log").read_text()
    report = receiver.report(signal.SIGTERM)
    assert report["source"]["kind"] == "receive" and verdict(report) == POOL_VERDICT, report["verdict"]


def test_the_file_export_posted_as_json_bodies_for_a_duration_gets_the_same_report(
    receive: Any, recording: Callable[..., Path]
) -> None:
    source = recording("pool_held", "sqlalchemy")
    receiver = receive("--duration", "6")
    lines = [line for line in source.read_bytes().splitlines() if line.strip()]
    for i, line in enumerate(lines):
        encoding = [None, "gzip", "deflate"][i % 3]
        body = gzip.compress(line) if encoding == "gzip" else zlib.compress(line) if encoding == "deflate" else line
        status, headers, answer = post(receiver.port, body, JSON, encoding=encoding)
        assert (status, headers["content-type"], answer) == (200, JSON, b"{}"), answer  # an empty ExportTraceServiceResponse
    code, stdout, stderr = receiver.wait()  # stops by itself
    assert code == 0, stderr
    report = json.loads(stdout)
    expected = analyze(source)
    assert report["source"]["kind"] == "receive" and verdict(report) == verdict(expected) == POOL_VERDICT
    assert report["layers"] == expected["layers"] and report["window"] == expected["window"]
    assert len(read_otlp_json(receiver.out).spans) == len(read_otlp_json(source).spans)


def test_engine_metrics_go_to_a_capture_beside_the_traces_and_into_the_report(
    tmp_path: Path, receive: Any, recording: Callable[..., Path]
) -> None:
    from latprof.demo.provider import Provider

    source = recording("pool_held", "sqlalchemy")
    with Provider(ttft_ms=0, engine_max_running=2) as provider:
        receiver = receive("--duration", "4", "--engine-metrics", provider.metrics_url)
        for line in (line for line in source.read_bytes().splitlines() if line.strip()):
            assert post(receiver.port, line, JSON)[0] == 200
        code, stdout, stderr = receiver.wait()
    assert code == 0, stderr
    report = json.loads(stdout)
    assert verdict(report) == POOL_VERDICT  # the traces' verdict, unchanged
    [engine] = report["collection"]["engines"]
    assert engine["engine"] == "vllm" and engine["scrapes"] >= 3 and not engine["failed"], engine
    beside = receiver.out.with_name("received.engine.jsonl")
    assert beside.exists() and f"{receiver.out} {beside}" in stderr  # how to see the report again names both
    assert analyze(receiver.out, beside)["collection"]["engines"][0]["scrapes"] == engine["scrapes"]


def test_the_file_export_as_a_protobuf_stream_gets_the_same_verdict(tmp_path: Path, recording: Callable[..., Path]) -> None:
    source = recording("pool_held", "sqlalchemy")
    records = b""
    for line in source.read_bytes().splitlines():
        doc = json.loads(line)
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if sp.get(key):
                            sp[key] = base64.b64encode(bytes.fromhex(sp[key])).decode()
        data = json_format.ParseDict(doc, ExportTraceServiceRequest()).SerializeToString()
        records += len(data).to_bytes(4, "big") + data  # the Collector file exporter's `format: proto`
    path = tmp_path / "traces.binpb"
    path.write_bytes(gzip.compress(records))
    from_proto, from_json = analyze(path), analyze(source)
    assert from_proto["collection"]["collectors"] == ["otlp-proto"] and verdict(from_proto) == verdict(from_json)
    assert from_proto["layers"] == from_json["layers"]


# --- bodies by hand -------------------------------------------------------------------------------


def test_bad_requests_get_their_status_and_the_receiver_keeps_going(receive: Any) -> None:
    receiver = receive()
    port = receiver.port
    bomb = gzip.compress(bytes(LIMIT + 1024))  # ~16 KiB that inflate to over the limit
    assert len(bomb) < 100_000
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("garbage protobuf", {"body": b"\xff\xfe garbage \x00\x01"}, 400, "not a protobuf ExportTraceServiceRequest"),
        ("truncated protobuf", {"body": good(3)[:-4]}, 400, "not a protobuf ExportTraceServiceRequest"),
        ("not JSON", {"body": b"{nope", "content_type": JSON}, 400, "not valid JSON"),
        ("JSON array", {"body": b"[1, 2]", "content_type": JSON}, 400, "not an OTLP JSON ExportTraceServiceRequest"),
        ("bad gzip", {"body": b"not gzip at all", "encoding": "gzip"}, 400, "cannot be decompressed"),
        ("cut gzip", {"body": gzip.compress(good(3))[:-12], "encoding": "gzip"}, 400, "cut short"),
        ("wrong content type", {"body": good(), "content_type": "text/plain"}, 415, "unsupported content type"),
        ("no content type", {"body": good(), "content_type": None}, 415, "unsupported content type"),
        ("unknown encoding", {"body": good(), "encoding": "br"}, 415, "unsupported content encoding"),
        ("gzip bomb", {"body": bomb, "encoding": "gzip"}, 413, "over 16,777,216 bytes once decompressed"),
        ("GET", {"body": None, "method": "GET"}, 405, "GET is not allowed"),
        ("PUT", {"body": good(), "method": "PUT"}, 405, "PUT is not allowed"),
        ("other path", {"body": good(), "path": "/v1/metrics"}, 404, "no such path '/v1/metrics'"),
        ("GET other path", {"body": None, "method": "GET", "path": "/"}, 404, "no such path '/'"),
    ]
    for n, (name, request, status, message) in enumerate(cases, 1):
        got, headers, body = post(port, **request)
        assert got == status, (name, got, body)
        content_type = JSON if request.get("content_type") == JSON else PROTOBUF
        assert headers["content-type"] == content_type and message in status_message(body, content_type), (name, body)
        if status == 405:
            assert headers["allow"] == "POST"
        ok, _, answer = post(port, export_request(span(100 + n)).SerializeToString())  # still serving, still keeping
        assert ok == 200 and response_of(answer) == ExportTraceServiceResponse(), name
    # a Content-Length over the limit is refused before its body is read, and the connection closed
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("POST", "/v1/traces")
    conn.putheader("Content-Type", PROTOBUF)
    conn.putheader("Content-Length", str(LIMIT + 1))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413 and response.getheader("connection") == "close"
    assert "over 16,777,216" in status_message(response.read(), PROTOBUF)
    conn.close()
    # a chunked body is read too
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/traces", body=iter([good(2)[:10], good(2)[10:]]), headers={"Content-Type": PROTOBUF},
                 encode_chunked=True)  # fmt: skip
    assert conn.getresponse().status == 200
    conn.close()
    code, stdout, stderr = receiver.stop()
    assert code == 0 and "Traceback" not in stderr, stderr
    assert json.loads(stdout)["source"]["kind"] == "receive"
    assert f"refused {len(cases) + 1} request(s)" in stderr, stderr
    assert len(read_otlp_json(receiver.out).spans) == len(cases) + 2  # one span after each case, two chunked


def test_json_bodies_are_answered_in_otlp_json_with_partial_success(receive: Any) -> None:
    receiver = receive()
    doc = file_exporter_json(export_request(span(1), span(2), span(3, span_id=bytes(8))))
    status, headers, body = post(receiver.port, orjson.dumps(doc), JSON)
    assert (status, headers["content-type"]) == (200, JSON)
    assert json.loads(body) == {"partialSuccess": {"rejectedSpans": "1", "errorMessage": "skipped 1 span(s) without a valid spanId"}}
    status, _, body = post(receiver.port, export_request(span(4, span_id=b"\x01")).SerializeToString())  # protobuf: same reasons
    partial = response_of(body).partial_success
    assert status == 200 and (partial.rejected_spans, partial.error_message) == (1, "skipped 1 span(s) without a valid spanId")
    code, _, stderr = receiver.stop()
    assert code == 0 and "refused 2 span(s) that could not be read (e.g. skipped 1 span(s) without a valid spanId)" in stderr, stderr
    assert [s.span_id for s in read_otlp_json(receiver.out).spans] == [(1).to_bytes(8, "big").hex(), (2).to_bytes(8, "big").hex()]


def test_spans_over_max_spans_are_rejected_in_a_partial_success(receive: Any) -> None:
    receiver = receive("--max-spans", "5")
    status, _, body = post(receiver.port, good(3))
    assert status == 200 and not response_of(body).HasField("partial_success")
    status, _, body = post(receiver.port, export_request(*[span(i) for i in range(10, 14)]).SerializeToString())
    partial = response_of(body).partial_success
    assert status == 200 and partial.rejected_spans == 2 and "at most 5 spans (--max-spans): 2 refused" in partial.error_message
    status, _, body = post(receiver.port, export_request(span(20)).SerializeToString())
    assert status == 200 and response_of(body).partial_success.rejected_spans == 1
    code, _, stderr = receiver.stop()
    assert code == 0 and "refused 3 span(s) over --max-spans" in stderr, stderr
    kept = read_otlp_json(receiver.out).spans
    assert [int(s.span_id, 16) for s in kept] == [1, 2, 3, 10, 11]


# --- the command line -----------------------------------------------------------------------------


def receive_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "latprof", "receive", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_nothing_received_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "nothing.jsonl"
    done = receive_cli("--listen", f"127.0.0.1:{port}", "--out", str(out), "--duration", "1")
    assert done.returncode == 2 and done.stdout == ""
    last = done.stderr.splitlines()[-1]
    assert last == (f"latprof: error: no spans received on http://127.0.0.1:{port}/v1/traces; was OTEL_EXPORTER_OTLP_ENDPOINT"
                    f" set to http://127.0.0.1:{port}?")  # fmt: skip
    assert not out.exists()


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("nonsense", "expected HOST:PORT"),
        ("127.0.0.1:99999", "port 99999 is out of range"),
        ("127.0.0.1:http", "expected HOST:PORT"),
        ("::1:4318", "write an IPv6 address in brackets"),
        ("[127.0.0.1]:4318", "is not an IPv6 address"),
    ],
)
def test_a_bad_listen_value_is_one_line_and_exit_2(tmp_path: Path, listen: str, message: str) -> None:
    done = receive_cli("--listen", listen, "--out", str(tmp_path / "x.jsonl"), "--duration", "1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = receive_cli("--listen", f"127.0.0.1:{port}", "--out", str(tmp_path / "x.jsonl"), "--duration", "1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"--listen 127.0.0.1:{port}: cannot listen there" in done.stderr and "Traceback" not in done.stderr


def test_listen_values_and_loopback() -> None:
    assert parse_listen("127.0.0.1:4318") == ("127.0.0.1", 4318)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen("localhost:9") == ("localhost", 9)
    assert is_loopback("127.0.0.1") and is_loopback("127.8.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("::")
    # Names IDNA cannot encode (a label over 63 characters, an empty label) are not loopback, not a traceback.
    assert not is_loopback("a" * 70) and not is_loopback("a..b")
