"""`latprof receive`: an OTLP/HTTP trace endpoint that writes what services export to it as a trace file to diagnose.

`Receiver` serves `POST /v1/traces` (a `ThreadingHTTPServer`, one thread per connection) with
bodies in protobuf (`application/x-protobuf`) or OTLP JSON (`application/json`), plain, gzip or
deflate. Each request is decoded by the trace readers (`collectors/traces/otlp_proto.py`,
`collectors/traces/otlp_json.py`: same spans, same skip reasons) and its readable spans are appended
to the output file at once, as one line of OTLP JSON in the shape the Collector's `file`
exporter writes (hex ids), which `latprof analyze` reads. What is held in memory is one request
at a time per decoding slot: a request over `max_request_bytes` (compressed, or once
decompressed) is refused with 413, and spans past `max_spans` in all are refused in the
response's partial success, as are spans that cannot be read.

Responses follow the OTLP/HTTP specification: 200 with an `ExportTraceServiceResponse` (its
`partial_success` says how many spans were rejected and why) in the request's encoding; 400
for a body that cannot be decoded, 404 for another path, 405 for another method, 413 and 415,
503 while stopping, each with a `google.rpc.Status` body.

The file keeps what latprof reads of each span (ids, name, kind, times, attributes, events,
links, status code, resource attributes, scope name): a trace state, a status message, a scope
version or dropped-attribute counts are not written.
"""

from __future__ import annotations

import dataclasses
import http.server
import ipaddress
import math
import socket
import socketserver
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Mapping, NamedTuple, Sequence

import orjson

from latprof.collectors.traces import otlp_json, otlp_proto
from latprof.collectors.traces.spans import Span
from latprof.errors import ConfigError, InputError

