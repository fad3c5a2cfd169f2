"""The `latprof` pytest fixture (latprof.ci.pytest_plugin), used by real inner pytest sessions that load it from its entry point."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
#: A real capture: a FastAPI service whose requests hold their pool connection across the LLM call.
EXAMPLE = str(ROOT / "examples" / "pool_held_across_llm.jsonl.gz")
#: The inner sessions are as strict as latprof's own suite: a warning of the plugin would fail them.
STRICT_INI = "[pytest]\nfilterwarnings = error\n"
LENIENT = "[budget]\np99_ms = 100000\n\n[rules.db-pool-exhaustion]\nenabled = false\n"
STRICT = "[budget]\np99_ms = 1\n"


def inner(pytester: pytest.Pytester, config: str | None, test: str, *args: str) -> pytest.RunResult:
    """Run the inner test module `test` in a subprocess (pytest finds the plugin by its entry point)."""
    pytester.makeini(STRICT_INI)
    if config is not None:
        (pytester.path / "latprof.toml").write_text(config)
    pytester.makepyfile(test_inner=test)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


CHECK_EXAMPLE = f"""
def test_capture(latprof):
    run = latprof.check({EXAMPLE!r})
    assert run.exit_code == 0 and run.report.verdict.layer == "db.pool"
"""


def test_the_plugin_is_registered_by_its_entry_point(pytester):
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["latprof: *", "  --latprof-config=FILE", "*latprof_config (paths):*"])
    assert result.ret == 0


def test_a_failing_budget_and_rule_fail_the_test_with_one_line_each_the_fix_and_the_verdict(pytester):
    result = inner(pytester, STRICT, CHECK_EXAMPLE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "latprof check: 2 of * checks failed (*/examples/pool_held_across_llm.jsonl.gz)",
        "p99 latency <= 1 ms: p99 latency 607 ms over the budget of 1 ms",
        "    fix: latprof analyze on the same input says which layer owns the time",
        "db-pool-exhaustion: The slowest 1% of requests waited 389 ms longer for a database connection than the median"
        " request (pool max 3, peak 3 in use, up to 7 waiting); 100% of requests held their connection across an LLM call.",
        "    fix: Release the database connection before the LLM call*",
        "verdict: db.pool owns 100% of the tail: *",
    ])  # fmt: skip
    out = result.stdout.str()
    assert "Traceback" not in out and "pytest_plugin.py" not in out and "AssertionError" not in out


def test_the_test_passes_and_gets_the_check_run_when_every_check_holds(pytester):
    result = inner(pytester, LENIENT, CHECK_EXAMPLE, "-rP")
    result.assert_outcomes(passed=1)
    # every result in the test's "latprof" section
    result.stdout.fnmatch_lines(["*Captured latprof call*", "verdict: db.pool owns 100% of the tail*", "PASS  p99 latency <= 100 s *",
                                 "all * checks passed"])  # fmt: skip


def test_a_warning_level_check_passes_and_is_listed_in_the_summary_not_as_a_python_warning(pytester):
    config = '[rules.db-pool-exhaustion]\nseverity = "warning"\n'
    result = inner(pytester, config, CHECK_EXAMPLE)
    result.assert_outcomes(passed=1, warnings=0)
    result.stdout.fnmatch_lines([
        "*= latprof warnings =*",
        "test_inner.py::test_capture: db-pool-exhaustion: The slowest 1% of requests waited 389 ms longer*",
    ])  # fmt: skip


CONFIG_CHOICES = f"""
from latprof.ci.config import load_config

def test_default(latprof):
    latprof.check({EXAMPLE!r})

def test_a_path(latprof):
    latprof.check({EXAMPLE!r}, config="lenient.toml")

def test_a_config_object(latprof):
    latprof.check({EXAMPLE!r}, config=load_config("lenient.toml"))
