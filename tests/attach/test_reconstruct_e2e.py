"""Per-request layer times reconstructed by `latprof attach` agree with `latprof run`'s on the same service.

A threaded server (gunicorn, one gthread worker process of 6 threads) serves the Flask app's
`/db?ms=...` endpoint, which checks a connection out of a psycopg_pool of 2 and holds it for a
`pg_sleep`. A few client threads each pause between requests, so that every worker thread is
idle between two requests (attach takes a thread's run of busy samples between two idle ones
for one request) and nothing waits in front of the threads. The requests' time is split between
waiting for a connection (db.pool) and the statement (db.query), in clearly different shares.

The same service is run twice with the same load: under `latprof run`, whose hooks time every
request's layers (the reference), and plainly, with `latprof attach --pid` sampling it from
outside for a few seconds. Each layer's share of the reconstructed requests' time
(`collection.reconstructed.layers` of attach's report) must be within 10 percentage points of
its share under `latprof run`.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import services  # tests/services.py: the local services the tests use
from attach.procs import attach_cli, free_port, gunicorn, load, start_server
from latprof.analysis.requests import layer_times_ms
from latprof.pipeline import run_diagnosis

pytestmark = [pytest.mark.slow, pytest.mark.long]  # real servers under load, for seconds each: with the long runs (CI)

#: One gthread worker process of 6 threads: every request has a thread of its own (CLIENTS < 6).
GUNICORN_ARGS = ("-k", "gthread", "--threads", "6", "-w", "1")
#: The endpoint: a connection of the pool held for a `pg_sleep` of `ms`.
PATH = "/db?ms=100"
POOL_MAX = 2  # connections in the worker's psycopg_pool
CLIENTS = 5  # client threads, each one request at a time
PAUSE_S = 0.1  # what each client waits between its requests: the worker threads are idle then
LOAD_S = 7.0  # how long the service is loaded under `latprof run` (its first 2 s are warmup)
TOLERANCE = 0.10  # per layer, absolute share of request time


def rounded(shares: dict[str, float]) -> dict[str, float]:
    return {layer: round(share, 3) for layer, share in sorted(shares.items())}


def service_env() -> dict[str, str]:
    return {"WSGI_APP_PG": services.PG_DSN, "WSGI_APP_POOL_MAX": str(POOL_MAX)}


def shares_of(capture: Path) -> tuple[dict[str, float], int, float]:
    """Each layer's share of the analysed requests' total time in a `latprof run` capture (the
    warmup left out as `latprof analyze` does), how many requests that was, and their mean ms."""
    analysis = run_diagnosis([capture]).analysis
    assert analysis is not None
    totals: dict[str, float] = {}
    requests = [rt for rt in analysis.requests if rt.request.route.endswith(PATH.split("?")[0])]
    for rt in requests:
        for layer, ms in layer_times_ms(rt).items():
            totals[layer] = totals.get(layer, 0.0) + ms
    whole = sum(totals.values())
    assert whole > 0, f"no request time in {capture}"
    return {layer: ms / whole for layer, ms in sorted(totals.items())}, len(requests), whole / len(requests)


def run_mode_shares(tmp_path: Path) -> dict[str, float]:
    """The service under `latprof run` with the load for LOAD_S seconds: layer -> share of request time."""
    capture = tmp_path / "run.jsonl"
    port = free_port()
    command = [sys.executable, "-m", "latprof", "run", "--out", str(capture), "--no-report", "--max-rate", "0", "--",
               *gunicorn(port, *GUNICORN_ARGS)]  # fmt: skip
    latprof = start_server(command, port, service_env())
    try:
        with load(port, PATH, CLIENTS, PAUSE_S) as failures:
            time.sleep(LOAD_S)
        latprof.send_signal(signal.SIGTERM)  # latprof passes it on to gunicorn, which stops gracefully
        assert latprof.wait(30) == 0
    finally:
        if latprof.poll() is None:
            latprof.kill()
            latprof.wait()
    assert failures[0] == 0, f"{failures[0]} requests failed"
    shares, count, mean_ms = shares_of(capture)
    print(f"latprof run: {count} requests of {mean_ms:.0f} ms on average, shares {rounded(shares)}")
    return shares


@contextlib.contextmanager
def start_plain_and_load() -> Iterator[int]:
    """The same service started plainly (no latprof), under the same load; yields gunicorn's master PID."""
    port = free_port()
    master = start_server(gunicorn(port, *GUNICORN_ARGS), port, service_env())
    try:
        with load(port, PATH, CLIENTS, PAUSE_S) as failures:
            time.sleep(2.0)  # past what `latprof run`'s analysis leaves out as warmup (its first 2 s)
            yield master.pid
        assert failures[0] == 0, f"{failures[0]} requests failed"
    finally:
        master.terminate()
        try:
            master.wait(20)
        except subprocess.TimeoutExpired:
            master.kill()
            master.wait()


def test_threaded_reconstruction_agrees_with_run_mode(tmp_path: Path) -> None:
    services.require_pg()
    reference = run_mode_shares(tmp_path)
    with start_plain_and_load() as pid:
        done = attach_cli(pid, tmp_path, 6)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    made = report["collection"]["reconstructed"]
    reconstructed = made["layers"]
    print(f"latprof attach: {made['requests']} requests reconstructed, shares {rounded(reconstructed)}; {made}")
    # about 20 requests a second, less those a recording cut; the report says how they were made
    assert made["requests"] >= 40 and made["rate_hz"] == 100 and "reconstructed" in made["from"], made
    assert made["threads_left_out"] == 0, made  # every thread was seen idle between requests
    for layer in sorted(set(reference) | set(reconstructed)):
        run_share, attach_share = reference.get(layer, 0.0), reconstructed.get(layer, 0.0)
        assert abs(run_share - attach_share) <= TOLERANCE, (layer, run_share, attach_share, reference, reconstructed)
