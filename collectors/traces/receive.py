"""`latprof receive`: an OTLP/HTTP trace endpoint that writes what services export to it as a trace file to diagnose.

`Receiver` serves `POST /v1/traces` (a `ThreadingHTTPServer`, one thread per connection) with
bodies in protobuf (`application/x-protobuf`) or OTLP JSON (`application/json`), plain, gzip or
deflate. Each request is decoded by the trace readers (`collectors/traces/otlp_proto.py`,
`collectors/traces/otlp_json.py`: same spans, same skip reasons) and its readable spans are appended
to the output file at once, as one line of OTLP JSON in the shape the Collector's `file`
exporter writes (hex ids), which `latprof analyze` reads. A request over `max_request_bytes`
(compressed, or once decompressed) is refused with 413, and spans past `max_spans` in all are
refused in the response's partial success, as are spans that cannot be read.

What a client can hold is bounded (`Limits`): connections (one thread each) are capped, and at
the cap a new connection takes the place of the one waiting longest for a request, its headers
or its body (none waiting: the new one gets a 503); a request's headers and its body each have
a deadline, an idle connection is closed after a while, and headers are capped in size. Bodies
are read in pieces as they arrive, outside the decoding slots (a slow client holds no slot): the
first `small_body_bytes` of each at once, the bodies beyond that `large_bodies` at a time. Only
requests read in full are decoded and written. Locks are taken in one order (a large body's
slot, a decompressing slot, a decoding lane, the file's lock): no request waits on another
that waits on it.

Responses follow the OTLP/HTTP specification: 200 with an `ExportTraceServiceResponse` (its
`partial_success` says how many spans were rejected and why) in the request's encoding; 400
for a body that cannot be decoded, 404 for another path, 405 for another method, 413 and 415,
503 while stopping or at the connection cap, each with a `google.rpc.Status` body.

The file keeps what latprof reads of each span (ids, name, kind, times, attributes, events,
links, status code, resource attributes, scope name): a trace state, a status message, a scope
version or dropped-attribute counts are not written, nor attributes that may hold a service's
data (`_PRIVATE_KEYS`: prompts, completions, tool arguments and results, headers, SQL parameters,
exception messages, the command line), and URLs are written without their query string.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import ipaddress
import math
import re
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
from latprof.collectors.traces.genai_spans import CONTENT_KEYS, is_raw_payload
from latprof.collectors.traces.spans import Span
from latprof.digests import conversation_digest
from latprof.errors import ConfigError, InputError
from latprof.semconv import GEN_AI_CONVERSATION_ID, HTTP_REQUEST_HEADER_X_REQUEST_START, HTTP_REQUEST_HEADER_X_REQUEST_START_PY

DEFAULT_LISTEN = "127.0.0.1:4318"
TRACES_PATH = "/v1/traces"
#: A request body over this, compressed or once decompressed, is refused with 413 (the Collector's default is 20 MiB).
MAX_REQUEST_BYTES = 16 * 1024 * 1024
#: Spans kept in all; beyond, requests are answered with a partial success rejecting the rest.
DEFAULT_MAX_SPANS = 2_000_000
#: Compressed bodies decompressed and decoded at once (each holds up to `MAX_REQUEST_BYTES` decompressed).
INFLATE_SLOTS = 4
#: Requests decoded at once with up to `SMALL_DECODE_BYTES` (once decompressed): the usual exporter batches.
SMALL_DECODE_SLOTS = 2
SMALL_DECODE_BYTES = 1024 * 1024
#: ... and larger ones, one at a time: a 16 MiB body of small spans decodes to some 300,000 spans (~250 MB, seconds of
#: CPU); the small lane keeps the usual batches from waiting behind it.
LARGE_DECODE_SLOTS = 1
_PIECE = 64 * 1024
#: gzip members in a body (exporters send one; each costs a decompressor).
_MAX_GZIP_MEMBERS = 1000
#: Seconds to let requests already being read finish once stopping.
DRAIN_S = 5.0
_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
_JSON_TYPE = "application/json"
#: gRPC codes in the `google.rpc.Status` of an error response (informational: OTLP/HTTP clients read the HTTP status).
_RPC_CODES = {400: 3, 404: 5, 405: 12, 413: 3, 415: 3, 500: 13, 503: 14}
_ERROR_EXAMPLES = 5


@dataclass(frozen=True)
class Limits:
    """What one client, or all of them, can make the receiver hold; the defaults are what `latprof receive` uses."""

    #: Connections open at once (one thread each); at the cap the longest-waiting one not being answered is closed.
    max_connections: int = 256
    #: Seconds a kept-alive connection may wait for its next request.
    idle_timeout_s: float = 60.0
    #: Seconds from a request's first byte to the end of its headers.
    header_timeout_s: float = 10.0
    #: Bytes of a request's line and headers together (over: 431).
    max_header_bytes: int = 64 * 1024
    #: Seconds from the end of the headers to the end of the body (16 MiB at 280 KB/s).
    body_timeout_s: float = 60.0
    #: Bytes of each body read at once; a body larger than this waits for one of the `large_bodies` slots.
    small_body_bytes: int = 256 * 1024
    #: Bodies over `small_body_bytes` read (and answered) at once.
    large_bodies: int = 4


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
    except (OSError, UnicodeError):  # UnicodeError: a name IDNA cannot encode (a label over 63 characters)
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
                 max_request_bytes: int = MAX_REQUEST_BYTES, limits: Limits = Limits()) -> None:  # fmt: skip
        self.host = host
        self.limits = limits
        self.out = Path(out)
        self.max_spans = max_spans
        self.max_request_bytes = max_request_bytes
        self.stats = ReceiveStats()
        #: The error that stopped writing the file, if one did.
        self.write_error: str | None = None
        self._lock = threading.Condition()
        self._large_bodies = threading.BoundedSemaphore(limits.large_bodies)
        self._inflating = threading.BoundedSemaphore(INFLATE_SLOTS)
        self._small_lane = threading.BoundedSemaphore(SMALL_DECODE_SLOTS)
        self._large_lane = threading.BoundedSemaphore(LARGE_DECODE_SLOTS)
        self._in_flight = 0
        self._closed = False
        self._serving = False
        # strings and ids shared by all requests' spans (one object each)
        self._shared: dict[str, str] = {}
        self._hex_ids: dict[bytes, str] = {}
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = server_class((host, port), _Handler, limits.max_connections)
        except OSError as exc:
            raise ConfigError(f"--listen {_host_port(host, port)}: cannot listen there: {exc.strerror or exc}") from None
        except (OverflowError, UnicodeError) as exc:
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
            if content_encoding.strip().lower() in ("", "identity"):
                return self._decode_keep(body, as_json)
            with self._inflating:  # held until answered: it bounds the decompressed bodies held at once
                return self._decode_keep(self._decompress(body, content_encoding), as_json)
        except _Refused as refused:
            return self.refuse(refused.status, str(refused), json=as_json, close=refused.close)

    def _decode_keep(self, raw: bytes, as_json: bool) -> Reply:
        with self._small_lane if len(raw) <= SMALL_DECODE_BYTES else self._large_lane:
            spans, problems, offered = self._decode(raw, as_json)
            del raw
            return self._keep(spans, offered - len(spans), problems, as_json)

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
        line = _encode_line(spans)  # before taking the lock: a large request's encoding must not hold up the others
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
                line = _encode_line(spans)
            if spans and self._file is not None:
                try:
                    self._file.write(line)
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


def _encode_line(spans: Sequence[Span]) -> bytes:
    """`spans` as a line of the file (nothing when none); `_Refused` 400 when they cannot be written as JSON."""
    if not spans:
        return b""
    try:
        return encode_request(spans) + b"\n"
    except TypeError as exc:  # orjson's recursion limit (255 levels): values nested deeper than JSON files hold
        raise _Refused(400, f"the spans cannot be written as OTLP JSON: {exc}") from None


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    """`body` decompressed (every gzip member of it); `_Refused` 413 past `limit` bytes, 400 when cut short; `zlib.error`.

    The input is given a piece at a time: what is left of it is never copied whole after each gzip member
    (a body of many tiny members would cost a copy of the rest per member).
    """
    out = bytearray()
    view = memoryview(body)
    at = 0
    for _ in range(_MAX_GZIP_MEMBERS):
        inflater = zlib.decompressobj(wbits)
        while not inflater.eof and at < len(view):
            piece = view[at:at + _PIECE]
            out += inflater.decompress(piece, limit + 1 - len(out))
            if len(out) > limit:
                raise _Refused(413, f"the body is over {limit:,} bytes once decompressed")
            at += len(piece) - len(inflater.unused_data) - len(inflater.unconsumed_tail)
        if not inflater.eof:
            raise _Refused(400, "the compressed body is cut short")
        if wbits != 31 or bytes(view[at:at + 2]) != b"\x1f\x8b":
            break
    else:
        raise _Refused(400, f"the gzip body has over {_MAX_GZIP_MEMBERS:,} members")
    rest = bytes(view[at:])
    if rest.strip(b"\0"):
        raise _Refused(400, f"{len(rest)} byte(s) after the end of the compressed body")
    return bytes(out)


# --- HTTP ---------------------------------------------------------------------------------------


class _Conn:
    """One open connection: what it is waiting for (`idle`, `head`, `body`; `work` while answered) and until when."""

    __slots__ = ("sock", "phase", "since", "deadline", "closed")

    def __init__(self, sock: socket.socket, idle_timeout_s: float) -> None:
        self.sock = sock
        self.closed = False
        self.enter("idle", idle_timeout_s)

    def enter(self, phase: str, timeout_s: float | None) -> None:
        self.phase, self.since = phase, time.monotonic()
        self.deadline = math.inf if timeout_s is None else self.since + timeout_s

    def close(self) -> None:
        """Shut the socket: its thread's blocked read returns at once and the connection ends."""
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of exporters connecting at once waits in the backlog, not in SYN retries
    receiver: Receiver

    def __init__(self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler], max_connections: int) -> None:
        self.max_connections = max_connections
        self.conns: dict[int, _Conn] = {}
        self._conns_lock = threading.Lock()
        super().__init__(address, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host's name up (getfqdn): slow, and not needed
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client that left is no error
            super().handle_error(request, client_address)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Start the connection's thread; at the cap, close the longest-waiting connection first (none: answer 503)."""
        limits = self.receiver.limits
        with self._conns_lock:
            open_conns = [conn for conn in self.conns.values() if not conn.closed]
            if len(open_conns) >= self.max_connections:
                waiting = [conn for conn in open_conns if conn.phase != "work"]
                if not waiting:
                    self._busy(request)
                    return
                min(waiting, key=lambda conn: conn.since).close()
            self.conns[id(request)] = _Conn(request, limits.idle_timeout_s)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conns_lock:
                self.conns.pop(id(request), None)

    def service_actions(self) -> None:
        """Close the connections past their deadline (`serve_forever` calls this every poll)."""
        now = time.monotonic()
        with self._conns_lock:
            late = [conn for conn in self.conns.values() if not conn.closed and conn.deadline < now]
        for conn in late:
            conn.close()

    def _busy(self, request: socket.socket) -> None:
        reply = self.receiver.refuse(503, f"latprof receive has {self.max_connections} connections open, its limit: retry later")
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: {reply.content_type}\r\nContent-Length: {len(reply.body)}\r\n"
                "Retry-After: 1\r\nConnection: close\r\n\r\n")  # fmt: skip
        try:
            request.settimeout(1.0)
            request.sendall(head.encode("ascii") + reply.body)
        except OSError:
            pass
        self.shutdown_request(request)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _HeadReader:
    """The connection's reader while a request's line and headers are read: over `limit` bytes in all, `HTTPException`."""

    def __init__(self, raw: Any, limit: int) -> None:
        self.raw, self.left = raw, limit
        self.last = b""

    def readline(self, size: int = -1) -> bytes:
        line: bytes = self.raw.readline(self.left + 1 if size < 0 else min(size, self.left + 1))
        self.left -= len(line)
        self.last = line
        if self.left < 0:
            raise http.client.HTTPException("the request's headers are over the size limit")
        return line


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "latprof-receive"
    server: _Server
    raw_requestline: bytes
    _conn: _Conn

    def setup(self) -> None:
        limits = self.server.receiver.limits
        super().setup()
        self.connection.settimeout(max(limits.idle_timeout_s, limits.header_timeout_s, limits.body_timeout_s) + 5)  # a backstop
        conn = self.server.conns.get(id(self.request))
        self._conn = conn if conn is not None else _Conn(self.request, limits.idle_timeout_s)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the progress line says what arrives
        pass

    def handle_one_request(self) -> None:
        limits = self.server.receiver.limits
        self._conn.enter("idle", limits.idle_timeout_s)
        try:
            if not self.rfile.peek(1):  # type: ignore[attr-defined]
                self.close_connection = True
                return
        except (ConnectionError, TimeoutError):
            self.close_connection = True
            return
        self._conn.enter("head", limits.header_timeout_s)
        super().handle_one_request()

    def parse_request(self) -> bool:
        limit = self.server.receiver.limits.max_header_bytes - len(self.raw_requestline)
        if limit < 0:
            self.send_error(431, "Request header fields too large")
            return False
        rfile = self.rfile
        reader = _HeadReader(rfile, limit)
        self.rfile = reader  # type: ignore[assignment]
        try:
            parsed = super().parse_request()
        finally:
            self.rfile = rfile
        if parsed and not reader.last.endswith(b"\n"):  # the connection ended (or was cut off) within the headers
            self.close_connection = True
            return False
        return parsed

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
        self._conn.enter("work", None)
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
        self._conn.enter("work", None)
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
        body = _Body(receiver, self._conn)
        try:
            self._conn.enter("body", receiver.limits.body_timeout_s)
            try:
                self._read_body(receiver.max_request_bytes, body)
            except _Refused as refused:
                return receiver.refuse(refused.status, str(refused), json=as_json, close=True)
            if self._conn.closed:  # cut off at its deadline or for a newer connection: what was read may be short
                raise ConnectionResetError("closed while its body was read")
            self._conn.enter("work", None)
            return receiver.export(content_type, encoding, body.data)  # type: ignore[arg-type]  # bytes-like: not copied
        finally:
            body.release()

    def _read_body(self, limit: int, body: _Body) -> None:
        """Read the request's body (Content-Length or chunked) into `body`; `_Refused` 413 past `limit` (nothing more is read), 400 when malformed."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            while True:
                line = self.rfile.readline(1024)
                if not line.endswith(b"\n"):
                    if len(line) < 1024:
                        raise ConnectionResetError("the client left mid-body")
                    raise _Refused(400, "malformed chunked body: a chunk size line over 1 KiB")
                size_text = line.split(b";", 1)[0].strip()
                if not _CHUNK_SIZE.fullmatch(size_text):
                    raise _Refused(400, f"malformed chunked body: chunk size {size_text[:40]!r} is not hexadecimal")
                size = int(size_text, 16)
                if size == 0:
                    for _ in range(100):  # trailers, up to an empty line
                        if not self.rfile.readline(1024).strip():
                            return
                    raise _Refused(400, "malformed chunked body: over 100 trailer lines")
                if len(body.data) + size > limit:
                    raise _Refused(413, f"the body is over {limit:,} bytes")
                self._read_into(body, size)
                if self.rfile.readline(3) not in (b"\r\n", b"\n"):
                    raise _Refused(400, "malformed chunked body: no line end after a chunk")
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            return
        if not length_text.strip().isdigit() or not length_text.strip().isascii():
            raise _Refused(400, f"bad Content-Length {length_text[:40]!r}")
        length = int(length_text)
        if length > limit:
            raise _Refused(413, f"the body is {length:,} bytes, over {limit:,}")
        self._read_into(body, length)

    def _read_into(self, body: _Body, size: int) -> None:
        """Read `size` bytes into `body` as they arrive, a piece at a time; `ConnectionResetError` when the client leaves or is cut off."""
        while size:
            piece = min(size, _PIECE)
            body.hold(piece)
            data = self.rfile.read(piece)
            if len(data) < piece:
                raise ConnectionResetError("the client left mid-body")
            body.data += data
            size -= piece


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


class _Body:
    """A request's body as read so far; past `small_body_bytes` it holds one of the receiver's large-body slots."""

    def __init__(self, receiver: Receiver, conn: _Conn) -> None:
        self.data = bytearray()
        self._receiver, self._conn = receiver, conn
        self._large = False

    def hold(self, size: int) -> None:
        """Make room for `size` more bytes: past the small size, wait for a large-body slot (none is held meanwhile)."""
        if self._large or len(self.data) + size <= self._receiver.limits.small_body_bytes:
            return
        while not self._receiver._large_bodies.acquire(timeout=0.2):
            if self._conn.closed:
                raise ConnectionResetError("closed while waiting to read its body")
        self._large = True

    def release(self) -> None:
        if self._large:
            self._receiver._large_bodies.release()
            self._large = False
        self.data = bytearray()


# --- the file -----------------------------------------------------------------------------------


def encode_request(spans: Sequence[Span]) -> bytes:
    """`spans` as one OTLP JSON `ExportTraceServiceRequest`, as the Collector's `file` exporter writes it.

    Spans in a row with the same resource mapping and scope share a resourceSpans and scopeSpans
    element. What the OTLP JSON reader reads back is the same spans, without the attributes of
    `_PRIVATE_KEYS` and the query strings of URLs.
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
        if span.attrs and not is_raw_payload(span):  # LiteLLM's raw request and answer: content only
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


