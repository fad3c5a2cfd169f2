"""Run a real uvicorn under `latprof run` and talk raw HTTP/1.1 to it; every wait is bounded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import psutil

from latprof.capture.reader import CaptureData, read_captures
from latprof.collectors.hooks._async_request import PRE_HANDLER
from latprof.events import Request, Segment

ROOT = Path(__file__).resolve().parents[4]  # the repository: uvicorn imports `tests.collectors.hooks.apps.*` from here

#: (event loop, HTTP parser) pairs uvicorn is tested with.
CONFIGS = (("asyncio", "h11"), ("uvloop", "httptools"))

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
IO_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """`latprof run --no-report -- python -m uvicorn APP` on a free port of 127.0.0.1."""

    app: str
    loop: str
    http: str
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    uds: bool = False  # listen on a unix socket instead of TCP
    #: `latprof run --max-rate`: 0 records every request (these tests check each one); the
    #: sampling tests set a rate.
    max_rate: float = 0
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> int | str:
        """What `Pending` and `get` connect to: the TCP port, or the unix socket's path."""
        return str(self.workdir / "server.sock") if self.uds else self.port

    @property
    def capture_path(self) -> Path:
        return self.workdir / "capture.jsonl"

    def server_command(self) -> list[str]:
        """The service's command line (after `latprof run ... --`)."""
        listen = ["--uds", str(self.address)] if self.uds else ["--host", "127.0.0.1", "--port", str(self.port)]
        return [
            sys.executable, "-m", "uvicorn", self.app, *listen,
            "--loop", self.loop, "--http", self.http, "--log-level", "warning", "--no-access-log",
        ]  # fmt: skip

    def start(self) -> Server:
        self.port = free_port()
        cmd = [
            sys.executable, "-m", "latprof", "run", "--out", str(self.capture_path), "--no-report",
            "--max-rate", f"{self.max_rate:g}", "--", *self.server_command(),
        ]  # fmt: skip
        self.log = open(self.workdir / "server.log", "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
        if not wait_healthy(self.proc, self.address, self.output):
            self.kill()
            raise AssertionError(f"server did not answer within {START_TIMEOUT_S} s: {self.output()}")
        return self

    def stop(self) -> int:
        """SIGTERM to latprof (it forwards it to uvicorn); the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"server did not stop within {STOP_TIMEOUT_S} s: {self.output()}") from None
        finally:
            self.log.close()

    def kill(self) -> None:
        """Kill what this server started, by pid: uvicorn runs in its own process group."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        for child in children:
            try:
                child.kill()
            except psutil.Error:
                pass
        self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def output(self) -> str:
        try:
            return (self.workdir / "server.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def capture(self) -> Capture:
        return Capture(read_captures([self.capture_path]))


@dataclass
class GunicornServer(Server):
    """`latprof run --no-report -- gunicorn APP` on a free port of 127.0.0.1 (`loop`/`http` unused: pass "")."""

    workers: int = 1
    worker_class: str = "sync"
    threads: int = 1
    preload: bool = False

    def server_command(self) -> list[str]:
        bind = f"unix:{self.address}" if self.uds else f"127.0.0.1:{self.port}"
        return [
            sys.executable, "-m", "gunicorn", self.app, "--bind", bind,
            "--workers", str(self.workers), "--worker-class", self.worker_class, "--threads", str(self.threads),
            "--no-control-socket", "--log-level", "warning", "--graceful-timeout", "10",
            *(["--preload"] if self.preload else []),
        ]  # fmt: skip


@dataclass
class AiohttpServer(Server):
    """`latprof run --no-report -- python -m aiohttp.web ... APP` (APP is `module:init`; `loop` asyncio or uvloop)."""

    def server_command(self) -> list[str]:
        self.env = {**self.env, "AIOHTTP_APP_LOOP": self.loop}
        listen = ["-U", str(self.address)] if self.uds else ["-H", "127.0.0.1", "-P", str(self.port)]
        return [sys.executable, "-m", "aiohttp.web", *listen, self.app]


@dataclass
class Response:
    status: int
    body: bytes
    sent_ns: int  # when the request's last byte was handed to the kernel (client clock = server clock)
    done_ns: int


class Pending:
    """A request written to its own connection, whose response is read later."""

    def __init__(
        self,
        address: int | str,
        path: str,
        method: str = "GET",
        headers: Sequence[tuple[str, str]] = (),
        timeout: float = IO_TIMEOUT_S,
    ):
        if isinstance(address, str):  # a unix socket
            self.sock = socket.socket(socket.AF_UNIX)
        else:
            self.sock = socket.socket(socket.AF_INET)
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", "Content-Length: 0"]
        lines += [f"{name}: {value}" for name, value in headers]
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(address if isinstance(address, str) else ("127.0.0.1", address))
            self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        except BaseException:
            self.sock.close()
            raise
        self.sent_ns = time.time_ns()

    def response(self) -> Response:
        chunks = []
        with self.sock:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
        raw = b"".join(chunks)
        head, _, body = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head else 0
        return Response(status, body, self.sent_ns, time.time_ns())


def wait_healthy(proc: subprocess.Popen[bytes], address: int | str, output: Any) -> bool:
    """Wait until the server `proc` answers GET /health at `address` (True), or `START_TIMEOUT_S`
    passed (False); an `AssertionError` with `output()` when it exits first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}: {output()}")
        try:
            if get(address, "/health", timeout=1.0).status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def get(address: int | str, path: str, timeout: float = IO_TIMEOUT_S, **kw) -> Response:
    return Pending(address, path, timeout=timeout, **kw).response()


class Capture:
    """A capture read back, with the look-ups the tests need."""

    def __init__(self, data: CaptureData):
        self.data = data
        self.requests: list[Request] = sorted(data.requests, key=lambda r: r.start_ns)

    def segments(self, request: Request, layer: str | None = None) -> list[Segment]:
        found = self.data.segments_by_request.get(request.request_id, [])
        return [s for s in found if layer is None or s.layer == layer]

    def layer_ms(self, request: Request, layer: str) -> float:
        return sum(s.end_ns - s.start_ns for s in self.segments(request, layer)) / 1e6

    def pre_handler(self, request: Request) -> Segment:
        (segment,) = [s for s in self.segments(request) if s.name == PRE_HANDLER]
        return segment

    def routes(self, route: str) -> list[Request]:
        return [r for r in self.requests if r.route == route]

    def matching(self, route: str, sent_ns: int, tolerance_ms: float = 50.0) -> Request:
        """The request of `route` whose start is nearest the client's send time."""
        candidates = self.routes(route)
        assert candidates, f"no {route} in {sorted({r.route for r in self.requests})}"
        best = min(candidates, key=lambda r: abs(r.start_ns - sent_ns))
        assert abs(best.start_ns - sent_ns) <= tolerance_ms * 1e6, (route, (best.start_ns - sent_ns) / 1e6)
        return best


def serve_session(request: Any, tmp_path_factory: Any, app: str, name: str, session_class: Any) -> Iterator[Any]:
    """Body of a module-scoped fixture parametrized over CONFIGS: start `app` under `latprof run`,
    let `session_class(server).run()` drive it, yield the session, and kill the server after."""
    loop, http = request.param
    server = Server(app, loop, http, tmp_path_factory.mktemp(f"{name}-{loop}")).start()
    try:
        session = session_class(server)
        session.run()
        yield session
    finally:
        server.kill()
