"""ClickHouse's HTTP interface on 127.0.0.1, answered by ClickHouse's engine in-process (chdb).

No ClickHouse server recent enough installs here. This carries what a client sends over HTTP -
the query in the body or the `query` parameter, the server-side parameters as `param_<name>`,
the database - to a chdb session and sends the engine's answer back, with the headers
clickhouse-connect reads: so latprof's `HttpRunner` is driven through clickhouse-connect for real,
only the server process is replaced by the same engine in the test's process.
"""

from __future__ import annotations

import http.server
import threading
import time
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

#: What an answer is in when the query names no format (ClickHouse's HTTP default).
_DEFAULT_FORMAT = "TabSeparated"


class ClickHouseHttp:
    """A thread serving ClickHouse's HTTP interface from `session` on 127.0.0.1 (`port`); the queries it ran in `queries`."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.queries: list[tuple[str, dict[str, str]]] = []
        #: Each query's seconds in the engine, rows and bytes it read from storage, and bytes (and lines) sent back.
        self.costs: list[dict[str, float]] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                self._answer(b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._answer(self.rfile.read(length))

            def _answer(self, body: bytes) -> None:
                url = urlsplit(self.path)
                if url.path == "/ping":
                    return self._send(200, b"Ok.\n", {})
                args = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
                text = (args.get("query", "") + ("\n" if args.get("query") and body else "") + body.decode()).strip()
                params = {k[len("param_"):]: v for k, v in args.items() if k.startswith("param_")}
                fmt = args.get("default_format", _DEFAULT_FORMAT)
                with owner.lock:
                    owner.queries.append((text, params))
                    try:
                        start = time.perf_counter()
                        answer = owner.session.query(text, fmt, params=params)
                        result = answer.bytes()
                        owner.costs.append({"s": time.perf_counter() - start, "rows_read": answer.storage_rows_read(),
                                            "bytes_read": answer.storage_bytes_read(), "bytes_back": len(result),
                                            "rows_back": result.count(b"\n")})  # fmt: skip
                    except Exception as exc:  # the server's error: a code and the message, as ClickHouse sends them
                        return self._send(500, f"Code: 62. DB::Exception: {exc}\n".encode(), {"X-ClickHouse-Exception-Code": "62"})
                self._send(200, result, {"X-ClickHouse-Format": fmt, "X-ClickHouse-Timezone": "UTC",
                                         "X-ClickHouse-Query-Id": args.get("query_id", "")})  # fmt: skip

            def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "text/plain; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="clickhouse-http", daemon=True)

    def __enter__(self) -> ClickHouseHttp:
        self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
