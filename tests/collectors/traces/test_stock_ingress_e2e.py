"""The queue in front of an app, from stock OpenTelemetry spans: real gunicorn, real backlog, `latprof analyze FILE`.

The app (apps/stock_backlog.py `backend()`) is a sync Flask service under gunicorn that works 50 ms on
each request; the load is one closed-loop client and every 1.5 s a burst of 6 more at once, so with one
worker the burst waits in the accept backlog, before any span starts. The spans alone cannot show that
wait; two things can:

- the proxy's `X-Request-Start: t=<epoch seconds>` (the driver stamps each request as nginx would)
  recorded by the stock instrumentation when `OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST`
  names it: measured queue;
- a traced reverse proxy in front (apps/stock_backlog.py `proxy()`, FastAPI + httpx under uvicorn,
  its own service): inferred queue, from its span to the app's.

Their negatives: the same backlog with the header not captured (no wrong layer), and enough workers
for the load (no queue verdict). The traces are written by `OtlpReceiver` as the Collector's file
exporter writes them.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from attach.procs import free_port
from otlp_harness import log_tail, no_proxy_get, stop_app
from otlp_receiver import OtlpReceiver
from test_otlp_e2e import report_of

#: Each records a real service for seconds: run by `.ci/run` after the README's command (`pytest -m long`).
pytestmark = [pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[3]
APPS = "tests.collectors.traces.apps.stock_backlog"
FLUSHED_MARK = "stock_backlog: spans flushed:"  # apps/stock_backlog.FLUSHED_MARK
HEADER_ATTRIBUTE = "http.request.header.x_request_start"  # as the Python instrumentations name it
WORK_MS = 50
#: Seconds of load: ~130 requests, ~100 after the analysis's 2 s warm-up (a verdict needs 50).
DURATION_S = 7.0
BURST = 6
BURST_EVERY_S = 1.5
START_TIMEOUT_S = 30.0


@contextlib.contextmanager
def _serving(command: list[str], env: dict[str, str], log_path: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """`command` as a subprocess, once GET /health answers on `port`; stopped (SIGTERM) on exit."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                no_proxy_get(f"http://127.0.0.1:{port}/health", 1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"{command[2]} did not start:\n{log_tail(log_path)}")
                time.sleep(0.1)
        yield proc
    finally:
        stop_app(proc)


class Driver:
    """One closed-loop client and every `BURST_EVERY_S` a burst of `BURST` one-shot clients, for
    `DURATION_S`; each request on a new connection (a sync worker closes it), stamped
    `X-Request-Start: t=<time.time()>` as a proxy would when `stamp`."""

    def __init__(self, port: int, stamp: bool) -> None:
        self.port, self.stamp = port, stamp
        self.results: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def request(self) -> None:
        headers = {"X-Request-Start": f"t={time.time():.6f}"} if self.stamp else {}
        start = time.monotonic()
        status: int | str
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", f"/work?ms={WORK_MS}", headers=headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            status = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
        with self.lock:
            self.results.append({"ms": round((time.monotonic() - start) * 1000, 2), "status": status})

    def steady(self) -> None:
        while not self.stop.is_set():
            self.request()

    def run(self) -> None:
        threads = [threading.Thread(target=self.steady, daemon=True)]
        threads[0].start()
        t0 = time.monotonic()
        next_burst = t0 + 0.5
        while time.monotonic() < t0 + DURATION_S:
            if time.monotonic() >= next_burst:
                shots = [threading.Thread(target=self.request, daemon=True) for _ in range(BURST)]
                for t in shots:
                    t.start()
                threads += shots
                next_burst += BURST_EVERY_S
            time.sleep(0.01)
        self.stop.set()
        for t in threads:
            t.join(40)


