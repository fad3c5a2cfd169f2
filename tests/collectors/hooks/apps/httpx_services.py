"""Local services for the httpx hook tests: a slow "tool" service and an Anthropic-style streaming endpoint.

`ToolService()` serves, on a free port of 127.0.0.1, in threads (keep-alive HTTP/1.1):

- `GET /slow?ms=N`: answers `{"ok": true}` after N ms (any query parameter is ignored);
- `GET /status/CODE`: answers CODE at once;
- `GET /chunks?n=N&ms=M`: N body chunks, M ms apart;
- `POST /v1/messages?ttft_ms=T&tpot_ms=P&tokens=K[&gzip=1]`: an Anthropic Messages stream
  (`message_start`, `content_block_start`, `ping`, K `content_block_delta`s - the first after
  T ms, then one every P ms - `content_block_stop`, `message_delta` with the usage,
  `message_stop`), gzip-encoded with a flush per event when asked. A first `input_json_delta`
  with an empty `partial_json` comes at once: it carries no output.

    with ToolService() as tools:
        httpx.get(f"{tools.url}/slow?ms=200")
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
import zlib
from typing import Any
from urllib.parse import parse_qs, urlsplit

ANTHROPIC_MODEL = "claude-latprof-1"
ANTHROPIC_INPUT_TOKENS = 12


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path, query = urlsplit(self.path).path, self._query()
        if path == "/slow":
            time.sleep(float(query.get("ms", "0")) / 1000)
            self._json(200, {"ok": True})
        elif path.startswith("/status/"):
            self._json(int(path.rsplit("/", 1)[1]), {"status": path})
        elif path == "/chunks":
            n, ms = int(query.get("n", "3")), float(query.get("ms", "50"))
            self.send_response(200)
            self.send_header("content-type", "application/octet-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for _ in range(n):
                time.sleep(ms / 1000)
                self.wfile.write(b"5\r\nchunk\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._json(404, {"error": "no route"})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        path, query = urlsplit(self.path).path, self._query()
        if path != "/v1/messages":
            self._json(404, {"error": "no route"})
            return
        ttft, tpot = float(query.get("ttft_ms", "200")) / 1000, float(query.get("tpot_ms", "10")) / 1000
        tokens, gzip = int(query.get("tokens", "5")), query.get("gzip") == "1"
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        if gzip:
            self.send_header("content-encoding", "gzip")
        self.end_headers()
        compressor = zlib.compressobj(wbits=31) if gzip else None

        def send(kind: str, body: dict[str, Any]) -> None:
            data = f"event: {kind}\ndata: {json.dumps({'type': kind, **body})}\n\n".encode()
            if compressor is not None:
                data = compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        start = time.monotonic()
        usage = {"input_tokens": ANTHROPIC_INPUT_TOKENS, "output_tokens": 1}
        send("message_start", {"message": {"id": "msg_1", "type": "message", "role": "assistant", "model": ANTHROPIC_MODEL,
                                           "content": [], "usage": usage}})
        send("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        send("ping", {})
        send("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": ""}})
        for i in range(tokens):
            time.sleep(max(0.0, start + ttft + i * tpot - time.monotonic()))
            send("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f" word{i}"}})
        send("content_block_stop", {"index": 0})
        send("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": tokens}})
        send("message_stop", {})
        tail = compressor.flush() if compressor is not None else b""
        if tail:
            self.wfile.write(f"{len(tail):x}\r\n".encode() + tail + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that left early is no error
            super().handle_error(request, client_address)


class ToolService:
    """The services above in a background thread; a context manager."""

    def __init__(self) -> None:
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="httpx-test-tools", daemon=True)

    def __enter__(self) -> ToolService:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)