"""


@pytest.mark.parametrize("where", ["option", "ini"])
def test_the_default_config_comes_from_the_option_or_ini_and_config_overrides_it(pytester, where):
    (pytester.path / "strict.toml").write_text(STRICT)
    (pytester.path / "lenient.toml").write_text(LENIENT)
    pytester.makeini(STRICT_INI + ("latprof_config = strict.toml\n" if where == "ini" else ""))
    pytester.makepyfile(test_inner=CONFIG_CHOICES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *(["--latprof-config", "strict.toml"] if where == "option" else []))
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(["p99 latency <= 1 ms: p99 latency 607 ms over the budget of 1 ms",
                                 "FAILED test_inner.py::test_default - Failed: latprof check: 2 of * checks*"])  # fmt: skip


def test_bad_config_or_input_fails_the_test_with_latprofs_one_line_error(pytester):
    test = f"""
def test_bad_config(latprof):
    latprof.check({EXAMPLE!r})

def test_missing_capture(latprof):
    latprof.check("missing.jsonl", config="ok.toml")
"""
    (pytester.path / "ok.toml").write_text(LENIENT)
    result = inner(pytester, "[budget]\np99 = 1\n", test)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "latprof: */latprof.toml:budget.p99: unknown key (did you mean 'p99_ms'?)",
        "latprof: missing.jsonl: *",
    ], consecutive=False)  # fmt: skip
    out = result.stdout.str()
    assert "Traceback" not in out and "ConfigError" not in out and "latprof/ci/config.py" not in out


APP = """
import asyncio
import os

from fastapi import FastAPI

app = FastAPI()
LOCKED = os.environ.get("APP_LOCKED") == "1"
gate = asyncio.Semaphore(1)


@app.get("/health")
async def health():
    return {"ok": True}


@app.get("/work")
async def work():
    if LOCKED:
        async with gate:  # one request at a time: the others queue on the semaphore
            await asyncio.sleep(0.02)
    else:
        await asyncio.sleep(0.02)
    return {"ok": True}
"""
#: Where latprof names the semaphore: where it was first contended (an asyncio one is not created by a factory).
SEMAPHORE_LINE = APP.splitlines().index("        async with gate:  # one request at a time: the others queue on the semaphore") + 1

DRIVE_SERVICE = """
import os
import socket
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url):
    with OPENER.open(url, timeout=10) as response:
        return response.status


def drive(url, seconds):
    # one request every 50 ms, and a burst of 8 every 0.5 s
    with ThreadPoolExecutor(8) as pool:
        futures, tick, end = [], 0, time.monotonic() + seconds
        while time.monotonic() < end:
            futures += [pool.submit(get, url) for _ in range(8 if tick % 10 == 0 else 1)]
            tick += 1
            time.sleep(0.05)
    assert {f.result() for f in futures} == {200}


@pytest.mark.parametrize("locked", ["1", "0"], ids=["semaphore", "no-semaphore"])
def test_service(latprof, locked):
    port = free_port()
    service = latprof.run(
        sys.executable, "-m", "uvicorn", "app:app", "--port", str(port), "--log-level", "warning",
        env={"APP_LOCKED": locked}, cwd=os.path.dirname(__file__), ready_url=f"http://127.0.0.1:{port}/health",
    )
    drive(f"http://127.0.0.1:{port}/work", 4.0)
    latprof.check(service.stop(), skip_warmup_s=1)