def record(tmp_path: Path, *, workers: int = 1, capture_header: bool = True, stamp: bool = True,
           through_proxy: bool = False) -> Path:  # fmt: skip
    """The OTLP file of the load above on the backend with `workers` sync workers (and the proxy in front)."""
    out = tmp_path / "traces.otlp.jsonl"
    with OtlpReceiver(out) as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # only what we set
        env.update({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint, "NO_PROXY": "127.0.0.1,localhost",
                    "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"})  # fmt: skip
        if capture_header:
            env["OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST"] = "x-request-start"
        backend_port = free_port()
        backend = [sys.executable, "-m", "gunicorn", "-w", str(workers), "-k", "sync", "-b", f"127.0.0.1:{backend_port}",
                   "--graceful-timeout", "10", "--no-control-socket", f"{APPS}:backend()"]  # fmt: skip
        with _serving(backend, env, tmp_path / "backend.log", backend_port) as backend_proc:
            port = backend_port
            with contextlib.ExitStack() as stack:
                if through_proxy:
                    port = free_port()
                    command = [sys.executable, "-m", "uvicorn", "--factory", f"{APPS}:proxy", "--host", "127.0.0.1", "--port",
                               str(port), "--log-level", "warning", "--no-access-log"]  # fmt: skip
                    proxy_env = {**env, "BACKEND_URL": f"http://127.0.0.1:{backend_port}"}
                    proxy_proc = stack.enter_context(_serving(command, proxy_env, tmp_path / "proxy.log", port))
                driver = Driver(port, stamp)
                driver.run()
            if through_proxy:
                proxy_log = tmp_path / "proxy.log"
                assert f"{FLUSHED_MARK} True" in proxy_log.read_text(errors="replace"), log_tail(proxy_log)
                assert proxy_proc.returncode in (0, -signal.SIGTERM), proxy_proc.returncode
        assert backend_proc.returncode == 0, log_tail(tmp_path / "backend.log")
        receiver.wait_idle(0.3, timeout=10)
    (tmp_path / "driver.json").write_text(json.dumps(driver.results))
    failed = [r for r in driver.results if r["status"] != 200]
    assert not failed, f"{len(failed)} of {len(driver.results)} failed, e.g. {failed[:3]}\n{log_tail(tmp_path / 'backend.log')}"
    return out


def queue_finding(report: dict[str, Any]) -> dict[str, Any] | None:
    return next((f for f in report["findings"] if f["rule"] == "request-queueing"), None)


@pytest.mark.slow  # records a real service
def test_a_backlog_with_the_request_start_header_captured_is_queue_measured(tmp_path: Path) -> None:
    report = report_of(record(tmp_path))
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("queue", "request-queueing"), verdict
    assert "inferred" not in verdict["summary"] and verdict["confidence"] >= 0.5
    found = queue_finding(report)
    assert found is not None
    evidence = found["evidence"]
    assert "inferred" not in evidence
    assert evidence["queue_sources"] == {"header": evidence["queue_sources"]["header"]}  # every queue from the header
    assert evidence["request_start_read_from"] == [HEADER_ATTRIBUTE], evidence
    assert "request-start header" in found["summary"] and HEADER_ATTRIBUTE in found["summary"]
    assert evidence["queue_p99_ms"] >= 3 * WORK_MS  # the last of a burst waits for several requests ahead of it
    # the stamps tell what the spans alone could not: whether requests queued before them
    assert not [w for w in report["collection"]["warnings"] if "fixed concurrency" in w]


@pytest.mark.slow  # records a real service
def test_a_backlog_without_the_header_captured_is_never_a_wrong_layer(tmp_path: Path) -> None:
    """The proxy stamps, the app does not record it: the spans cannot see the backlog."""
    report = report_of(record(tmp_path, capture_header=False))
    verdict = report["verdict"]
    assert verdict["layer"] in (None, "unattributed") or verdict["confidence"] < 0.5, verdict
    assert all(layer["layer"] != "queue" for layer in report["layers"])


@pytest.mark.slow  # records a real service
def test_enough_workers_with_the_header_captured_is_no_queue_verdict(tmp_path: Path) -> None:
    report = report_of(record(tmp_path, workers=8))
    verdict = report["verdict"]
    assert verdict["layer"] != "queue", verdict
    assert queue_finding(report) is None


@pytest.mark.slow  # records a real service
def test_a_backlog_behind_a_traced_python_proxy_is_queue_inferred_from_its_span(tmp_path: Path) -> None:
    """No header: the proxy's spans (FastAPI + httpx, service stock-proxy) above the app's show the wait."""
    report = report_of(record(tmp_path, capture_header=False, stamp=False, through_proxy=True))
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("queue", "request-queueing"), verdict
    assert "inferred" in verdict["summary"] and 0 < verdict["confidence"] <= 0.6
    found = queue_finding(report)
    assert found is not None
    evidence = found["evidence"]
    assert evidence["inferred"] is True and list(evidence["queue_sources"]) == ["proxy"], evidence
    assert evidence["proxies"] == ["stock-proxy (its spans only forward the request, same method and path)"], evidence
    assert evidence["queue_p99_ms"] >= 3 * WORK_MS
    assert all(layer["layer"] != "tool" or layer["share_of_tail_excess"] < 0.05 for layer in report["layers"]), report["layers"]


@pytest.mark.slow  # records a real service
def test_enough_workers_behind_the_proxy_is_no_queue_verdict(tmp_path: Path) -> None:
    report = report_of(record(tmp_path, workers=8, capture_header=False, stamp=False, through_proxy=True))
    assert report["verdict"]["layer"] != "queue", report["verdict"]
    assert queue_finding(report) is None
