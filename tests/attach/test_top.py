"""`latprof top`: windows counted into the layer table (hand-built windows, known answers), the
table rendered into a fixed-width console, and the live display in a real pseudo-terminal on real
processes: `q` and Ctrl-C quit with exit 0 and the terminal as it was."""

from __future__ import annotations

import io
import os
import re
import select
import signal
import struct
import subprocess
import sys
import time

import pytest

from attach.procs import ROOT, end, park
from latprof.collectors.attach import pyspy
from latprof.layers import APP, DB_POOL, EVENT_LOOP, LOCK, UNATTRIBUTED
from latprof.collectors.attach.stacks import Frame
from latprof.attach.top import STALE_NS, LayerRow, ProcessRow, TopCounts, TopSnapshot, render

S = 1_000_000_000


def frames(*text: str) -> tuple[Frame, ...]:
    """`"name file"` strings, innermost first."""
    return tuple(Frame(*f.split(" ", 1)) for f in text)


SPIN = frames("spin app.py", "Thread.run threading.py", "Thread._bootstrap threading.py")
LOCKED = frames("body app.py", "Thread.run threading.py")  # lock.acquire() leaves no frame: the futex says it
POOL_WAIT = frames("Condition.wait threading.py", "Queue.get sqlalchemy/util/queue.py",
                   "QueuePool._do_get sqlalchemy/pool/impl.py", "handler app.py")  # fmt: skip
IDLE_WORKER = frames("_worker concurrent/futures/thread.py", "Thread.run threading.py")
LOOP_HANDLER = frames("handler app.py", "Handle._run asyncio/events.py", "BaseEventLoop._run_once asyncio/base_events.py",
                      "BaseEventLoop.run_forever asyncio/base_events.py", "Runner.run asyncio/runners.py",
                      "run asyncio/runners.py", "<module> app.py")  # fmt: skip
LOOP_IDLE = frames("EpollSelector.select selectors.py", "BaseEventLoop._run_once asyncio/base_events.py",
                   "BaseEventLoop.run_forever asyncio/base_events.py", "Runner.run asyncio/runners.py")  # fmt: skip


def window(pid: int, second: int, *counts: tuple[int, tuple[Frame, ...], int]) -> object:
    """A one-second window of `pid` starting at `second`: (tid, frames, samples) per stack."""
    return pyspy.Window(pid, second * S, (second + 1) * S, 100, [pyspy.StackCount(tid, f"t{tid}", f, n) for tid, f, n in counts])


def by_layer(view: TopSnapshot) -> dict[str, LayerRow]:
    return {row.layer: row for row in view.layers}


# --- aggregation -----------------------------------------------------------------------------------


def test_a_window_counts_busy_samples_by_layer_and_idle_ones_apart():
    counts = TopCounts()
    counts.add(window(10, 0, (1, SPIN, 60), (2, LOCKED, 20), (3, IDLE_WORKER, 100)), {1: {"0": 90}, 2: {"futex_do_wait": 90}})
    view = counts.snapshot()
    assert (view.windows, view.samples) == (1, 180)
    assert view.idle_share_now == pytest.approx(100 / 180)
    app, lock = view.layers  # busiest first; the idle worker is no layer
    assert app == LayerRow(APP, 60, 0.75, 60, 0.75, 1, "spin (app.py)")
    assert lock == LayerRow(LOCK, 20, 0.25, 20, 0.25, 1, "body (app.py)")
    assert view.processes == (ProcessRow(10, 3, 80 / 180, 100 / 180, APP),)


def test_what_a_layer_does_is_the_signature_that_decided_or_the_innermost_frame():
    counts = TopCounts()
    counts.add(window(10, 0, (1, POOL_WAIT, 30), (2, POOL_WAIT, 30), (3, SPIN, 10)), {3: {"0": 90}})
    rows = by_layer(counts.snapshot())
    assert (rows[DB_POOL].what, rows[DB_POOL].threads_now, rows[DB_POOL].now_samples) == ("sqlalchemy.pool_wait", 2, 60)
    assert rows[APP].what == "spin (app.py)"


def test_a_frameless_stack_is_shared_out_over_its_wait_channels():
    counts = TopCounts()
    counts.add(window(10, 0, (1, LOCKED, 100)), {1: {"futex_do_wait": 75, "0": 25}})
    rows = by_layer(counts.snapshot())
    assert (rows[LOCK].now_samples, rows[APP].now_samples) == (75, 25)
    assert rows[LOCK].threads_now == rows[APP].threads_now == 1  # the same thread, in both