"""


@pytest.mark.slow
def test_a_real_service_held_on_a_semaphore_fails_with_lock_contention_and_without_it_passes(pytester):
    """A FastAPI service under uvicorn, started by the fixture under `latprof run`, driven for 4 s, stopped, checked."""
    (pytester.path / "app.py").write_text(APP)
    result = inner(pytester, None, DRIVE_SERVICE, "-v")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "test_inner.py::test_service[[]semaphore[]] FAILED*",
        "test_inner.py::test_service[[]no-semaphore[]] PASSED*",
    ])  # fmt: skip
    result.stdout.fnmatch_lines([
        "latprof check: 1 of * checks failed (*/latprof/service-1.jsonl)",
        "lock-contention: The slowest 1% of requests waited * longer for a lock than the median request, mostly for the"
        f" asyncio.Semaphore created at *app.py:{SEMAPHORE_LINE} (lock wait p99 * ms).",
        f"    fix: Hold the asyncio.Semaphore at *app.py:{SEMAPHORE_LINE} for less*",
        "verdict: lock owns *",
    ])  # fmt: skip


LIFECYCLE = """
import os
import sys
import time
from pathlib import Path

import psutil

SLEEPER = "import time; time.sleep(60)"
IGNORES_SIGINT = (
    "import os, pathlib, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN);"
    " pathlib.Path('ignorer.pid').write_text(str(os.getpid())); time.sleep(60)"
)


def wait_for(path):
    deadline = time.monotonic() + 20
    while not os.path.exists(path) or not Path(path).read_text():
        assert time.monotonic() < deadline, path
        time.sleep(0.05)
    return int(Path(path).read_text())


def test_left_running(latprof):
    service = latprof.run(sys.executable, "-c", SLEEPER)
    deadline = time.monotonic() + 20  # `latprof run` starts the service once it has imported itself
    while not (children := [p.pid for p in psutil.Process(service.pid).children(recursive=True)]):
        assert time.monotonic() < deadline and service.running
        time.sleep(0.05)
    assert children and service.running
    Path("left-running.pids").write_text(" ".join(map(str, [service.pid, *children])))


def test_a_service_that_ignores_sigint_is_killed(latprof):
    service = latprof.run(sys.executable, "-c", IGNORES_SIGINT)
    child = wait_for("ignorer.pid")
    time.sleep(1.2)  # the capture's first flush
    capture = service.stop(timeout_s=1)
    assert service.killed and not service.running and capture.exists()
    Path("ignorer.pids").write_text(" ".join(map(str, [service.pid, child])))


def test_a_service_that_exits_before_it_is_ready(latprof):
    latprof.run(sys.executable, "-c", "raise SystemExit('boom: no config')", ready_url="http://127.0.0.1:9/health")
"""


def _gone(pid: int) -> bool:
    try:
        process = psutil.Process(pid)
        return process.status() == psutil.STATUS_ZOMBIE  # reaped by whoever adopted it, or not yet
    except psutil.NoSuchProcess:
        return True


def test_services_are_stopped_by_pid_at_teardown_killed_after_the_timeout_and_a_failed_start_shows_the_output(pytester):
    result = inner(pytester, None, LIFECYCLE)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "latprof: `* -c *` exited with 1 before http://127.0.0.1:9/health answered; its output:",
        "boom: no config",
    ])  # fmt: skip
    for name in ("left-running.pids", "ignorer.pids"):
        pids = [int(p) for p in (pytester.path / name).read_text().split()]
        deadline = time.monotonic() + 5
        while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(pid) for pid in pids), (name, pids)


SIGINT_IGNORED = """
import signal, sys, time

def test_stopped(latprof):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a non-interactive shell starts pytest
    service = latprof.run(sys.executable, "-c", "import time; time.sleep(60)")
    time.sleep(1.5)  # the capture's first flush
    capture = service.stop(timeout_s=10)
    assert not service.killed and capture.exists()
"""


def test_a_service_is_stopped_by_sigint_even_when_pytest_was_started_with_sigint_ignored(pytester):
    # CI runners often start the tests as a background job, which inherits SIGINT ignored: the
    # service must still get it (not sit out the stop timeout and lose its capture's last flush).
    result = inner(pytester, None, SIGINT_IGNORED)
    result.assert_outcomes(passed=1)


def test_the_plugin_can_be_turned_off(pytester):
    result = inner(pytester, None, CHECK_EXAMPLE, "-p", "no:latprof")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'latprof' not found*"])
