"""The processes the attach tests sample: scenario processes parked in a state, and servers started by hand.

Not a test module: `from attach.procs import ...` (tests/ is on sys.path, see tests/conftest.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository: servers import `tests.*.apps` from here
SCENARIOS = Path(__file__).with_name("scenarios.py")
#: The Flask app the gunicorn services serve (tests/hooks/apps/wsgi_app.py).
WSGI_APP = "tests.hooks.apps.wsgi_app:app"


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


def start_server(command: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a server (`command`, listening on 127.0.0.1:`port`) and wait until GET /health answers."""
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