def test_a_busy_sample_no_signal_explains_is_unattributed():
    counts = TopCounts()
    counts.add(window(10, 0, (1, LOCKED, 50)), {1: {"hrtimer_nanosleep": 90}})  # a plain time.sleep
    assert [(r.layer, r.what) for r in counts.snapshot().layers] == [(UNATTRIBUTED, "body (app.py)")]


def test_an_event_loop_thread_busy_is_the_loop_held_with_what_holds_it():
    counts = TopCounts()
    counts.add(window(10, 0, (1, LOOP_HANDLER, 40), (1, LOOP_IDLE, 60)), {1: {"0": 90}})
    view = counts.snapshot()
    assert [(r.layer, r.now_samples, r.what) for r in view.layers] == [(EVENT_LOOP, 40, "app: handler (app.py)")]
    assert view.idle_share_now == pytest.approx(0.6)  # waiting for events is the loop free, not a layer
    assert view.processes[0].top_layer == EVENT_LOOP


def test_now_is_each_process_last_window_and_total_since_the_start():
    counts = TopCounts()
    counts.add(window(10, 0, (1, LOCKED, 100)), {1: {"futex_do_wait": 90}})
    counts.add(window(10, 1, (1, SPIN, 100)), {1: {"0": 90}})
    rows = by_layer(counts.snapshot())
    assert (rows[APP].now_share, rows[APP].total_share) == (1.0, 0.5)
    assert (rows[LOCK].now_samples, rows[LOCK].now_share, rows[LOCK].total_share, rows[LOCK].threads_now) == (0, 0.0, 0.5, 0)
    assert [r.layer for r in counts.snapshot().layers] == [APP, LOCK]  # busiest now first


def test_a_window_that_arrives_late_does_not_replace_a_newer_one():
    counts = TopCounts()
    counts.add(window(10, 1, (1, SPIN, 100)), {1: {"0": 90}})
    counts.add(window(10, 0, (1, LOCKED, 100)), {1: {"futex_do_wait": 90}})
    assert by_layer(counts.snapshot())[APP].now_share == 1.0


def test_now_adds_up_the_last_window_of_every_process():
    counts = TopCounts()
    counts.add(window(10, 0, (1, IDLE_WORKER, 100)), {})  # the master: idle
    counts.add(window(11, 0, (1, SPIN, 100)), {1: {"0": 90}})  # two workers, their thread ids alike
    counts.add(window(12, 0, (1, SPIN, 60), (2, LOCKED, 40)), {1: {"0": 90}, 2: {"futex_do_wait": 90}})
    view = counts.snapshot()
    rows = by_layer(view)
    assert (rows[APP].now_samples, rows[APP].threads_now, rows[APP].now_share) == (160, 2, 0.8)
    assert view.idle_share_now == pytest.approx(100 / 300)
    assert [(p.pid, p.top_layer, p.busy_share) for p in view.processes] == [(10, None, 0.0), (11, APP, 1.0), (12, APP, 1.0)]


def test_a_process_that_exited_or_stopped_being_sampled_drops_out_of_now_but_not_the_total():
    counts = TopCounts()
    counts.add(window(10, 0, (1, LOCKED, 100)), {1: {"futex_do_wait": 90}})
    counts.add(window(11, 0, (1, SPIN, 100)), {1: {"0": 90}})
    counts.forget(11)
    view = counts.snapshot()
    assert [p.pid for p in view.processes] == [10]
    assert (by_layer(view)[APP].now_samples, by_layer(view)[APP].total_share) == (0, 0.5)
    late = STALE_NS // S + 2  # 10's last window is older than that before 12's
    counts.add(window(12, late, (1, SPIN, 100)), {})
    assert [p.pid for p in counts.snapshot().processes] == [12]


def test_before_the_first_window_there_is_nothing_now():
    view = TopCounts().snapshot()
    assert (view.windows, view.samples, view.idle_share_now, view.layers, view.processes) == (0, 0, None, (), ())


# --- rendering -------------------------------------------------------------------------------------


def rendered(view: TopSnapshot, width: int = 100, **kw: object) -> str:
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=width, highlight=False, color_system=None)
    console.print(render(view, **{"pid": 4242, "name": "gunicorn", "elapsed_s": 75.0, **kw}))  # type: ignore[arg-type]
    return out.getvalue()


