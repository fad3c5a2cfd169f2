"""The processes the attach tests sample: scenario processes parked in a state, and servers started by hand.

Not a test module: `from attach.procs import ...` (tests/ is on sys.path, see tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from report_schema import assert_valid

ROOT = Path(__file__).resolve().parents[2]  # the repository: servers import `tests.*.apps` from here
SCENARIOS = Path(__file__).with_name("scenarios.py")
#: The Flask app the gunicorn services serve (tests/collectors/hooks/apps/wsgi_app.py).
WSGI_APP = "tests.collectors.hooks.apps.wsgi_app:app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_scenario(name: str) -> subprocess.Popen[str]:
    """`scenarios.py NAME`, not yet in its state (see `ready`)."""
    return subprocess.Popen([sys.executable, str(SCENARIOS), name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ready(name: str, proc: subprocess.Popen[str]) -> int:
    """Wait for scenario `proc` to be in its state; the target thread's id (the test fails if it never is)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the scenario gives up on its own if it cannot get there
    if not line.startswith("READY "):
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"scenario {name} did not get into its state: {line!r} {err}")
    return int(line.split()[1])


def park(name: str) -> tuple[subprocess.Popen[str], int]:
    """A scenario process in its state, and its target thread's id."""
    proc = start_scenario(name)
    return proc, ready(name, proc)


def end(proc: subprocess.Popen[str]) -> None:
    """Kill a scenario process, reap it and close its pipes."""
    proc.kill()
    proc.communicate()


def start_server(command: list[str], port: int, env: dict[str, str] | None = None, log: Path | None = None
                 ) -> subprocess.Popen[bytes]:  # fmt: skip
    """Start a server (`command`, listening on 127.0.0.1:`port`; its output into `log`, when given)
    and wait until GET /health answers."""
    if log is not None:
        with open(log, "wb") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT)
    else:
        proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **(env or {})},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return proc
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                proc.wait()
                pytest.fail(f"{' '.join(command[:4])} ... did not start")
            time.sleep(0.1)


def gunicorn(port: int, *args: str) -> list[str]:
    """The command of gunicorn serving the test Flask app on `port`, with `args` (workers, worker class)."""
    return [sys.executable, "-m", "gunicorn", WSGI_APP, "-b", f"127.0.0.1:{port}", *args, "--no-control-socket",
            "--log-level", "warning"]  # fmt: skip


def attach_cli(pid: int, tmp_path: Path, duration_s: float, *args: str) -> subprocess.CompletedProcess[str]:
    """`latprof attach --pid PID --duration S --format json ARGS...`, its capture in `tmp_path`."""
    return subprocess.run([sys.executable, "-m", "latprof", "attach", "--pid", str(pid), "--duration", f"{duration_s:g}",
                           "--format", "json", "--out", str(tmp_path / "c.jsonl"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip


@contextlib.contextmanager
def load(port: int, path: str, clients: int, pause_s: float = 0.0) -> Iterator[list[int]]:
    """`clients` threads requesting `path` on 127.0.0.1:`port` one at a time, each pausing `pause_s`
    after every answer, until the block ends; yields a one-item list counting the failed requests."""
    stop = threading.Event()
    failures = [0]

    def client() -> None:
        while not stop.is_set():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30).read()
            except (OSError, http.client.HTTPException):  # (IncompleteRead: the server killed mid-answer)
                failures[0] += 1
                time.sleep(0.05)
            if pause_s:
                stop.wait(pause_s)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield failures
    finally:
        stop.set()
        for t in threads:
            t.join(35)


def attach_under_load(tmp_path: Path, gunicorn_args: list[str], path: str, clients: int, *, pause_s: float = 0.0,
                      env: dict[str, str] | None = None, server: list[str] | None = None,
                      attach_args: tuple[str, ...] = (), duration_s: float = 4, config: Path | None = None,
                      ) -> tuple[dict, dict]:  # fmt: skip
    """Start gunicorn (or `server`, with `{port}` in it), keep `clients` client threads requesting
    `path`, attach to its first process for `duration_s` (with `attach_args`, and `--config
    config`); (the live report, `latprof analyze` of its capture with the same config, which
    must agree)."""
    judged = ("--config", str(config)) if config is not None else ()
    port = free_port()
    command = [a.format(port=port) for a in server] if server else gunicorn(port, *gunicorn_args)
    master = start_server(command, port, env)
    capture = tmp_path / "attach.jsonl"
    try:
        with load(port, path, clients, pause_s):
            time.sleep(1.0)
            live = subprocess.run(
                [sys.executable, "-m", "latprof", "attach", "--pid", str(master.pid), "--duration", str(duration_s),
                 "--format", "json", "--out", str(capture), *attach_args, *judged],
                cwd=ROOT, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
    finally:
        master.terminate()
        master.wait(20)
    assert live.returncode == 0, live.stderr
    later = subprocess.run([sys.executable, "-m", "latprof", "analyze", "--format", "json", str(capture), *judged],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert later.returncode == 0, later.stderr
    report, again = json.loads(live.stdout), json.loads(later.stdout)
    assert_valid(report)
    assert_valid(again)
    print(report["verdict"], [(r["layer"], r["share_of_tail_excess"]) for r in report["layers"]], report["collection"])
    assert report["source"]["kind"] == "attach" == again["source"]["kind"]
    assert report["verdict"] == again["verdict"] and report["layers"] == again["layers"]
    assert report["window"]["requests"] is None and report["latency_ms"] is None
    return report, again


#: The load of the container tests, run inside the service's network namespace (`nsenter --net`):
#: wait for /health, then `clients` threads request `path` until stdin closes; then print how
#: many requests failed (`FAILURES n`).
NAMESPACE_LOAD = """
import sys, threading, time, urllib.request
port, path, clients = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
deadline = time.monotonic() + 30
while True:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("the service never answered")
        time.sleep(0.1)
failures = [0]
def client():
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30).read()
        except Exception:  # refused, reset, or cut mid-answer (IncompleteRead)
            failures[0] += 1
            time.sleep(0.05)
for _ in range(clients):
    threading.Thread(target=client, daemon=True).start()
print("LOADING", flush=True)
sys.stdin.read()
print("FAILURES", failures[0], flush=True)
"""


def needs_namespaces() -> None:
    """Skip unless new PID, mount and network namespaces can be made here (root, unshare, nsenter, ip)."""
    import shutil

    if os.geteuid() != 0:
        pytest.skip("new PID, mount and network namespaces need root")
    missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (util-linux, iproute2)")
