"""Each stack signature against the real library, in a real process put into that state, sampled by py-spy.

`scenarios.py NAME` parks a thread of its own process in a state (a pool checkout waiting for
the only connection, a statement in flight, an HTTP read, a retry sleep, a contended lock, ...)
and says which thread; the test samples the process from outside exactly as `latprof attach`
does (`py-spy dump`, the thread's wait channel) and checks what `latprof.collectors.attach.stacks.classify` makes
of it. All scenarios start at once (each takes up to a few seconds to get into its state).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from attach.procs import SCENARIOS, end, ready, start_scenario
import services  # tests/services.py: the local services the tests use
from latprof.collectors.attach import pyspy
from latprof.layers import APP, DB_POOL, DB_QUERY, HTTP_POOL, LOCK, PROVIDER, RETRY, TOOL
from latprof.collectors.attach.stacks import BUSY, IDLE, classify

pytestmark = pytest.mark.slow  # real processes, sampled from outside


#: openai 3.x runs on httpx2/httpcore2, 2.x on httpx/httpcore (the older-lines session checks 2.x).
try:
    import openai

    CORE = "httpcore2" if int(openai.__version__.split(".")[0]) >= 3 else "httpcore"
except ImportError:  # pragma: no cover - openai is a test dependency
    CORE = "httpcore2"

#: scenario -> (state, layer, signature, split_unknown)
EXPECTED = {
    "sqlalchemy_pool_wait": (BUSY, DB_POOL, "sqlalchemy.pool_wait", False),
    "psycopg_pool_wait": (BUSY, DB_POOL, "psycopg_pool.wait", False),
    "redis_pool_wait": (BUSY, DB_POOL, "redis.pool_wait", False),
    "redis_command": (BUSY, DB_QUERY, "redis.read", False),
    "psycopg_query": (BUSY, DB_QUERY, "psycopg.wait", False),
    "sqlalchemy_query": (BUSY, DB_QUERY, "psycopg.wait", False),
    "psycopg2_query": (BUSY, DB_QUERY, "sqlalchemy.do_execute", False),
    "sqlite_query": (BUSY, DB_QUERY, "sqlalchemy.do_execute", False),
    "httpx_pool_wait": (BUSY, HTTP_POOL, "httpcore.pool_wait", False),
    "httpx_headers": (BUSY, TOOL, "httpcore.exchange", False),
    "openai_first_token": (BUSY, PROVIDER, f"{CORE}.exchange", True),
    "openai_stream_stall": (BUSY, PROVIDER, f"{CORE}.body", True),
    "openai_retry_sleep": (BUSY, RETRY, "openai.retry_sleep", False),
    "tenacity_sleep": (BUSY, RETRY, "tenacity.sleep", False),
    "backoff_sleep": (BUSY, RETRY, "backoff.retry", False),
    "lock_wait": (BUSY, LOCK, "wchan.futex", False),
    "cpu": (BUSY, APP, "running", False),
    "plain_sleep": (BUSY, None, "wchan.sleep", False),
    "future_wait": (BUSY, None, "future.result", False),
    "executor_idle": (IDLE, None, "executor.idle", False),
    "semaphore_wait": (BUSY, LOCK, "threading.semaphore", False),
    "backoff_predicate_sleep": (BUSY, RETRY, "backoff.retry_predicate", False),
    "httpx2_headers": (BUSY, TOOL, "httpcore2.exchange", False),
    "asyncio_idle": (IDLE, None, "asyncio.select", False),
    "anyio_worker_idle": (IDLE, None, "anyio.worker_idle", False),
}


@pytest.fixture(scope="module")
def parked():
    """Every scenario's process, in its state: {name: (pid, target tid)}."""
    if os.geteuid() != 0 and not os.path.exists("/proc/sys/kernel/yama/ptrace_scope"):
        pytest.skip("sampling another process needs root or ptrace permission")
    reason = services.pg_unreachable()
    if reason is not None:
        services.missing(reason, "PostgreSQL is")
    procs = {name: start_scenario(name) for name in EXPECTED}  # all at once: each takes a while to get there
    try:
        yield {name: (proc.pid, ready(name, proc)) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            end(proc)


def test_the_scenarios_cover_every_state():
    out = subprocess.run([sys.executable, str(SCENARIOS), "--list"], capture_output=True, text=True, check=True)
    assert sorted(out.stdout.split()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_signature(parked, name):
    pid, tid = parked[name]
    for _ in range(5):  # a --nonblocking dump can read the thread list while it changes, and miss a thread
        found = [t for t in pyspy.dump(pid) if t.tid == tid]
        if found:
            break
        time.sleep(0.2)
    (thread,) = found
    got = classify(thread.frames, wchan=thread.wchan, active=thread.active)
    frames = " <- ".join(f"{f.name} ({f.file})" for f in thread.frames[:6])
    assert (got.state, got.layer, got.signature, got.split_unknown) == EXPECTED[name], f"{frames}; wchan {thread.wchan}"


def test_every_other_thread_of_a_parked_process_is_classified_without_error(parked):
    pid, _ = parked["psycopg_pool_wait"]  # the pool's worker and scheduler threads are idle housekeeping
    threads = pyspy.dump(pid)
    by_name = {t.name: classify(t.frames, wchan=t.wchan, active=t.active) for t in threads}
    housekeeping = [c for n, c in by_name.items() if n.startswith("pool-")]
    assert housekeeping and all(c.state == IDLE for c in housekeeping), by_name


def test_a_pid_that_is_gone_is_one_clear_error():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(pyspy.SamplerError, match=f"no process with PID {proc.pid}|PID {proc.pid} exited"):
        pyspy.dump(proc.pid)


def test_a_process_that_is_not_python_is_one_clear_error():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(pyspy.SamplerError) as err:
            pyspy.dump(proc.pid)
        message = str(err.value)
        assert message.startswith(f"PID {proc.pid} (sleep) is not a Python process and started none"), message  # no arguments
        assert "\n" not in message and "backtrace" not in message.lower() and "anyhow" not in message  # not py-spy's Rust trace
    finally:
        proc.kill()
        proc.wait()


def test_a_shell_that_started_python_is_named_with_the_python_process_to_attach_to():
    shell = subprocess.Popen(["bash", "-c", f"{sys.executable} -c 'import time; time.sleep(30)' & wait"])
    try:
        deadline = time.monotonic() + 10
        while not pyspy.python_descendants(shell.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = pyspy.python_descendants(shell.pid)
        out = subprocess.run([sys.executable, "-m", "latprof", "attach", "--pid", str(shell.pid), "--duration", "1"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert f"PID {shell.pid} (bash) is not a Python process" in out.stderr
        assert f"{child} ({psutil.Process(child).name()} -c ...)" in out.stderr and "sleep" not in out.stderr  # no arguments
        assert f"`latprof attach --pid {child}`" in out.stderr and "backtrace" not in out.stderr.lower()
    finally:
        for proc in psutil.Process(shell.pid).children(recursive=True):
            proc.kill()  # the Python child this test's shell started
        shell.kill()
        shell.wait()