def test_the_display_has_the_header_the_layer_table_and_the_process_table():
    counts = TopCounts()
    counts.add(window(10, 0, (1, LOCKED, 120)), {1: {"futex_do_wait": 90}})
    counts.add(window(10, 1, (1, SPIN, 60), (2, LOOP_HANDLER, 20), (3, IDLE_WORKER, 120)), {1: {"0": 90}, 2: {"0": 90}})
    text = rendered(counts.snapshot())
    lines = [line.rstrip() for line in text.splitlines()]
    assert lines[0] == "PID 4242 (gunicorn)  processes 1  elapsed 1m15s  samples 320  idle 60%   q or Ctrl-C quits"
    table = [line.split(None, 4) for line in lines if line.strip().split(" ", 1)[0] in (APP, EVENT_LOOP, LOCK)]
    assert table == [
        [APP, "75%", "30%", "1", "spin (app.py)"],
        [EVENT_LOOP, "25%", "10%", "1", "app: handler (app.py)"],
        [LOCK, "-", "60%", "-", "body (app.py)"],
    ]
    assert any(line.split() == ["10", "3", "40%", "60%", APP] for line in lines), text
    assert ["layer", "now", "total", "threads"] == lines[[i for i, l in enumerate(lines) if "layer" in l][0]].split()[:4]
    assert all(len(line) <= 100 for line in lines)


def test_the_header_puts_how_to_quit_under_the_numbers_when_the_line_is_narrow():
    lines = rendered(TopCounts().snapshot(), width=60).splitlines()
    assert lines[0].startswith("PID 4242 (gunicorn)  processes 0") and "quits" not in lines[0]
    assert lines[1].strip() == "q or Ctrl-C quits"


def test_before_the_first_window_the_table_says_it_waits_and_a_status_line_shows():
    text = rendered(TopCounts().snapshot(), status="stopping…")
    assert "waiting for the first window" in text and text.rstrip().endswith("stopping…")


def test_a_long_what_is_cut_not_wrapped():
    long_frame = frames("a_very_long_function_name_" + "x" * 120 + " app.py")
    counts = TopCounts()
    counts.add(window(10, 0, (1, long_frame, 100)), {1: {"0": 90}})
    lines = rendered(counts.snapshot(), width=80).splitlines()
    (row,) = [line for line in lines if line.strip().startswith(APP)]
    assert len(row.rstrip()) <= 80 and row.rstrip().endswith("…")


# --- the live display, in a real terminal ------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")
#: Run latprof with the pty as its controlling terminal (Ctrl-C typed there signals its process group).
CONTROLLING_TTY = "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execv(sys.executable, sys.argv[1:])"


class Terminal:
    """`latprof top` in a pseudo-terminal of 120x40, as a user's shell would run it."""

    def __init__(self, *args: str) -> None:
        import fcntl
        import pty
        import termios

        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.modes = termios.tcgetattr(self.slave)
        self.output = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CONTROLLING_TTY, sys.executable, "-m", "latprof", "top", *args],
            stdin=self.slave, stdout=self.slave, stderr=self.slave, cwd=ROOT, start_new_session=True,
            env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"},
        )  # fmt: skip

    def text(self) -> str:
        return ANSI.sub("", self.output.decode(errors="replace"))

    def read(self, timeout_s: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout_s)
        if ready:
            try:
                self.output += os.read(self.master, 65536)
            except OSError:  # EIO: nothing on the other side any more
                time.sleep(timeout_s)

    def read_until(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text(), re.MULTILINE)
            if found:
                return found
            if self.proc.poll() is not None:
                break
            self.read(0.1)
        pytest.fail(f"no {pattern!r} within {timeout_s} s (exit {self.proc.poll()}):\n{self.text()[-3000:]}")

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def wait(self, timeout_s: float) -> int:
        """Keep reading (a full terminal would block the display) until the process exits."""
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read(0.05)
        self.read(0.2)
        code = self.proc.poll()
        if code is None:
            pytest.fail(f"latprof top did not exit within {timeout_s} s:\n{self.text()[-3000:]}")
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)
        os.close(self.slave)


def py_spy_children(pid: int) -> list[object]:
    import psutil

    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if "py-spy" in p.name()]
    except psutil.Error:
        return []


def still_running(procs: list[object]) -> list[object]:
    import psutil

    running = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:  # type: ignore[attr-defined]
                running.append(p)
        except psutil.NoSuchProcess:
            continue
    return running