DEFAULT_LISTEN = "127.0.0.1:4318"
TRACES_PATH = "/v1/traces"
#: A request body over this, compressed or once decompressed, is refused with 413 (the Collector's default is 20 MiB).
MAX_REQUEST_BYTES = 16 * 1024 * 1024
#: Spans kept in all; beyond, requests are answered with a partial success rejecting the rest.
DEFAULT_MAX_SPANS = 2_000_000
#: Requests read and decoded at once; each holds up to twice `MAX_REQUEST_BYTES` and its decoded messages.
DECODE_SLOTS = 4
#: Seconds a connection may sit idle or send its body slowly before it is closed.
CONNECTION_TIMEOUT_S = 60.0
#: Seconds to let requests already being read finish once stopping.
DRAIN_S = 5.0
_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
_JSON_TYPE = "application/json"
#: gRPC codes in the `google.rpc.Status` of an error response (informational: OTLP/HTTP clients read the HTTP status).
_RPC_CODES = {400: 3, 404: 5, 405: 12, 413: 3, 415: 3, 500: 13, 503: 14}
_ERROR_EXAMPLES = 5


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[IPv6]:PORT`) to its host and port; raises `ConfigError` (one line)."""
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"--listen {value!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    port = int(port_text)
    if port > 65535:
        raise ConfigError(f"--listen {value!r}: port {port} is out of range (0-65535)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            if ipaddress.ip_address(host).version != 6:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--listen {value!r}: {host!r} in brackets is not an IPv6 address") from None
    elif ":" in host:
        raise ConfigError(f"--listen {value!r}: write an IPv6 address in brackets, e.g. [::1]:4318")
    return host, port


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback one (127.0.0.0/8, ::1); an unresolvable name is not."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


@dataclass
class ReceiveStats:
    """What a receiver has taken in so far."""

    #: Export requests answered 200 (a partial success included).
    requests: int = 0
    #: Spans kept (written to the file).
    spans: int = 0
    #: Spans refused because they could not be read (bad ids, times, ...).
    rejected_spans: int = 0
    #: Spans refused because `max_spans` were kept already.
    dropped_spans: int = 0
    #: Requests refused, by HTTP status.
    refused: dict[int, int] = field(default_factory=dict)
    #: The first few distinct reasons spans were rejected or dropped ("skipped 3 span(s) without a valid spanId").
    problems: list[str] = field(default_factory=list)

    def summary_lines(self) -> list[str]:
        """What was refused, one line each (none when everything was kept)."""
        lines = []
        if self.rejected_spans or self.dropped_spans:
            parts = [f"{self.rejected_spans:,} span(s) that could not be read"] if self.rejected_spans else []
            parts += [f"{self.dropped_spans:,} span(s) over --max-spans"] if self.dropped_spans else []
            lines.append(f"refused {' and '.join(parts)} (e.g. {'; '.join(self.problems)})")
        if self.refused:
            statuses = ", ".join(f"{count} with {status}" for status, count in sorted(self.refused.items()))
            lines.append(f"refused {sum(self.refused.values())} request(s): {statuses}")
        return lines


class Reply(NamedTuple):
    """An HTTP response: status, body, its content type; `close` when the request's body was not read."""

    status: int
    body: bytes
    content_type: str
    close: bool = False


class _Refused(Exception):
    """A request answered with an error status (`status`, one-line `message`)."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close


class Receiver:
    """An OTLP/HTTP trace endpoint on `host:port` appending what it receives to `out`.

    Binding happens here (`ConfigError` when the address cannot be listened on, `InputError`
    when `out` cannot be written); `serve` runs it until stopped and `close` ends it (both
    idempotent). `export` is the request handling without HTTP: content type and encoding in,
    the reply out.
    """

    def __init__(self, host: str, port: int, out: str | Path, *, max_spans: int = DEFAULT_MAX_SPANS,
                 max_request_bytes: int = MAX_REQUEST_BYTES) -> None:  # fmt: skip
        self.host = host
        self.out = Path(out)
        self.max_spans = max_spans
        self.max_request_bytes = max_request_bytes
        self.stats = ReceiveStats()
        #: The error that stopped writing the file, if one did.
        self.write_error: str | None = None
        self._lock = threading.Condition()
        self._slots = threading.BoundedSemaphore(DECODE_SLOTS)
        self._in_flight = 0
        self._closed = False
        self._serving = False
        # strings and ids shared by all requests' spans (one object each)
        self._shared: dict[str, str] = {}
        self._hex_ids: dict[bytes, str] = {}
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = server_class((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(f"--listen {_host_port(host, port)}: cannot listen there: {exc.strerror or exc}") from None
        except OverflowError as exc:
            raise ConfigError(f"--listen {_host_port(host, port)}: {exc}") from None
        self._server.receiver = self
        self.port = int(self._server.server_address[1])
        try:
            self._file: IO[bytes] | None = open(self.out, "wb")
        except OSError as exc:
            self._server.server_close()
            raise InputError(f"{self.out}: cannot write: {exc.strerror or exc}") from None
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="latprof-receive", daemon=True)  # fmt: skip

    @property
    def base_url(self) -> str:
        """What `OTEL_EXPORTER_OTLP_ENDPOINT` should be set to (the exporter appends `/v1/traces`)."""
        return f"http://{_host_port(self.host, self.port)}"

    @property
    def endpoint(self) -> str:
        """What `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` should be set to."""
        return self.base_url + TRACES_PATH

    def snapshot(self) -> ReceiveStats:
        with self._lock:
            return dataclasses.replace(self.stats, refused=dict(self.stats.refused), problems=list(self.stats.problems))

    # --- running ------------------------------------------------------------------------------

    def serve(self, stop: threading.Event, duration_s: float | None = None,
              on_progress: Callable[[ReceiveStats, float], None] | None = None, tick_s: float = 0.5) -> ReceiveStats:  # fmt: skip
        """Serve until `stop` is set or `duration_s` seconds passed, calling `on_progress` every `tick_s`; then `close`."""
        started = time.monotonic()
        deadline = None if duration_s is None else started + duration_s
        self._serving = True
        self._thread.start()
        try:
            while not stop.is_set():
                wait = tick_s if deadline is None else min(tick_s, deadline - time.monotonic())
                if wait <= 0:
                    break
                stop.wait(wait)
                if on_progress is not None:
                    on_progress(self.snapshot(), time.monotonic() - started)
        finally:
            self.close()
        return self.snapshot()

    def close(self) -> None:
        """Stop accepting, let the requests being read finish (up to `DRAIN_S`), close the file."""
        if self._serving:
            self._serving = False
            self._server.shutdown()
            self._thread.join(DRAIN_S)
        self._server.server_close()
        deadline = time.monotonic() + DRAIN_S
        with self._lock:
            while self._in_flight and time.monotonic() < deadline:
                self._lock.wait(max(0.0, deadline - time.monotonic()))
            self._closed = True
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as exc:
                    self.write_error = self.write_error or (exc.strerror or str(exc))
                self._file = None

    # --- requests -----------------------------------------------------------------------------

    def export(self, content_type: str, content_encoding: str, body: bytes) -> Reply:
        """Handle one `POST /v1/traces` whose body was read: decode, keep what can be kept, answer."""
        as_json = _media_type(content_type) == _JSON_TYPE
        try:
            if not as_json and _media_type(content_type) not in _PROTOBUF_TYPES:
                raise _Refused(415, f"unsupported content type {content_type!r}: send application/x-protobuf or application/json")
            raw = self._decompress(body, content_encoding)
            spans, problems, offered = self._decode(raw, as_json)
            rejected = offered - len(spans)
            return self._keep(spans, rejected, problems, as_json)
        except _Refused as refused:
            return self.refuse(refused.status, str(refused), json=as_json, close=refused.close)

    def refuse(self, status: int, message: str, *, json: bool = False, close: bool = False) -> Reply:
        """An error reply (a `google.rpc.Status` body), counted."""
        with self._lock:
            self.stats.refused[status] = self.stats.refused.get(status, 0) + 1
        body = otlp_proto.rpc_status(_RPC_CODES.get(status, 2), message, json=json)
        return Reply(status, body, _JSON_TYPE if json else _PROTOBUF_TYPES[0], close)

    def _decompress(self, body: bytes, content_encoding: str) -> bytes:
        encoding = content_encoding.strip().lower()
        limit = self.max_request_bytes
        if encoding in ("", "identity"):
            return body
        if encoding in ("gzip", "x-gzip"):
            candidates: tuple[int, ...] = (31,)
        elif encoding == "deflate":
            candidates = (15, -15)  # zlib-wrapped, as the spec says, and raw, as some clients send it
        else:
            raise _Refused(415, f"unsupported content encoding {content_encoding!r}: send gzip, deflate or none")
        error = ""
        for wbits in candidates:
            try:
                return _inflate(body, wbits, limit)
            except zlib.error as exc:
                error = str(exc)
        raise _Refused(400, f"the {encoding} body cannot be decompressed: {error}")

    def _decode(self, raw: bytes, as_json: bool) -> tuple[list[Span], list[str], int]:
        if as_json:
            try:
                doc = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise _Refused(400, f"the body is not valid JSON: {exc}") from None
            try:
                spans, problems, offered = otlp_json.spans_from_document(doc)
            except TypeError as exc:
                raise _Refused(400, f"the body is not an OTLP JSON ExportTraceServiceRequest: {exc}") from None
            return list(spans), list(problems), int(offered)
        try:
            msg = otlp_proto.parse_request(raw)
        except ValueError as exc:
            raise _Refused(400, f"the body is {exc}") from None
        counters = otlp_proto.Counters(self._shared, self._hex_ids)
        spans = otlp_proto.spans_from_request(msg, counters)
        return list(spans), list(counters.warnings()), int(counters.offered)

    def _keep(self, spans: list[Span], rejected: int, problems: list[str], as_json: bool) -> Reply:
        """Write the spans that fit under `max_spans`; the reply's partial success counts the rest."""
        with self._lock:
            if self._closed:
                raise _Refused(503, "latprof receive is stopping")
            if self.write_error is not None:
                raise _Refused(503, f"latprof receive cannot write {self.out}: {self.write_error}")
            room = max(0, self.max_spans - self.stats.spans)
            dropped = max(0, len(spans) - room)
            if dropped:
                del spans[room:]
                problems.append(f"latprof receive keeps at most {self.max_spans:,} spans (--max-spans): {dropped} refused")
            if spans and self._file is not None:
                try:
                    self._file.write(encode_request(spans) + b"\n")
                    self._file.flush()
                except OSError as exc:
                    self.write_error = exc.strerror or str(exc)
                    raise _Refused(503, f"latprof receive cannot write {self.out}: {self.write_error}") from None
            stats = self.stats
            stats.requests += 1
            stats.spans += len(spans)
            stats.rejected_spans += rejected
            stats.dropped_spans += dropped
            for problem in problems:
                if len(stats.problems) < _ERROR_EXAMPLES and problem not in stats.problems:
                    stats.problems.append(problem)
        body = otlp_proto.export_response(rejected + dropped, "; ".join(problems), json=as_json)
        return Reply(200, body, _JSON_TYPE if as_json else _PROTOBUF_TYPES[0])

    def _begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def _end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._lock.notify_all()


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    """`body` decompressed (every gzip member of it); `_Refused` 413 past `limit` bytes, 400 when cut short; `zlib.error`."""
    out = bytearray()
    rest = body
    while True:
        inflater = zlib.decompressobj(wbits)
        out += inflater.decompress(rest, limit + 1 - len(out))
        if len(out) > limit:
            raise _Refused(413, f"the body is over {limit:,} bytes once decompressed")
        if not inflater.eof:
            raise _Refused(400, "the compressed body is cut short")
        rest = inflater.unused_data
        if wbits != 31 or not rest.startswith(b"\x1f\x8b"):
            break
    if rest.strip(b"\0"):
        raise _Refused(400, f"{len(rest)} byte(s) after the end of the compressed body")
    return bytes(out)


# --- HTTP ---------------------------------------------------------------------------------------


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    receiver: Receiver

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host's name up (getfqdn): slow, and not needed
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client that left is no error
            super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "latprof-receive"
    timeout = CONNECTION_TIMEOUT_S
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the progress line says what arrives
        pass

    def _send(self, reply: Reply, *, head: bool = False) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        if reply.status == 405:
            self.send_header("Allow", "POST")
        if reply.close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if not head:
            self.wfile.write(reply.body)

    def _wants_json(self) -> bool:
        return _media_type(self.headers.get("Content-Type") or "") == _JSON_TYPE

    def _not_post(self) -> None:
        receiver = self.server.receiver
        path = self.path.split("?", 1)[0]
        if path == TRACES_PATH:
            reply = receiver.refuse(405, f"{self.command} is not allowed on {TRACES_PATH}: POST the spans", json=self._wants_json(), close=True)
        else:
            reply = receiver.refuse(404, f"no such path {path!r}: POST spans to {TRACES_PATH}", json=self._wants_json(), close=True)
        self._send(reply, head=self.command == "HEAD")

    do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_post

    def do_POST(self) -> None:
        receiver = self.server.receiver
        receiver._begin()
        try:
            try:
                reply = self._post(receiver)
            except (ConnectionError, TimeoutError):
                raise  # the client left: nobody to answer
            except Exception as exc:  # a bug of ours must cost this request, not the receiver or its report
                reply = receiver.refuse(500, f"latprof receive failed on this request: {type(exc).__name__}: {exc}",
                                        json=self._wants_json(), close=True)  # fmt: skip
            self._send(reply)
        finally:
            receiver._end()

    def _post(self, receiver: Receiver) -> Reply:
        as_json = self._wants_json()
        path = self.path.split("?", 1)[0]
        if path != TRACES_PATH:
            return receiver.refuse(404, f"no such path {path!r}: POST spans to {TRACES_PATH}", json=as_json, close=True)
        content_type = self.headers.get("Content-Type") or ""
        if not as_json and _media_type(content_type) not in _PROTOBUF_TYPES:
            return receiver.refuse(415, f"unsupported content type {content_type!r}: send application/x-protobuf or application/json",
                                   close=True)  # fmt: skip
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        if encoding not in ("", "identity", "gzip", "x-gzip", "deflate"):
            return receiver.refuse(415, f"unsupported content encoding {encoding!r}: send gzip, deflate or none", json=as_json,
                                   close=True)  # fmt: skip
        with receiver._slots:  # bounds the bodies held at once
            try:
                body = self._read_body(receiver.max_request_bytes)
            except _Refused as refused:
                return receiver.refuse(refused.status, str(refused), json=as_json, close=True)
            return receiver.export(content_type, encoding, body)

    def _read_body(self, limit: int) -> bytes:
        """The request's body (Content-Length or chunked); `_Refused` 413 past `limit` (nothing more is read), 400 when malformed."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = bytearray()
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise _Refused(400, "malformed chunked body") from None
                if size == 0:
                    while self.rfile.readline(1024).strip():  # trailers
                        pass
                    return bytes(chunks)
                if len(chunks) + size > limit:
                    raise _Refused(413, f"the body is over {limit:,} bytes")
                chunk = self.rfile.read(size)
                if len(chunk) < size:
                    raise ConnectionResetError("the client left mid-body")
                chunks += chunk
                self.rfile.readline(8)
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            return b""
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError
        except ValueError:
            raise _Refused(400, f"bad Content-Length {length_text!r}") from None
        if length > limit:
            raise _Refused(413, f"the body is {length:,} bytes, over {limit:,}")
        body = self.rfile.read(length)
        if len(body) < length:
            raise ConnectionResetError("the client left mid-body")
        return body


# --- the file -----------------------------------------------------------------------------------


def encode_request(spans: Sequence[Span]) -> bytes:
    """`spans` as one OTLP JSON `ExportTraceServiceRequest`, as the Collector's `file` exporter writes it.

    Spans in a row with the same resource mapping and scope share a resourceSpans and scopeSpans
    element. What the OTLP JSON reader reads back is the same spans.
    """
    resource_spans: list[dict[str, Any]] = []
    scope_spans: list[dict[str, Any]] = []
    current: list[dict[str, Any]] = []
    last_resource: Mapping[str, Any] | None = None
    last_scope: str | None = None
    for span in spans:
        if span.resource is not last_resource:
            scope_spans = []
            resource_spans.append({"resource": {"attributes": _key_values(span.resource)}, "scopeSpans": scope_spans})
            last_resource, last_scope = span.resource, None
        if span.scope != last_scope:
            current = []
            scope_spans.append({"scope": {"name": span.scope} if span.scope else {}, "spans": current})
            last_scope = span.scope
        out: dict[str, Any] = {"traceId": span.trace_id, "spanId": span.span_id}
        if span.parent_id:
            out["parentSpanId"] = span.parent_id
        out["name"] = span.name
        out["kind"] = span.kind
        out["startTimeUnixNano"] = str(span.start_ns)
        out["endTimeUnixNano"] = str(span.end_ns)
        if span.attrs:
            out["attributes"] = _key_values(span.attrs)
        if span.events:
            out["events"] = [{"timeUnixNano": str(ev.ts_ns), "name": ev.name, "attributes": _key_values(ev.attrs)}
                             for ev in span.events]  # fmt: skip
        if span.dropped_events:
            out["droppedEventsCount"] = span.dropped_events
        if span.links:
            out["links"] = [{"traceId": link.trace_id, "spanId": link.span_id} for link in span.links]
        out["status"] = {"code": span.status_code} if span.status_code else {}
        current.append(out)
    return orjson.dumps({"resourceSpans": resource_spans})


def _key_values(attrs: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _any_value(value)} for key, value in attrs.items()]


def _any_value(value: Any) -> dict[str, Any]:
    """An OTLP JSON `AnyValue` of a flat attribute value (as the readers make them)."""
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is bool:
        return {"boolValue": value}
    if kind is int:
        return {"intValue": str(value)}
    if kind is float:
        if math.isfinite(value):
            return {"doubleValue": value}
        return {"doubleValue": "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"}
    if kind is list:
        return {"arrayValue": {"values": [_any_value(item) for item in value]}}
    if kind is dict:
        return {"kvlistValue": {"values": _key_values(value)}}
    return {"stringValue": str(value)}
