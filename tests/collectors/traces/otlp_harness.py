"""Record real OTLP trace files from a real service traced with stock OpenTelemetry only.

`record_otlp(tmp_path, "pool_held", db="asyncpg")` starts, all on 127.0.0.1:

- the demo LLM provider (`latprof.demo.provider.Provider`, in this process) with the
  scenario's settings, and the tool service below when the scenario calls tools;
- an `OtlpReceiver` writing `tmp_path / "traces.otlp.jsonl"` (`mode`: "file-exporter", what the
  Collector's file exporter writes, or "protobuf-json");
- `python -m uvicorn tests.collectors.traces.apps.traced_app:app` as a subprocess (its output in
  `tmp_path / "server.log"`), exporting to the receiver;

then drives the scenario's load for `duration_s` (closed-loop client threads, plus bursts of
extra clients for "pool_held"), stops the server with SIGTERM (the app flushes its spans on
shutdown), waits for the receiver to go idle and returns the file's path. What the driver saw
(per request: path, start, client-side latency, status) is in `tmp_path / "driver.json"`. With
`exporter_env` (e.g. `{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}`) the services
export there instead: no `OtlpReceiver`, no OTLP file.

Scenarios (`SCENARIOS`, each a `Scenario` with its defaults; every field can be overridden):

- "pool_held": GET /chat - a pool of 3 held across the LLM call; 2 steady clients (never short of
  a connection) and every 2 s a burst of 8 more: a burst waits for a connection up to ~3 LLM
  calls, the steady traffic never does, so p99 is several times p50;
- "sequential_tools": GET /tools - 1 tool call of 150 ms, and 1 request in 30 with 4 (~3%)
  made one after another;
- "agent_loop": GET /agent - LLM -> tool -> ... -> LLM, 1 turn, and 1 request in 30 with 4;
- "slow_query": GET /query - `pg_sleep` of 10 ms, and 1 request in 30 of 400 ms (the pool is
  larger than the clients: no pool wait);
- "healthy": GET /ok - a quick query and an LLM call (~180 ms: a stall of the box does not make
  a tail of it), the pool larger than the clients: no tail.

The scenarios without the database ("sequential_tools", "agent_loop") ignore `db`. Without
PostgreSQL the others skip (a failure under CI, see `hooks/apps/services.require_pg`).

Not a test module: `from otlp_harness import record_otlp` (pytest puts tests/collectors/traces on sys.path).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import parse_qs, urlsplit

import pytest

from attach.procs import free_port
from services import PG_DSN, require_pg
from latprof.demo.provider import Provider
from otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parents[3]  # the repository: uvicorn imports `tests.collectors.traces.apps.*` from here
APP = "tests.collectors.traces.apps.traced_app:app"
FLUSHED_MARK = "traced_app: spans flushed:"  # what the app writes once its spans are flushed (traced_app.FLUSHED_MARK)
DBS = ("sqlalchemy", "psycopg_pool", "asyncpg")
OTLP_FILE = "traces.otlp.jsonl"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 30.0


def _mix(base: str, tail: str, every: int = 30, at: int = 25) -> tuple[str, ...]:
    """`every` request paths, all `base` but the `at`-th, `tail` (the driver cycles through them)."""
    return tuple(tail if i == at else base for i in range(every))


@dataclass(frozen=True)
class Scenario:
    """A load on one endpoint of the traced app, and the provider it calls."""

    #: The request paths (with query strings) the driver cycles through, one per request.
    paths: tuple[str, ...]
    #: Closed-loop client threads, each sending its next request as soon as the last one answered.
    clients: int
    duration_s: float
    #: ProviderConfig settings of the LLM provider.
    provider: Mapping[str, Any]
    uses_db: bool = True
    uses_tools: bool = False
    pool_size: int = 3
    #: Every `burst_every_s` seconds, `burst` more clients send one request each, all at once.
    burst: int = 0
    burst_every_s: float = 0.0
    #: The first burst this long after the load started.
    burst_offset_s: float = 0.5
    #: The tools are served by a second traced service (apps/backend_app.py under one gunicorn
    #: sync worker) instead of the in-process tool server.
    traced_backend: bool = False


SCENARIOS: dict[str, Scenario] = {
    "pool_held": Scenario(paths=("/chat",), clients=2, burst=8, burst_every_s=2.0, duration_s=9.0, pool_size=3,
                          provider={"ttft_ms": 150, "tpot_ms": 5, "output_tokens": 6}),
    "sequential_tools": Scenario(paths=_mix("/tools?n=1&ms=150", "/tools?n=4&ms=150"), clients=5, duration_s=8.0,
                                 uses_db=False, uses_tools=True,
                                 provider={"ttft_ms": 150, "tpot_ms": 5, "output_tokens": 6}),
    "agent_loop": Scenario(paths=_mix("/agent?turns=1&ms=60", "/agent?turns=4&ms=60"), clients=5, duration_s=8.0,
                           uses_db=False, uses_tools=True,
                           provider={"ttft_ms": 150, "tpot_ms": 5, "output_tokens": 6}),
    "slow_query": Scenario(paths=_mix("/query?ms=10", "/query?ms=400"), clients=4, duration_s=8.0, pool_size=6,
                           provider={"ttft_ms": 50, "tpot_ms": 2, "output_tokens": 4}),
    "queued_backend": Scenario(paths=("/tools?n=1&ms=100",), clients=1, burst=6, burst_every_s=2.0, duration_s=9.0,
                               uses_db=False, uses_tools=True, traced_backend=True,
                               provider={"ttft_ms": 50, "tpot_ms": 2, "output_tokens": 4}),
    "healthy": Scenario(paths=("/ok",), clients=5, duration_s=8.0, pool_size=6,
                        provider={"ttft_ms": 150, "tpot_ms": 5, "output_tokens": 6}),
}  # fmt: skip


# --- the tool service -----------------------------------------------------------------------------


class _ToolHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        time.sleep(float(query.get("ms", "0")) / 1000)
        data = json.dumps({"tool": url.path.strip("/"), "q": query.get("q"), "ok": True}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _ToolServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ToolServer:
    """`GET /ANY/PATH?ms=N` answers `{"tool": "ANY/PATH", "q": ..., "ok": true}` after N ms; a context manager."""

    def __init__(self) -> None:
        self.server = _ToolServer(("127.0.0.1", 0), _ToolHandler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-tools", daemon=True)

    def __enter__(self) -> ToolServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


# --- the load driver ------------------------------------------------------------------------------


@dataclass
class _Driver:
    port: int
    paths: Sequence[str]
    results: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _next: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def next_path(self) -> str:
        with self._lock:
            path = self.paths[self._next % len(self.paths)]
            self._next += 1
            return path

    def request(self, conn: http.client.HTTPConnection | None, path: str, t0: float) -> http.client.HTTPConnection | None:
        """One GET on `conn` (a new connection when None); the connection to reuse, None after an error."""
        start = time.monotonic()
        status: int | str
        try:
            conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            status = response.status
            if response.getheader("connection", "").lower() == "close":
                conn.close()
                conn = None
        except (OSError, http.client.HTTPException) as exc:
            status = f"{type(exc).__name__}: {exc}"
            if conn is not None:
                conn.close()
            conn = None
        end = time.monotonic()
        with self._lock:
            self.results.append({"path": path, "start_s": round(start - t0, 4), "ms": round((end - start) * 1000, 2),
                                 "status": status})  # fmt: skip
        return conn

    def client(self, t0: float) -> None:
        conn = None
        while not self.stop.is_set():
            conn = self.request(conn, self.next_path(), t0)
            if conn is None and not self.stop.is_set():
                time.sleep(0.05)
        if conn is not None:
            conn.close()

    def one_shot(self, t0: float) -> None:
        conn = self.request(None, self.next_path(), t0)
        if conn is not None:
            conn.close()

    def run(self, clients: int, duration_s: float, burst: int, burst_every_s: float, burst_offset_s: float) -> None:
        t0 = time.monotonic()
        threads = [threading.Thread(target=self.client, args=(t0,), daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        next_burst = t0 + burst_offset_s
        end = t0 + duration_s
        while True:
            now = time.monotonic()
            if burst and burst_every_s > 0 and next_burst <= now < end:
                shots = [threading.Thread(target=self.one_shot, args=(t0,), daemon=True) for _ in range(burst)]
                for t in shots:
                    t.start()
                threads += shots
                next_burst += burst_every_s
            if now >= end:
                break
            time.sleep(max(0.0, min(end, next_burst if burst else end) - now))
        self.stop.set()
        deadline = time.monotonic() + REQUEST_TIMEOUT_S + 5
        for t in threads:
            t.join(max(0.1, deadline - time.monotonic()))


# --- the service ----------------------------------------------------------------------------------


def no_proxy_get(url: str, timeout: float) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return bytes(response.read())


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _start_app(port: int, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """uvicorn serving the traced app on 127.0.0.1:`port`, once GET /health answers."""
    command = [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
               "--no-access-log"]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            no_proxy_get(f"http://127.0.0.1:{port}/health", 1)
            return proc
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                stop_app(proc)
                pytest.fail(f"the traced app did not start:\n{log_tail(log_path)}")
            time.sleep(0.1)


def _start_backend(exporter_env: Mapping[str, str], log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """apps/backend_app.py under gunicorn with one sync worker, exporting as `exporter_env` says; (process, base URL)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({**exporter_env, "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"})
    command = [sys.executable, "-m", "gunicorn", "-w", "1", "-k", "sync", "-b", f"127.0.0.1:{port}",
               "--graceful-timeout", "10", "tests.collectors.traces.apps.backend_app:app"]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            no_proxy_get(f"http://127.0.0.1:{port}/health", 1)
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                stop_app(proc)
                pytest.fail(f"the traced backend did not start:\n{log_tail(log_path)}")
            time.sleep(0.1)