#: Attributes (and prefixes) not written to the file: prompts, completions, tool arguments and results
#: (`genai_spans.CONTENT_KEYS`), headers, SQL parameters, query strings, exception messages and stack
#: traces, the process's command line and environment. latprof reads none of them, and they may
#: hold what users typed, secrets or personal data.
_PRIVATE_KEYS: tuple[str, ...] = CONTENT_KEYS + (
    "http.request.header.", "http.response.header.", "db.query.parameter.", "url.query",
    "exception.message", "exception.stacktrace", "process.command", "process.environ",
)  # fmt: skip
#: Private by prefix but read by the ingress inference (`latprof.analysis.ingress_inference`).
_READ_HEADERS = frozenset({HTTP_REQUEST_HEADER_X_REQUEST_START, HTTP_REQUEST_HEADER_X_REQUEST_START_PY})
#: URLs written without their query string and fragment (the analysis reads the host and the path).
#: `gen_ai.conversation.id` is written as its keyed digest (`latprof.digests`): it groups turns, never names one.
_URL_KEYS = frozenset({"url.full", "http.url", "http.target"})


def _key_values(attrs: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {"key": key, "value": _any_value(_without_query(value) if key in _URL_KEYS else
                                         (conversation_digest(value) or "") if key == GEN_AI_CONVERSATION_ID else value)}
        for key, value in attrs.items()
        if not key.startswith(_PRIVATE_KEYS) or key in _READ_HEADERS
    ]


def _without_query(url: Any) -> Any:
    """A URL without its query string and fragment."""
    return url.split("?", 1)[0].split("#", 1)[0] if isinstance(url, str) else url


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