def live_top_then_quit(scenario: str, layer: str, keys: bytes) -> Terminal:
    """`latprof top` on a parked scenario until its table shows `layer` busy now, then `keys`: exit 0, terminal as it was."""
    import termios

    target, _ = park(scenario)
    term = Terminal("--pid", str(target.pid))
    try:
        row = term.read_until(rf"^\s*{re.escape(layer)}\s+(\d+)%\s+(\d+)%\s+(\d+)\s+\S", 10)
        assert int(row.group(1)) > 0 and int(row.group(3)) >= 1, term.text()[-2000:]
        assert not termios.tcgetattr(term.slave)[3] & termios.ICANON, "the terminal is not in cbreak mode while top runs"
        assert f"PID {target.pid} (python" in term.text() and "q or Ctrl-C quits" in term.text()
        spies = py_spy_children(term.proc.pid)
        term.type(keys)
        started = time.monotonic()
        assert term.wait(5) == 0, term.text()[-2000:]
        print(f"quit after {time.monotonic() - started:.1f} s")
        assert termios.tcgetattr(term.slave) == term.modes
        assert "Traceback" not in term.text()
        assert "stopping…" in term.text() and "latprof top: stopped" in term.text()
        assert term.output.rstrip().endswith(b"\x1b[?25h") or b"\x1b[?25h" in term.output  # the cursor is back
        assert not still_running(spies), "py-spy outlived latprof top"
        return term
    finally:
        term.close()
        end(target)


@pytest.mark.slow
def test_q_quits_the_live_table_of_a_cpu_burner_showing_app():
    term = live_top_then_quit("cpu", APP, b"q")
    assert "spin (scenarios.py)" in term.text()


@pytest.mark.slow
def test_ctrl_c_at_the_terminal_quits_the_live_table_of_a_lock_wait_showing_lock():
    import termios

    modes = termios.tcgetattr(sys.stdin.fileno()) if sys.stdin.isatty() else None
    term = live_top_then_quit("lock_wait", LOCK, b"\x03")  # the terminal's VINTR: SIGINT to latprof and its py-spy
    assert term.modes[3] & termios.ISIG and term.modes[6][termios.VINTR] == b"\x03"
    assert modes is None or termios.tcgetattr(sys.stdin.fileno()) == modes


@pytest.mark.slow
def test_sigint_sent_to_the_process_quits_with_exit_0():
    import termios

    target, _ = park("cpu")
    term = Terminal("--pid", str(target.pid))
    try:
        term.read_until(r"^\s*app\s+\d+%", 10)
        term.proc.send_signal(signal.SIGINT)
        assert term.wait(5) == 0, term.text()[-2000:]
        assert termios.tcgetattr(term.slave) == term.modes and "Traceback" not in term.text()
    finally:
        term.close()
        end(target)


@pytest.mark.slow
def test_a_target_that_exits_is_said_and_top_exits_0():
    script = "import time\nend = time.time() + 2.5\nwhile time.time() < end:\n    sum(range(10_000))\n"
    target = subprocess.Popen([sys.executable, "-c", script])
    term = Terminal("--pid", str(target.pid))
    try:
        assert term.wait(15) == 0, term.text()[-2000:]
        assert f"latprof top: PID {target.pid} exited" in term.text() and "Traceback" not in term.text()
        # app's total share; its "now" column is "-" when the last snapshot came after the exit
        assert re.search(r"^\s*app\s+(\d+%|-)\s+\d+%", term.text(), re.MULTILINE), term.text()[-2000:]
    finally:
        term.close()
        target.kill()
        target.wait()


@pytest.mark.slow
def test_stdout_not_a_terminal_prints_a_plain_table_every_interval():
    target, _ = park("cpu")
    top = subprocess.Popen([sys.executable, "-m", "latprof", "top", "--pid", str(target.pid), "--interval", "0.5"],
                           cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        time.sleep(4)
        top.send_signal(signal.SIGINT)
        out, err = top.communicate(timeout=10)
    finally:
        if top.poll() is None:
            top.kill()
            top.communicate()
        end(target)
    text = out.decode()
    assert top.returncode == 0, err
    assert "\x1b" not in text and "Ctrl-C quits" in text and "q or Ctrl-C" not in text  # no terminal to read q from
    tables = text.count(f"PID {target.pid} (python")
    assert 5 <= tables <= 10, text
    assert re.search(r"^\s*app\s+\d+%", text, re.MULTILINE), text
    assert err.decode().splitlines() == ["latprof top: stopping…", "latprof top: stopped"]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["gone", "not python"])
def test_a_pid_that_cannot_be_sampled_is_one_line_and_exit_2(target):
    proc = subprocess.Popen([sys.executable, "-c", "pass"] if target == "gone" else ["sleep", "30"])
    if target == "gone":
        proc.wait()
    try:
        out = subprocess.run([sys.executable, "-m", "latprof", "top", "--pid", str(proc.pid)],
                             cwd=ROOT, capture_output=True, text=True, timeout=30)  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and str(proc.pid) in out.stderr, out.stderr