def stop_app(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM (a graceful shutdown: uvicorn's lifespan or gunicorn's worker exit flushes the spans), SIGKILL if it
    hangs; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def record_otlp(tmp_path: Path, scenario: str, *, db: str = "sqlalchemy", clients: int | None = None,
                duration_s: float | None = None, mode: str = "file-exporter", paths: Sequence[str] | None = None,
                pool_size: int | None = None, burst: int | None = None, burst_every_s: float | None = None,
                provider: Mapping[str, Any] | None = None, compression: str | None = None,
                env: Mapping[str, str] | None = None, exporter_env: Mapping[str, str] | None = None) -> Path:  # fmt: skip
    """Run `scenario` (a key of SCENARIOS) against the traced app and return its OTLP file.

    `clients`, `duration_s`, `paths` (the request paths cycled through), `pool_size`, `burst`,
    `burst_every_s` override the scenario's defaults, `provider` updates its provider settings;
    `compression` ("gzip") sets the exporter's; `env` adds to the app's environment.
    The file is `tmp_path / "traces.otlp.jsonl"` (replaced if there), with `server.log` and
    `driver.json` next to it. Fails the test when the app does not start or a request fails.
    `exporter_env`: the `OTEL_EXPORTER_OTLP_*` settings of a receiver of the caller's, which the
    services export to instead of an `OtlpReceiver` of their own; then no OTLP file is written
    and the path returned is `driver.json`'s.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {sorted(SCENARIOS)}")
    if db not in DBS:
        raise ValueError(f"db must be one of {DBS}, not {db!r}")
    spec = SCENARIOS[scenario]
    changes: dict[str, Any] = {k: v for k, v in {"clients": clients, "duration_s": duration_s, "pool_size": pool_size,
                                                  "burst": burst, "burst_every_s": burst_every_s}.items() if v is not None}  # fmt: skip
    if paths is not None:
        changes["paths"] = tuple(paths)
    if provider:
        changes["provider"] = {**spec.provider, **provider}
    spec = dataclasses.replace(spec, **changes)
    if spec.uses_db:
        require_pg()
    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    out, log_path = tmp_path / OTLP_FILE, tmp_path / "server.log"

    with Provider(**spec.provider) as llm, contextlib.ExitStack() as stack:
        receiver = None if exporter_env is not None else stack.enter_context(OtlpReceiver(out, mode=mode))
        export_env = dict(exporter_env) if receiver is None else {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint}
        tools = ToolServer().__enter__() if spec.uses_tools and not spec.traced_backend else None
        backend = _start_backend(export_env, tmp_path / "backend.log") if spec.traced_backend else None
        try:
            port = free_port()
            app_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # only what we set
            app_env.update({
                **export_env,
                "OTEL_SERVICE_NAME": f"otlp-{scenario}",
                "PROVIDER_URL": llm.url,
                "TOOL_URL": tools.url if tools else backend[1] if backend else "",
                "APP_DB": db if spec.uses_db else "",
                "APP_PG": PG_DSN,
                "APP_POOL_SIZE": str(spec.pool_size),
                "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost",
                "PYTHONUNBUFFERED": "1",
            })  # fmt: skip
            if compression:
                app_env["OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"] = compression
            app_env.update(env or {})
            proc = _start_app(port, app_env, log_path)
            driver = _Driver(port, spec.paths)
            try:
                driver.run(spec.clients, spec.duration_s, spec.burst, spec.burst_every_s, spec.burst_offset_s)
            finally:
                code = stop_app(proc)
            if receiver is not None:  # (the caller's receiver has every span once the app exited: the exporter awaited each reply)
                receiver.wait_idle(0.3, timeout=10)
            if backend is not None:
                backend_code = stop_app(backend[0])
                if backend_code not in (0, -signal.SIGTERM):
                    pytest.fail(f"the traced backend exited with {backend_code}:\n{log_tail(tmp_path / 'backend.log')}")
                backend = None
                if receiver is not None:
                    receiver.wait_idle(0.3, timeout=10)
        finally:
            if tools is not None:
                tools.__exit__(None, None, None)
            if backend is not None:
                stop_app(backend[0])
    results = sorted(driver.results, key=lambda r: r["start_s"])
    (tmp_path / "driver.json").write_text(json.dumps({"scenario": scenario, "db": db if spec.uses_db else None,
                                                      "settings": dataclasses.asdict(spec), "exit_code": code,
                                                      "spans": receiver and receiver.spans_received,
                                                      "exports": receiver and receiver.requests_received,
                                                      "requests": results}))  # fmt: skip
    failed = [r for r in results if r["status"] != 200]
    if failed:
        pytest.fail(f"{len(failed)} of {len(results)} requests failed, e.g. {failed[:3]}\n{log_tail(log_path)}")
    # uvicorn re-raises the SIGTERM it handled once shut down: -15 is a clean exit too
    if code not in (0, -signal.SIGTERM) or f"{FLUSHED_MARK} True" not in log_path.read_text(errors="replace"):
        pytest.fail(f"the traced app exited with {code} after SIGTERM, without flushing its spans:\n{log_tail(log_path)}")
    return out if receiver is not None else tmp_path / "driver.json"
