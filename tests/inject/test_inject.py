"""`latprof attach --inject` on real processes, with real gdb: the mechanism, the refusals, the
safety model (safe point, detach, watchdog), against plain Python processes and a uvicorn service
started without latprof. Run with every supported CPython by `nox -s inject_pythons`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from attach.procs import ROOT, free_port, load, start_server
from report_schema import assert_valid

from latprof.collectors.attach import pyspy
from latprof.collectors.hooks import bootstrap
from latprof.errors import CollectorError
from latprof.inject import target as targets
from latprof.inject.mechanism import GdbInjector, injector_for
from latprof.inject import session as session_module
from latprof.inject.session import SAFE_POINT_S, InjectSession

TARGETS = Path(__file__).with_name("targets.py")
pytestmark = pytest.mark.slow


def start_target(mode: str, folder: Path, *args: str, python: list[str] | None = None,
                 preexec: object = None, script: Path = TARGETS) -> subprocess.Popen[str]:  # fmt: skip
    proc = subprocess.Popen([*(python or [sys.executable]), str(script), mode, str(folder), *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=preexec)  # type: ignore[arg-type]  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the target did not start: {line!r} {err}")
    return proc


def ask(folder: Path, timeout_s: float = 10) -> dict:
    """The `plain` target's account of itself (see targets.py)."""
    answer = folder / "answer"
    answer.unlink(missing_ok=True)
    (folder / "ask").write_text("")
    deadline = time.monotonic() + timeout_s
    while not answer.exists():
        assert time.monotonic() < deadline, "the target did not answer"
        time.sleep(0.02)
    return json.loads(answer.read_text())


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.communicate()


def test_no_signal_handler_is_installed_and_forked_children_record_nothing(tmp_path: Path) -> None:
    proc = start_target("plain", tmp_path)
    try:
        before = ask(tmp_path)
        capture = tmp_path / "c.jsonl"
        runner = session(proc.pid, capture, duration_s=3)
        done: list[object] = []
        thread = __import__("threading").Thread(target=lambda: done.append(runner.run()))
        thread.start()
        while not runner.recording and thread.is_alive():
            time.sleep(0.05)
        during = ask(tmp_path)
        thread.join()
        after = ask(tmp_path)
    finally:
        stop(proc)
    assert during["signals"] == before["signals"] == after["signals"]
    assert "latprof-inject" in during["threads"]
    # A child forked while the hooks are in drops them: nothing would remove them there.
    assert during["forked"] == {"threads": ["MainThread"], "recording": False}
    assert after["threads"] == before["threads"] == ["MainThread"]
    assert after["forked"] == {"threads": ["MainThread"], "recording": False}  # its fork handlers did nothing
    assert after["latprof_modules"] and after["meta_path"] == before["meta_path"]
    pids = {json.loads(line).get("pid") for line in capture.read_text().splitlines() if line.strip()}
    assert pids == {proc.pid}, pids  # the children wrote nothing into the capture


def session(pid: int, out: Path, duration_s: float = 2, **kwargs: object) -> InjectSession:
    return InjectSession(pid, str(out), duration_s=duration_s, hooks=bootstrap.hook_names(), max_rate=0, **kwargs)  # type: ignore[arg-type]


# --- the mechanism -----------------------------------------------------------------------------


@pytest.mark.parametrize("by_hand", [False, True], ids=["gdb-calls", "calls-by-hand"])
def test_the_code_runs_in_the_main_thread_and_the_process_goes_on(tmp_path: Path, by_hand: bool) -> None:
    """Both ways of calling into the target: gdb's own calls (where gdb can put the vector registers
    back: not gdb < 14 on a CPU with AMX, where the calls are made by hand anyway), and by hand."""
    proc = start_target("plain", tmp_path)
    try:
        before = ask(tmp_path)
        target = targets.inspect(proc.pid)
        assert target.python == sys.version_info[:2] and not target.free_threaded
        out = tmp_path / "ran"
        code = ("try:\n    t = __import__('threading')\n"
                f"    open({str(out)!r}, 'w').write(str(t.current_thread() is t.main_thread()))\n"
                "    del t\nexcept BaseException:\n    pass\n")  # fmt: skip
        assert isinstance(injector_for(target), GdbInjector)
        injection = GdbInjector(by_hand=by_hand).inject(target, code)
        if by_hand:
            assert injection.calls_by_hand
        deadline = time.monotonic() + 5
        while not out.exists():
            assert time.monotonic() < deadline, "the queued code never ran"
            time.sleep(0.01)
        assert out.read_text() == "True"
        assert 0 < injection.held_ms < 2000  # a sanity bound: the hold is measured in benchmarks/bench_inject.py
        assert injection.in_syscall  # the calls were made where no interpreter lock can be held
        after = ask(tmp_path)
        assert after["os_threads"] == before["os_threads"] and after["latprof_modules"] == []
        assert proc.poll() is None
    finally:
        stop(proc)


