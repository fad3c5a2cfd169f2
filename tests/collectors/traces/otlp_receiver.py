"""An OTLP/HTTP trace receiver on loopback that writes what it receives as JSON lines.

`OtlpReceiver(path)` serves `POST /v1/traces` on a free port of 127.0.0.1 (a
ThreadingHTTPServer in a background thread). A protobuf body (`Content-Encoding: gzip` or
`deflate` honoured; an `application/json` body is accepted too) is decoded as an
`ExportTraceServiceRequest` and answered with an empty `ExportTraceServiceResponse`. Each request
becomes ONE line appended to `path`:

- `mode="file-exporter"` (default): what the OpenTelemetry Collector's `file` exporter with
  `format: json` writes: lowerCamelCase keys, trace/span/parent/link ids as lowercase hex,
  64-bit integers (times, `intValue`) as decimal strings, `kind` and `status.code` as numbers;
- `mode="protobuf-json"`: `json_format.MessageToDict(request)` as protobuf writes it (base64 ids,
  enum names such as "SPAN_KIND_SERVER").

    with OtlpReceiver(tmp_path / "traces.otlp.jsonl") as receiver:
        ... OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.endpoint ...
        receiver.wait_idle(0.5)

Not a test module: `from otlp_receiver import OtlpReceiver` (pytest puts tests/collectors/traces on sys.path).
"""

from __future__ import annotations

import base64
import http.server
import json
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

HOST = "127.0.0.1"
TRACES_PATH = "/v1/traces"
#: A request body (compressed or not) larger than this is refused with 413.
MAX_BODY_BYTES = 16 * 1024 * 1024
MODES = ("file-exporter", "protobuf-json")


class PayloadTooLarge(ValueError):
    pass


def _hex(value: str) -> str:
    return base64.b64decode(value).hex()


def file_exporter_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """`request` as the Collector's `file` exporter (`format: json`) writes it."""
    doc = json_format.MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in doc.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _hex(span[key])
                if not span.get("parentSpanId"):
                    span.pop("parentSpanId", None)
                for link in span.get("links", ()):
                    for key in ("traceId", "spanId"):
                        if key in link:
                            link[key] = _hex(link[key])
    return doc


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ValueError(f"unsupported content-encoding {encoding!r}")
    # gzip: wbits 31; deflate: zlib-wrapped (15) or raw (-15) streams both occur in the wild
    candidates = (31,) if encoding == "gzip" else (15, -15)
    last: Exception | None = None
    for wbits in candidates:
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, MAX_BODY_BYTES + 1)
        except zlib.error as exc:
            last = exc
            continue
        if len(out) > MAX_BODY_BYTES or d.unconsumed_tail:
            raise PayloadTooLarge("decompressed body over the limit")
        return out
    raise ValueError(f"bad {encoding} body: {last}")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _reply(self, status: int, body: bytes, content_type: str, *, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        if close:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, *, close: bool = False) -> None:
        self._reply(status, json.dumps({"error": message}).encode(), "application/json", close=close)

    def do_GET(self) -> None:
        self._error(405 if self.path.split("?")[0] == TRACES_PATH else 404, "POST protobuf to /v1/traces")

    def do_POST(self) -> None:
        if self.path.split("?")[0] != TRACES_PATH:
            self._error(404, "no route", close=True)
            return
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            self._error(411, "a content-length is required", close=True)
            return
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            self._error(400, "bad content-length", close=True)
            return
        if length < 0 or length > MAX_BODY_BYTES:
            self._error(413, f"body over {MAX_BODY_BYTES} bytes", close=True)  # not read: close the connection
            return
        body = self.rfile.read(length)
        content_type = (self.headers.get("content-type") or "application/x-protobuf").split(";")[0].strip().lower()
        request = ExportTraceServiceRequest()
        try:
            raw = _decompress(body, self.headers.get("content-encoding") or "")
            if content_type == "application/json":
                json_format.Parse(raw, request)
            else:
                request.ParseFromString(raw)
        except PayloadTooLarge as exc:
            self._error(413, str(exc))
            return
        except Exception as exc:  # a body we cannot decode
            self._error(400, f"cannot decode the body: {type(exc).__name__}: {exc}")
            return
        self.server.owner._record(request)
        if content_type == "application/json":
            self._reply(200, b"{}", "application/json")
        else:
            self._reply(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: OtlpReceiver

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # an exporter that left early is no error
            super().handle_error(request, client_address)


class OtlpReceiver:
    """The receiver in a background thread; a context manager. `path` is created (truncated) at start."""

    def __init__(self, path: str | Path, mode: str = "file-exporter") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.path = Path(path)
        self.mode = mode
        self.spans_received = 0
        self.requests_received = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._last_request = time.monotonic()
        self._file: Any = None
        self.server = _Server((HOST, 0), _Handler)
        self.server.owner = self
        self.port = int(self.server.server_address[1])
        self.endpoint = f"http://{HOST}:{self.port}{TRACES_PATH}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    def start(self) -> OtlpReceiver:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")
        self._last_request = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _record(self, request: ExportTraceServiceRequest) -> None:
        doc = file_exporter_json(request) if self.mode == "file-exporter" else json_format.MessageToDict(request)
        line = json.dumps(doc, separators=(",", ":")) + "\n"
        spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self._changed:
            if self._file is not None:
                self._file.write(line)
                self._file.flush()
            self.spans_received += spans
            self.requests_received += 1
            self._last_request = time.monotonic()
            self._changed.notify_all()

    def wait_for_spans(self, n: int, timeout: float = 10.0) -> bool:
        """Wait until at least `n` spans arrived (True), or `timeout` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.spans_received < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def wait_idle(self, quiet_s: float = 0.5, timeout: float = 10.0) -> bool:
        """Wait until no request arrived for `quiet_s` seconds (True), or `timeout` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                quiet_until = self._last_request + quiet_s
            now = time.monotonic()
            if now >= quiet_until:
                return True
            if now >= deadline:
                return False
            time.sleep(min(quiet_until, deadline) - now)
