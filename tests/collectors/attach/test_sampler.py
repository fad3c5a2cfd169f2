"""Continuous sampling of a real process: one py-spy recording window, wait channels, what each thread did."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attach.procs import end, free_port, gunicorn, park, start_server
import services  # tests/services.py: the local services the tests use
from latprof.collectors.attach import pyspy
from latprof.layers import APP, DB_POOL, LOCK
from latprof.collectors.attach.stacks import Frame, classify_count

pytestmark = pytest.mark.slow  # real processes, sampled from outside



@pytest.mark.parametrize("scenario, layer", [("lock_wait", LOCK), ("sqlalchemy_pool_wait", DB_POOL), ("cpu", APP)])
def test_a_window_of_a_parked_thread_is_all_its_layer(scenario, layer):
    if scenario == "sqlalchemy_pool_wait":
        services.require_pg()
    proc, tid = park(scenario)
    channels = pyspy.WaitChannels(hz=100)
    channels.watch(proc.pid)
    channels.start()
    try:
        window = pyspy.record_window(proc.pid, seconds=1, rate=100)
    finally:
        channels.stop()
        end(proc)
    mine = [c for c in window.counts if c.tid == tid]
    samples = sum(c.count for c in mine)
    # the time in each stack at 100 Hz, over a recording of a second (py-spy runs a little over it,
    # more on a loaded host: 1.27 s with the target spinning one of two cores)
    assert 60 <= samples <= 160, window.counts
    assert all(c.thread == "target" for c in mine)
    # when, in the recording, the target was in each of its stacks: back to back, over the whole second
    spans = window.spans[tid]
    assert {window.counts[i].tid for _, _, i in spans} == {tid}
    assert all(end == start for (_, end, _), (start, _, _) in zip(spans, spans[1:]))
    assert 0.6e9 <= spans[-1][1] - spans[0][0] <= 1.6e9, spans
    # the window is the recording: as long as its samples say, not as long as the py-spy call (attaching came first)
    length = max(s[-1][1] for s in window.spans.values())
    assert spans[-1][1] <= window.end_ns - window.start_ns <= length
    wchans = channels.between(proc.pid, window.start_ns, window.end_ns).get(tid)
    assert wchans, "no wait channel readings of the target in the window"
    by_layer: dict[object, int] = {}
    for c in mine:
        for classification, n in classify_count(c.frames, c.count, wchans):
            by_layer[classification.layer] = by_layer.get(classification.layer, 0) + n
    assert sum(by_layer.values()) == samples
    assert by_layer.get(layer, 0) >= 0.9 * samples, by_layer
    assert 0.5e9 <= window.end_ns - window.start_ns <= 1.6e9


def test_samples_without_a_signature_are_shared_out_over_the_wait_channels():
    frames = (Frame("handler", "app.py"),)
    shares = dict((c.signature, n) for c, n in classify_count(frames, 10, {"futex_do_wait": 30, "0": 70}))
    assert shares == {"running": 7, "wchan.futex": 3}


def test_a_gunicorn_master_and_its_workers_are_sampled_apart():
    """Attached to the master of 2 sync workers kept busy with CPU-bound requests: a window per
    process per second, the workers' request threads running the app, the master idle."""
    import threading
    import time
    import urllib.request

    from latprof.collectors.attach.stacks import BUSY, IDLE, classify

    port = free_port()
    master = start_server(gunicorn(port, "-w", "2"), port)
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/cpu?ms=200", timeout=10).read()
            except OSError:
                time.sleep(0.05)

    try:
        deadline = time.monotonic() + 20
        clients = [threading.Thread(target=client, daemon=True) for _ in range(2)]
        for c in clients:
            c.start()
        windows: list[pyspy.Window] = []
        lock = threading.Lock()

        def keep(window: pyspy.Window) -> None:
            with lock:
                windows.append(window)

        sampler = pyspy.Sampler(master.pid, keep, rate=100)
        while len(workers := [p for p in sampler.processes() if p != master.pid]) < 2:  # /health needed only one
            assert time.monotonic() < deadline, "gunicorn did not start its second worker"
            time.sleep(0.1)
        sampler.run(3.5)
    finally:
        stop.set()
        master.terminate()
        master.wait(20)
    assert len(workers) == 2 and not sampler.errors
    assert {w.pid for w in windows} == {master.pid, *workers}
    for pid in workers:
        mine = [w for w in windows if w.pid == pid]
        assert len(mine) >= 2  # about one a second
        states: dict[tuple[str, object], int] = {}
        for w in mine:
            for c in w.counts:
                k = classify(c.frames, wchan="0")  # running: these threads compute
                states[(k.state, k.layer)] = states.get((k.state, k.layer), 0) + c.count
        assert states.get((BUSY, "app"), 0) > 0.5 * sum(states.values()), states
    master_states: dict[str, int] = {}
    for w in windows:
        for c in w.counts if w.pid == master.pid else ():
            state = classify(c.frames).state
            master_states[state] = master_states.get(state, 0) + c.count
    # the master waits for signals, waking about once a second to look after its workers
    assert master_states.get(IDLE, 0) >= 0.9 * sum(master_states.values()), master_states


def test_sampling_a_pid_that_does_not_exist_is_one_clear_error():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(pyspy.SamplerError, match=f"no process with PID {proc.pid}"):
        pyspy.Sampler(proc.pid, lambda w: None).run(1)


def test_python_is_told_from_the_process_not_from_py_spys_words():
    python = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    other = subprocess.Popen(["sleep", "30"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        assert pyspy.is_python(python.pid) is True
        assert pyspy.is_python(other.pid) is False
        assert pyspy.is_python(gone.pid) is None
    finally:
        for p in (python, other):
            p.kill()
            p.wait()


def test_a_read_that_races_the_interpreter_is_tried_again(tmp_path, monkeypatch):
    """py-spy's non-blocking read of a Python process can fail once (frames changing under it)
    with words that also fit a process with no Python: the dump is tried again, and a Python
    process is never called 'not a Python process'. The real py-spy behind a wrapper that fails
    its first call with such a message."""
    real = pyspy.py_spy()
    calls = tmp_path / "calls"
    wrapper = tmp_path / "py-spy"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"echo x >> {calls}\n"
        f'if [ "$(wc -l < {calls})" -le "$FAIL_TIMES" ]; then\n'
        "  echo 'Error: Failed to find python version from target process' >&2; exit 1\n"
        "fi\n"
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv(pyspy.ENV_PY_SPY, str(wrapper))
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        monkeypatch.setenv("FAIL_TIMES", "1")
        threads = pyspy.dump(target.pid)
        assert threads and calls.read_text().count("x") == 2
        calls.unlink()
        monkeypatch.setenv("FAIL_TIMES", str(pyspy.DUMP_ATTEMPTS))  # every try fails: py-spy's own words, not "not Python"
        with pytest.raises(pyspy.SamplerError) as failed:
            pyspy.dump(target.pid)
        assert "not a Python process" not in str(failed.value)
        assert "Failed to find python version" in str(failed.value) and calls.read_text().count("x") == pyspy.DUMP_ATTEMPTS
    finally:
        target.kill()
        target.wait()