def test_the_python_is_found_from_the_process(tmp_path: Path) -> None:
    proc = start_target("plain", tmp_path)
    try:
        target = targets.inspect(proc.pid)
        assert target.version == f"{sys.version_info[0]}.{sys.version_info[1]}"
        assert set(target.addresses) == {"mmap", "Py_AddPendingCall", "PyRun_SimpleString"}
        assert all(address > 0 for address in target.addresses.values())
    finally:
        stop(proc)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(CollectorError, match="not a Python process"):
            targets.inspect(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    with pytest.raises(CollectorError, match="no process with PID"):
        targets.inspect(2**22 + 12345)


def test_a_newer_or_free_threaded_python_is_refused_with_the_reason() -> None:
    newer = targets.Target(1, 0, 0, (3, 14), False, "/usr/lib/libpython3.14.so")
    with pytest.raises(CollectorError, match="3.10 to 3.13"):
        injector_for(newer)
    free = targets.Target(1, 0, 0, (3, 13), True, "/usr/lib/libpython3.13t.so")
    with pytest.raises(CollectorError, match="free-threaded"):
        injector_for(free)
    assert isinstance(injector_for(targets.Target(1, 0, 0, (3, 11), False, "x")), GdbInjector)


# --- refusals ----------------------------------------------------------------------------------


def test_a_process_without_latprof_is_refused_with_the_fix_and_left_alone(tmp_path: Path) -> None:
    proc = start_target("plain", tmp_path, python=[sys.executable, "-S"])  # no site-packages: no latprof
    try:
        before = ask(tmp_path)
        results = session(proc.pid, tmp_path / "c.jsonl").run()
        assert [r.outcome for r in results] == ["not-importable"]
        assert "install it there" in results[0].message and "-m pip install latprof" in results[0].message
        after = ask(tmp_path)
        assert after["latprof_modules"] == [] and after["meta_path"] == before["meta_path"]
        assert after["main_names"] == before["main_names"]  # nothing was defined in __main__
    finally:
        stop(proc)


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
def test_another_users_process_needs_the_flag(tmp_path: Path) -> None:
    """A process of `nobody` (Debian's own python3: this user cannot reach the test's Python):
    refused without the flag; with it, the workspace is handed to that user, who can write its
    status there (and says latprof is not installed in its environment)."""
    import tempfile

    import shutil

    folder = Path(tempfile.mkdtemp(prefix="latprof-test-"))
    folder.chmod(0o777)
    script = folder / TARGETS.name  # that user may not reach the repository (a clone in a 0700 directory)
    shutil.copy(TARGETS, script)
    script.chmod(0o644)
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    proc = start_target("plain", folder, python=[python, "-S"], preexec=lambda: (os.setgid(65534), os.setuid(65534)),
                        script=script)  # fmt: skip
    try:
        with pytest.raises(CollectorError, match="--allow-other-user"):
            session(proc.pid, tmp_path / "c.jsonl").run()
        assert ask(folder)["latprof_modules"] == []
        results = session(proc.pid, tmp_path / "d.jsonl", duration_s=1, allow_other_user=True).run()
        assert [r.outcome for r in results] == ["not-importable"], results
        assert ask(folder)["latprof_modules"] == []
    finally:
        stop(proc)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_main_thread_blocked_in_a_c_call_times_out_and_the_process_stays_unchanged(tmp_path: Path) -> None:
    proc = start_target("blocked", tmp_path, str(SAFE_POINT_S + 4))
    try:
        started = time.monotonic()
        results = session(proc.pid, tmp_path / "c.jsonl").run()
        assert time.monotonic() - started < SAFE_POINT_S + 3
        assert [r.outcome for r in results] == ["no-safe-point"]
        assert "reached no safe point" in results[0].message and "left unchanged" in results[0].message
        out, err = proc.communicate(timeout=20)  # it wakes up, runs the queued code, which finds no payload
        assert proc.returncode == 0, err
        after = json.loads((tmp_path / "answer").read_text())
        assert after["latprof_modules"] == [] and after["threads"] == ["MainThread"] and after["os_threads"] == 1
        assert err == ""
    finally:
        if proc.poll() is None:
            stop(proc)


# --- a service: detach, a second injection, the watchdog --------------------------------------


def _attributes() -> str:
    """Every attribute a hook patches, as the service's /ids takes them."""
    return ",".join(f"{t.module}:{t.owner}:{t.attribute}" for hook in bootstrap.HOOKS.values()
                    for library in hook.scaffold.libraries for t in library.targets)  # fmt: skip


def _get(port: int, path: str) -> object:
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).read())


@pytest.fixture
def service() -> object:
    port = free_port()
    proc = start_server([sys.executable, "-m", "uvicorn", "tests.inject.apps.ids_app:app", "--port", str(port),
                         "--http", "h11", "--loop", "asyncio", "--log-level", "warning"], port)  # fmt: skip
    yield proc, port
    proc.terminate()
    proc.wait(20)


def _latprof_threads(pid: int) -> list[str]:
    """Threads py-spy sees running latprof's code or named latprof-*."""
    return [f"{t.tid} {t.name}" for t in pyspy.dump(pid)
            if t.name.startswith("latprof") or any("latprof" in f.file or "collectors/hooks" in f.file for f in t.frames)]  # fmt: skip


@pytest.mark.parametrize("by_hand", [False, True], ids=["gdb-calls", "calls-by-hand"])
def test_detach_puts_back_the_same_objects_and_a_second_injection_works(service: tuple, tmp_path: Path, by_hand: bool,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Both ways of calling (see test_the_code_runs_in_the_main_thread_and_the_process_goes_on): calls
    by hand into a uvicorn's main thread once crashed it (a register written in an outer frame) on
    hosts where gdb cannot make its own calls, and only there, so they are made here on every host."""
    if by_hand:
        monkeypatch.setattr(session_module, "injector_for", lambda target: GdbInjector(by_hand=True))
    proc, port = service
    spec = _attributes()
    before = _get(port, f"/ids?t={spec}")
    tasks_before = len(os.listdir(f"/proc/{proc.pid}/task"))
    for round_ in range(2):
        capture = tmp_path / f"c{round_}.jsonl"
        with load(port, "/work", clients=4) as failures:
            time.sleep(0.3)
            results = session(proc.pid, capture, duration_s=2).run()
            time.sleep(0.3)
        assert failures == [0]
        assert [r.outcome for r in results] == ["recorded"], results
        detach = results[0].detach
        assert detach["reason"] == "stopped by latprof" and detach["patched"] > 0
        assert detach["restored"] == detach["patched"] and detach["not_restored"] == []
        assert _get(port, f"/ids?t={spec}") == before
        time.sleep(0.2)
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == tasks_before
        assert _latprof_threads(proc.pid) == []
        assert _get(port, "/threads") == ["MainThread"]
        text = capture.read_text()
        assert '"type":"request"' in text and '"method":"inject"' in text
    with load(port, "/work", clients=2) as failures:
        time.sleep(1)
    assert failures == [0]


def test_the_report_is_the_run_report_with_method_inject(service: tuple, tmp_path: Path) -> None:
    proc, port = service
    with load(port, "/work", clients=4) as failures:
        time.sleep(0.3)
        done = subprocess.run([sys.executable, "-m", "latprof", "attach", "--pid", str(proc.pid), "--inject", "--duration", "3",
                               "--format", "json", "--out", str(tmp_path / "c.jsonl")],
                              cwd=ROOT, capture_output=True, text=True, timeout=90)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert_valid(report)
    assert report["source"]["kind"] == "run" and report["source"]["method"] == "inject"
    assert report["source"]["pid"] == proc.pid
    assert report["window"]["requests"] > 50 and report["latency_ms"]["p50"] > 4
    assert report["collection"]["warmup_requests_skipped"] == 0
    (process,) = report["collection"]["injected"]
    assert process["pid"] == proc.pid and process["outcome"] == "recorded" and "asgi" in process["hooks"]
    assert process["detach"]["restored"] == process["detach"]["patched"] > 0
    assert failures == [0]
    again = subprocess.run([sys.executable, "-m", "latprof", "analyze", "--format", "json", str(tmp_path / "c.jsonl")],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert json.loads(again.stdout)["verdict"] == report["verdict"]


def test_the_watchdog_removes_the_hooks_when_latprof_is_killed(service: tuple, tmp_path: Path) -> None:
    proc, port = service
    spec = _attributes()
    before = _get(port, f"/ids?t={spec}")
    latprof = subprocess.Popen([sys.executable, "-m", "latprof", "attach", "--pid", str(proc.pid), "--inject", "--duration", "120",
                                "--out", str(tmp_path / "c.jsonl")], cwd=ROOT, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert latprof.stderr is not None
        for line in latprof.stderr:
            if "recording in" in line:
                break
        else:
            pytest.fail("latprof never started recording")
        assert _get(port, f"/ids?t={spec}") != before  # the hooks are in
        latprof.kill()
        killed = time.monotonic()
        latprof.wait()
        while _get(port, f"/ids?t={spec}") != before or _get(port, "/threads") != ["MainThread"]:
            assert time.monotonic() - killed < 10 + 3, "the hooks were not removed after latprof died"
            time.sleep(0.2)
        assert time.monotonic() - killed > 5  # the lease, not something else, ended it
        assert _latprof_threads(proc.pid) == []
    finally:
        if latprof.poll() is None:
            latprof.kill()
        latprof.communicate()


def test_a_server_master_is_never_injected(tmp_path: Path) -> None:
    port = free_port()
    master = start_server([sys.executable, "-m", "uvicorn", "tests.inject.apps.ids_app:app", "--port", str(port),
                           "--workers", "2", "--log-level", "warning"], port)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while len(targets.workers(master.pid)) < 2:
            assert time.monotonic() < deadline, "uvicorn's workers did not come up"
            time.sleep(0.2)
        workers = targets.workers(master.pid)
        assert master.pid not in workers and len(workers) == 2
        with pytest.raises(CollectorError, match="never injects into a master"):
            session(master.pid, tmp_path / "c.jsonl", subprocesses=False).run()
        with load(port, "/work", clients=4) as failures:
            results = session(master.pid, tmp_path / "c.jsonl", duration_s=2).run()
        assert sorted(r.pid for r in results) == workers and {r.outcome for r in results} == {"recorded"}
        assert failures == [0]
    finally:
        master.terminate()
        master.wait(20)


@pytest.mark.parametrize("worker", ["sync", "gthread"])
def test_gunicorn_workers_are_injected_and_record_their_requests(tmp_path: Path, worker: str) -> None:
    """Through the master's PID: each worker (not the master) is injected, the running worker's
    application is wrapped, and every worker's requests are recorded with their Flask route."""
    from attach.procs import gunicorn

    port = free_port()
    extra = ["--threads", "4"] if worker == "gthread" else []
    master = start_server(gunicorn(port, "-k", worker, "-w", "2", *extra), port)
    try:
        with load(port, "/chat/7?ms=5", clients=6) as failures:
            time.sleep(0.5)
            done = subprocess.run([sys.executable, "-m", "latprof", "attach", "--pid", str(master.pid), "--inject",
                                   "--duration", "3", "--format", "json", "--out", str(tmp_path / "c.jsonl")],
                                  cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
        workers = targets.workers(master.pid)
    finally:
        master.terminate()
        master.wait(20)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    injected = report["collection"]["injected"]
    assert sorted(p["pid"] for p in injected) == sorted(workers) and master.pid not in workers
    assert {p["outcome"] for p in injected} == {"recorded"}
    assert all("running gunicorn worker" in p["coverage"]["wsgi"] for p in injected), [p["coverage"]["wsgi"] for p in injected]
    assert all(p["detach"]["restored"] == p["detach"]["patched"] > 0 for p in injected)
    requests = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines() if '"type":"request"' in line]
    assert {r["pid"] for r in requests} == set(workers)  # both workers recorded
    assert {r["route"] for r in requests} == {"GET /chat/<int:chat_id>"}
    assert failures == [0]
