"""Out-of-process stack samples of a running Python process, for `latprof attach`: py-spy and /proc.

Not a hook (nothing here runs inside the observed service). `dump(pid)` asks py-spy for one
snapshot of every thread (`py-spy dump --pid PID --json --nonblocking`: the target is not
paused) and reads each thread's kernel wait channel (`/proc/PID/task/TID/wchan`) right after,
so a thread blocked in a C call (a lock, a sleep, a socket read), which leaves no Python frame
of its own, can be told apart (`latprof.collectors.attach.stacks`). py-spy's `os_thread_id` is the kernel TID
that /proc and psutil use.

Errors are `SamplerError`s with one line a person can act on (no such process, not Python,
ptrace not permitted, py-spy missing or failing).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from time import sleep, time_ns
from typing import Any, Mapping

import orjson

from latprof.collectors.attach.stacks import GIL_MARK, Frame, frames_from_pyspy

#: How long one `py-spy dump` may take before it is given up.
DUMP_TIMEOUT_S = 10.0
#: A non-blocking read of a Python process can fail when it races the interpreter (threads
#: starting, frames changing under it): `dump` tries this many times, `RETRY_S` apart.
DUMP_ATTEMPTS = 3
RETRY_S = 0.2


class SamplerError(Exception):
    """Sampling the target failed; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class ThreadSample:
    """One thread at one moment: its kernel TID, name, frames (innermost first), wait channel."""

    pid: int
    tid: int
    name: str
    frames: list[Frame]
    active: bool | None
    wchan: str | None


#: Environment variable naming the py-spy executable to use (default: beside this Python, else on PATH).
ENV_PY_SPY = "LATPROF_PY_SPY"


def py_spy() -> str:
    """The py-spy executable: `$LATPROF_PY_SPY`, else beside this Python (a venv's bin), else on PATH."""
    chosen = os.environ.get(ENV_PY_SPY)
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise SamplerError(f"{ENV_PY_SPY}={chosen}: no such executable (pip install py-spy, or unset it)")
        return chosen
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    found = shutil.which("py-spy")
    if found is None:
        raise SamplerError("py-spy is not installed (pip install py-spy)")
    return found


def alive(pid: int) -> bool:
    """The process exists and has not exited (an exited child its parent has not reaped yet is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def wchan(pid: int, tid: int) -> str | None:
    """The kernel function thread `tid` of `pid` sleeps in ("0" when running); None when unreadable."""
    try:
        with open(f"/proc/{pid}/task/{tid}/wchan") as f:
            return f.read().strip()
    except OSError:
        return None


#: At most this many wait-channel files are kept open (`WaitChannels`); more threads than that are read by opening.
MAX_OPEN_WCHAN = 1024


def _read_wchan(fds: dict[tuple[int, int], int], pid: int, tid: int) -> str | None:
    """`wchan(pid, tid)` through a file kept open in `fds` (a tenth of the cost of opening it
    each time: this runs for every thread 100 times a second). A thread that ended reads
    empty or fails: its file is closed (a new thread reusing the TID gets a file of its own)."""
    key = (pid, tid)
    fd = fds.get(key)
    if fd is None:
        if len(fds) >= MAX_OPEN_WCHAN:
            return wchan(pid, tid)
        try:
            fd = fds[key] = os.open(f"/proc/{pid}/task/{tid}/wchan", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
    try:
        value = os.pread(fd, 256, 0)
    except OSError:
        value = b""
    if not value:
        os.close(fd)
        del fds[key]
        return None
    return value.decode("ascii", "replace").strip()


#: `futex(2)`'s system call number, per machine (`/proc/PID/task/TID/syscall`'s first field).
FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}.get(os.uname().machine)


def timed_futex(pid: int, tid: int) -> bool:
    """Thread `tid` of `pid` sits in a futex wait with a timeout (`/proc/PID/task/TID/syscall`:
    the call's number, then its arguments; futex's fourth is the timeout pointer). False when
    it cannot be read (another machine, no permission, the thread moved on)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    try:
        return FUTEX_SYSCALL is not None and int(fields[0]) == FUTEX_SYSCALL and int(fields[4], 16) != 0
    except (IndexError, ValueError):  # "running", or a short line
        return False


def mark_gil_waits(pid: int, channels: dict[int, str]) -> dict[int, str]:
    """One reading of every thread of `pid` (tid -> wait channel), with `GIL_MARK` appended to
    the futex waits that wait for the GIL: timed (CPython waits for the GIL on a condition with
    the switch interval as timeout; `threading.Lock.acquire()` without a timeout waits untimed)
    while another thread of the process runs ("0"). A lock acquired with a timeout, waited for
    while another thread runs, reads the same: a limit, said in docs/attach.md."""
    running = [tid for tid, value in channels.items() if value == "0"]
    if not running:
        return channels
    marked = dict(channels)
    for tid, value in channels.items():
        if value.startswith("futex") and any(r != tid for r in running) and timed_futex(pid, tid):
            marked[tid] = value + GIL_MARK
    return marked


def host_tids(pid: int) -> dict[int, int] | None:
    """{thread id as `pid` sees it: our thread id} when `pid` is in another PID namespace (a
    container's), else None (the ids are the same). py-spy reports each thread by the id its
    interpreter knows, which in a container is the container's; /proc here, and so the wait
    channels, need ours (`NSpid` in each thread's status: ours first, its own last)."""
    try:
        theirs, ours = os.stat(f"/proc/{pid}/ns/pid"), os.stat("/proc/self/ns/pid")
        if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
            return None
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone, or not ours to read: the ids are left as they are
        return None
    found: dict[int, int] = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("NSpid:"):
                        ids = line.split()[1:]
                        found[int(ids[-1])] = int(ids[0])
                        break
        except (OSError, ValueError, IndexError):
            continue
    return found


def dump(pid: int, *, timeout_s: float = DUMP_TIMEOUT_S) -> list[ThreadSample]:
    """One snapshot of every thread of `pid`, without pausing it."""
    if not os.path.exists(f"/proc/{pid}"):
        raise SamplerError(f"no process with PID {pid}")
    for attempt in range(1, DUMP_ATTEMPTS + 1):
        try:
            out = subprocess.run(
                [py_spy(), "dump", "--pid", str(pid), "--json", "--nonblocking"],
                capture_output=True, text=True, timeout=timeout_s,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SamplerError(f"py-spy dump of PID {pid} did not answer within {timeout_s:g} s") from None
        if out.returncode == 0:
            break
        message = out.stderr or out.stdout
        if attempt == DUMP_ATTEMPTS or _permission(message) or not alive(pid) or is_python(pid) is not True:
            raise SamplerError(_explain(pid, message))
        sleep(RETRY_S)  # a Python process read while its interpreter changed: read it again
    try:
        threads: Any = json.loads(out.stdout)
    except ValueError:
        raise SamplerError(f"py-spy dump of PID {pid} printed something that is not JSON") from None
    found = [t for t in (threads if isinstance(threads, list) else ()) if isinstance(t.get("os_thread_id"), int)]
    mapping = host_tids(pid)
    if mapping:
        for t in found:
            t["os_thread_id"] = mapping.get(t["os_thread_id"], t["os_thread_id"])
    read = {t["os_thread_id"]: wchan(pid, t["os_thread_id"]) for t in found}
    channels = mark_gil_waits(pid, {tid: value for tid, value in read.items() if value is not None})
    return [
        ThreadSample(pid, t["os_thread_id"], str(t.get("thread_name") or ""), frames_from_pyspy(t),
                     t.get("active") if isinstance(t.get("active"), bool) else None, channels.get(t["os_thread_id"]))
        for t in found
    ]  # fmt: skip


def _explain(pid: int, stderr: str) -> str:
    """py-spy's failure as one line that says what to do."""
    text = " ".join(stderr.split())
    lower = text.lower()
    if _permission(stderr):
        return (
            f"not permitted to read PID {pid}: run latprof as the same user or root; check"
            " kernel.yama.ptrace_scope (0 or 1); in a container add --cap-add SYS_PTRACE"
        )
    if "no such process" in lower or not os.path.exists(f"/proc/{pid}"):
        return f"PID {pid} exited"
    python = is_python(pid)
    if python is False or (python is None and "python" in lower and ("not" in lower or "fail" in lower)):
        return _not_python(pid)
    return f"py-spy failed on PID {pid}: {_first_line(stderr)[:300]}"


def _permission(message: str) -> bool:
    lower = message.lower()
    return "permission" in lower or "operation not permitted" in lower or "ptrace" in lower


def is_python(pid: int) -> bool | None:
    """Whether `pid` runs a Python interpreter: its executable is named python, or it maps a
    libpython (uWSGI, an embedding program). None when that cannot be read (gone, not permitted).

    Told from the process, not from py-spy's message: a read of a Python process that raced its
    interpreter fails with words ("Failed to ... python ...") that also fit a process with no
    Python in it."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    if "python" in os.path.basename(exe).lower():
        return True
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any("libpython" in line for line in f)
    except OSError:
        return None


def _first_line(text: str) -> str:
    """py-spy's message without the Rust backtrace it may print after it ("Stack backtrace: ...")."""
    return " ".join(text.split("Stack backtrace:", 1)[0].split())


def _not_python(pid: int) -> str:
    """One line: PID is not Python; the Python processes it started, if any, to attach to instead."""
    name, children = process_label(pid), python_descendants(pid)
    line = f"PID {pid}{f' ({name})' if name else ''} is not a Python process"
    if not children:
        return line + " and started none: attach to the Python process itself (e.g. `pgrep -af python`)"
    shown = ", ".join(f"{child} ({process_label(child)})" for child in children[:3]) + (", ..." if len(children) > 3 else "")
    return f"{line}; the Python processes it started: {shown}: attach to one of them, e.g. `latprof attach --pid {children[0]}`"


def process_label(pid: int) -> str:
    """What a process runs, without its arguments (they can hold a password or a prompt: `ps` shows
    them, latprof does not repeat them): its name and, for Python, the module (`python -m
    uvicorn`) or the script's file name (`python app.py`); "" when it is gone."""
    import psutil

    try:
        proc = psutil.Process(pid)
        name = proc.name()
        cmdline = proc.cmdline()
    except psutil.Error:
        return ""
    if "python" not in name.lower() or len(cmdline) < 2:
        return name
    args = cmdline[1:]
    if "-m" in args and args.index("-m") + 1 < len(args):
        return f"{name} -m {args[args.index('-m') + 1]}"
    if "-c" in args:
        return f"{name} -c ..."
    taking_value = False
    for arg in args:  # the script: the first argument that is neither an option nor an option's value
        if taking_value:
            taking_value = False
        elif arg in ("-X", "-W"):
            taking_value = True
        elif arg == "-":  # the script from stdin; what follows is its arguments
            return f"{name} -"
        elif not arg.startswith("-"):
            return f"{name} {os.path.basename(arg)}"
    return name


def python_descendants(pid: int) -> list[int]:
    """PIDs of the Python processes among `pid`'s descendants (by executable name), oldest first."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for proc in children:
        try:
            if "python" in os.path.basename(proc.exe()).lower():
                found.append((proc.create_time(), proc.pid))
        except psutil.Error:
            continue
    return [p for _, p in sorted(found)]


# --- continuous sampling: successive short recordings ------------------------------------------
#
# `py-spy record` writes its output only when it ends; its chrometrace format (`-f chrometrace
# -t`) carries the kernel thread ids and, per thread, when each stack began and ended;
# `py-spy dump` costs a process start per snapshot (about 15 ms here), too slow for 100 Hz. So
# the sampler runs successive recordings of `WINDOW_S` (`latprof top`) or `ATTACH_WINDOW_S`
# (`latprof attach`) each, per process (`--subprocesses`
# would mix the processes' threads in one file): each yields, per thread, how many samples each
# stack got in that window, and when. A recording takes about 0.2 s to attach before
# it samples, so windows are about that far apart (a window's start and end say what it covers),
# and requests that span the gap are not reconstructed. Idle threads are kept (`--idle`): without it every wait is
# dropped. The target is never paused (`--nonblocking`).

#: Length of one recording, in whole seconds (py-spy's `--duration` takes no fraction), for
#: `latprof top`'s live view.
WINDOW_S = 1
#: ... and for `latprof attach`: each py-spy start reads the target's memory maps and
#: interpreter state again, which the service pays for (docs/performance.md: one-second
#: recordings cost its throughput 8%, five-second ones 4%). The samples of a longer recording
#: are still stamped with their own second (`Window.seconds`).
ATTACH_WINDOW_S = 5


@dataclass(frozen=True, slots=True)
class StackCount:
    """One thread's samples of one stack in a window."""

    tid: int
    thread: str
    frames: tuple[Frame, ...]  # innermost first
    count: int


@dataclass(frozen=True, slots=True)
class Window:
    """What one recording of one process saw: `counts` over [start_ns, end_ns) at `rate` Hz.

    `spans` holds, per thread, what it did in time order: (start, end, index into `counts`),
    nanoseconds from the recording's first sample (about `start_ns`), one per stretch of
    samples of one stack — what tells one request from the next on a worker thread
    (`latprof.attach.reconstruct`)."""

    pid: int
    start_ns: int
    end_ns: int
    rate: int
    counts: list[StackCount]
    spans: Mapping[int, tuple[tuple[int, int, int], ...]] = field(default_factory=dict)

    def seconds(self) -> list[Window]:
        """The recording cut into one window per second it covers, each with the counts of the
        time its threads spent in each stack then (a window without spans: itself)."""
        length = self.end_ns - self.start_ns
        if not self.spans or length <= 1_500_000_000:
            return [self]
        cuts = list(range(0, length, 1_000_000_000))
        if length - cuts[-1] < 500_000_000 and len(cuts) > 1:
            cuts.pop()  # a last part under half a second joins the one before
        bounds = list(zip(cuts, cuts[1:] + [max(length, max(m[-1][1] for m in self.spans.values()))]))
        time_in: list[dict[int, int]] = [{} for _ in bounds]  # per part: stack index -> ns
        for mine in self.spans.values():
            for begin, end, index in mine:
                for k, (lo, hi) in enumerate(bounds):
                    overlap = min(end, hi) - max(begin, lo)
                    if overlap > 0:
                        time_in[k][index] = time_in[k].get(index, 0) + overlap
        parts = []
        for (lo, hi), spent in zip(bounds, time_in):
            counts = [StackCount(c.tid, c.thread, c.frames, max(1, round(spent[i] * self.rate / 1e9)))
                      for i, c in enumerate(self.counts) if spent.get(i)]  # fmt: skip
            parts.append(Window(self.pid, self.start_ns + lo, self.start_ns + hi, self.rate, counts))
        return parts


#: Where py-spy's short file names start in an absolute one: a library's path below its
#: site-packages, a standard-library module's below its folder.
_SHORT_FROM = re.compile(r"^.*/(?:site-packages|dist-packages|lib/python\d+(?:\.\d+)?)/")
#: The frame `--threads` puts at the root of every stack: "thread (TID): NAME" (no file).
_THREAD = re.compile(r"^thread \((\d+)\)(?::\s*(.*))?$")


def short_filename(path: str) -> str:
    """A frame's file as py-spy's `short_filename` names a library's (`sqlalchemy/pool/impl.py`,
    `threading.py`); the service's own files keep their absolute path."""
    return _SHORT_FROM.sub("", path)


def parse_chrometrace(text: str | bytes, rate: int) -> tuple[list[StackCount], dict[int, tuple[tuple[int, int, int], ...]]]:
    """py-spy's `--format chrometrace --threads` output: per thread, a begin (`B`) event when a
    sample shows a frame the previous one did not and an end (`E`) event when a frame is gone,
    stamped with the sample's time (µs since the recording began), and every frame ended at
    the end. Frames are told apart by function and file (not line), as py-spy does there.

    Returns each thread's count per stack (its time in that stack at `rate` Hz, at least one
    sample; file names shortened as py-spy's raw format does) and each thread's spans in order:
    (start ns, end ns, index into those counts)."""
    try:
        events = orjson.loads(text)
    except orjson.JSONDecodeError:
        return [], {}
    if isinstance(events, dict):
        events = events.get("traceEvents")
    if not isinstance(events, list):
        return [], {}
    interned: dict[tuple[Any, Any], Frame] = {}
    stacks: dict[Any, list[Frame]] = {}  # py-spy's thread key -> frames now, outermost first
    pending: dict[Any, int] = {}  # thread key -> time of the events being applied
    changes: dict[Any, list[tuple[int, tuple[Frame, ...]]]] = {}
    for e in events:
        try:
            key, ts, name, ph = e["tid"], e["ts"], e["name"], e["ph"]
            args = e.get("args")
            file = args.get("filename") if args else ""
        except (KeyError, TypeError, AttributeError):
            continue
        if not isinstance(ts, int):
            continue
        stack = stacks.get(key)
        if stack is None:
            stack = stacks[key] = []
        before = pending.get(key)
        if before is not None and ts != before:
            changes.setdefault(key, []).append((before, tuple(stack)))
        pending[key] = ts
        if ph == "B":
            frame = interned.get((name, file))
            if frame is None:
                frame = interned[(name, file)] = Frame(str(name), short_filename(str(file or "")))
            stack.append(frame)
        elif stack:
            stack.pop()
    for key, ts in pending.items():
        changes.setdefault(key, []).append((ts, tuple(stacks[key])))
    keys: dict[tuple[int, str, tuple[Frame, ...]], int] = {}
    time_us: list[int] = []
    spans: dict[int, tuple[tuple[int, int, int], ...]] = {}
    for seen in changes.values():
        mine: list[tuple[int, int, int]] = []
        tid = None
        for (ts, now), (next_ts, _) in zip(seen, seen[1:]):
            head = _THREAD.match(now[0].name) if now and not now[0].file else None
            if head is None or next_ts <= ts:
                continue
            tid, name = int(head.group(1)), head.group(2) or ""
            stack_key = (tid, name, now[:0:-1])  # innermost first, without the thread's own frame
            index = keys.get(stack_key)
            if index is None:
                index = keys[stack_key] = len(time_us)
                time_us.append(0)
            time_us[index] += next_ts - ts
            if mine and mine[-1][2] == index and mine[-1][1] == ts * 1000:  # a change undone at once: one span
                mine[-1] = (mine[-1][0], next_ts * 1000, index)
            else:
                mine.append((ts * 1000, next_ts * 1000, index))
        if tid is not None and mine:
            spans[tid] = tuple(mine)
    counts = [StackCount(tid, name, frames, max(1, round(time_us[i] * rate / 1e6))) for (tid, name, frames), i in keys.items()]
    return counts, spans


def record_window(pid: int, *, seconds: int = WINDOW_S, rate: int = 100, out_dir: str | None = None) -> Window:
    """One recording of `pid` for `seconds` (whole, blocking): its per-thread stack counts and
    each thread's samples in order."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="latprof-spy-", dir=out_dir) as tmp:
        out = os.path.join(tmp, "chrometrace.json")
        started = time_ns()
        try:
            proc = subprocess.run(
                [py_spy(), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", str(rate),
                 "--format", "chrometrace", "--threads", "--idle", "--nonblocking", "--output", out],
                capture_output=True, text=True, timeout=seconds + DUMP_TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SamplerError(f"py-spy record of PID {pid} did not end within {seconds + DUMP_TIMEOUT_S:g} s") from None
        ended = time_ns()
        if proc.returncode != 0 and not os.path.exists(out):
            raise SamplerError(_explain(pid, proc.stderr or proc.stdout))
        try:
            with open(out, "rb") as f:
                counts, spans = parse_chrometrace(f.read(), rate)
        except OSError:
            counts, spans = [], {}
    mapping = host_tids(pid)
    if mapping:  # a container's thread ids, as ours
        counts = [StackCount(mapping.get(c.tid, c.tid), c.thread, c.frames, c.count) for c in counts]
        spans = {mapping.get(tid, tid): mine for tid, mine in spans.items()}
    # the samples were taken over the end of the call (attaching came first): as long as the
    # spans say (py-spy's `--duration 1` runs a little over a second), else `seconds`
    length = max((mine[-1][1] for mine in spans.values()), default=int(seconds * 1e9))
    return Window(pid, max(started, ended - length), ended, rate, counts, spans)


class WaitChannels:
    """Reads the wait channel of every thread of the watched processes `hz` times a second (a
    thread of its own), and tells, per thread, which channels it was seen in over a time range.

    Memory is bounded: per thread, the last `keep_s` seconds of readings."""

    def __init__(self, hz: float = 100.0, keep_s: float = 10.0) -> None:
        import collections
        import threading

        self.interval_s = 1.0 / hz
        self._keep = max(1, int(hz * keep_s))
        self._pids: set[int] = set()
        self._readings: dict[tuple[int, int], collections.deque[tuple[int, str]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="latprof-wchan", daemon=True)
        self._deque = collections.deque

    def watch(self, pid: int) -> None:
        with self._lock:
            self._pids.add(pid)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        fds: dict[tuple[int, int], int] = {}  # each thread's wchan file, open for its life: a read is then one pread
        try:
            while not self._stop.wait(self.interval_s):
                with self._lock:
                    pids = list(self._pids)
                now = time_ns()
                for pid in pids:
                    try:
                        tids = os.listdir(f"/proc/{pid}/task")
                    except OSError:
                        continue
                    sweep: dict[int, str] = {}
                    for tid_text in tids:
                        tid = int(tid_text)
                        value = _read_wchan(fds, pid, tid)
                        if value is not None:
                            sweep[tid] = value
                    for tid, value in mark_gil_waits(pid, sweep).items():
                        key = (pid, tid)
                        readings = self._readings.get(key)
                        if readings is None:
                            readings = self._readings.setdefault(key, self._deque(maxlen=self._keep))
                        readings.append((now, value))
        finally:
            for fd in fds.values():
                os.close(fd)

    def readings(self, pid: int, tid: int, start_ns: int, end_ns: int) -> list[tuple[int, str]]:
        """Thread `tid` of `pid`'s readings (time, wait channel) in [start_ns, end_ns), oldest first."""
        return [(ts, value) for ts, value in list(self._readings.get((pid, tid), ())) if start_ns <= ts < end_ns]

    def between(self, pid: int, start_ns: int, end_ns: int) -> dict[int, dict[str, int]]:
        """{tid: {wait channel: readings}} of `pid`'s threads in [start_ns, end_ns)."""
        found: dict[int, dict[str, int]] = {}
        for (p, tid), readings in list(self._readings.items()):
            if p != pid:
                continue
            counts: dict[str, int] = {}
            for ts, value in list(readings):
                if start_ns <= ts < end_ns:
                    counts[value] = counts.get(value, 0) + 1
            if counts:
                found[tid] = counts
        return found


#: A supervisor (a sampled process with sampled children: gunicorn's arbiter, uvicorn's
#: `--workers` parent) whose last window had no busy sample is sampled at rate / this: about a
#: sixth of the sampler's py-spy CPU for one that only waits, as they do.
IDLE_PARENT_DIVISOR = 10


class Sampler:
    """Samples a process and, unless `subprocesses` is off, its Python children (a gunicorn
    master's workers, found again every window, so restarted workers are picked up), each in a
    recording loop of its own: one `Window` after another, handed to `on_window` (from the
    loops' threads: it must be thread-safe), each process's apart from the others'.
    `on_window` may return whether the window had a busy sample: a supervisor that had none
    is sampled at a tenth of the rate (`IDLE_PARENT_DIVISOR`) until one has; its `Window.rate` says so.

    Windows of one process follow each other with the time py-spy needs to attach in between
    (about 0.2 s here); a window's own start and end say what it covers. A
    process that exits ends its loop (`exited`); an error of the sampler is kept in `errors`
    (one line each) and ends that process's loop only.
    """

    def __init__(
        self,
        pid: int,
        on_window: Any,
        *,
        rate: int = 100,
        window_s: int = WINDOW_S,
        subprocesses: bool = True,
    ) -> None:
        import threading

        self.pid = pid
        self.on_window = on_window
        self.rate = rate
        self.window_s = window_s
        self.subprocesses = subprocesses
        self.stop_event = threading.Event()
        self.exited: list[int] = []
        self.errors: list[str] = []
        self._loops: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()
        self._parents: set[int] = set()  # sampled processes with sampled children: a server's supervisor

    def processes(self) -> list[int]:
        """The target and its Python children now."""
        import psutil

        try:
            root = psutil.Process(self.pid)
            found = [root]
            if self.subprocesses:
                found += root.children(recursive=True)
        except psutil.Error:
            return []
        pids = []
        parents = set()  # of the Python children
        for proc in found:
            try:
                if proc.pid == self.pid or "python" in os.path.basename(proc.exe()).lower():
                    pids.append(proc.pid)
                    if proc.pid != self.pid:
                        parents.add(proc.ppid())
            except psutil.Error:
                continue
        self._parents = parents.intersection(pids)
        return pids

    def run(self, duration_s: float) -> None:
        """Sample for `duration_s` (or until `stop_event` is set); returns when every loop ended."""
        import threading

        if not os.path.exists(f"/proc/{self.pid}"):
            raise SamplerError(f"no process with PID {self.pid}")
        deadline = time_ns() + int(duration_s * 1e9)
        while not self.stop_event.is_set() and time_ns() < deadline:
            for pid in self.processes():
                with self._lock:
                    if pid in self._loops:  # running, or ended (exited, failed): not started again
                        continue
                    loop = threading.Thread(target=self._loop, args=(pid, deadline), name=f"latprof-spy-{pid}", daemon=True)
                    self._loops[pid] = loop
                    loop.start()
            if not alive(self.pid):
                break
            self.stop_event.wait(min(1.0, max(0.0, (deadline - time_ns()) / 1e9)))  # new workers found within a second
        for loop in list(self._loops.values()):
            loop.join(self.window_s + DUMP_TIMEOUT_S + 5)

    def _rate_after(self, pid: int, busy: bool | None) -> int:
        """The rate of `pid`'s next window: low while it is a supervisor with nothing to do
        (`busy` False: its last window had no busy sample, and it has Python children)."""
        if busy is False and pid in self._parents:
            return max(1, self.rate // IDLE_PARENT_DIVISOR)
        return self.rate

    def _loop(self, pid: int, deadline: int) -> None:
        rate = self.rate
        while not self.stop_event.is_set():
            left_s = (deadline - time_ns()) / 1e9
            if left_s < 0.5:  # a recording is whole seconds: less than half of one left is none
                return
            try:
                window = record_window(pid, seconds=min(self.window_s, max(1, round(left_s))), rate=rate)
            except SamplerError as exc:
                if not alive(pid):
                    self.exited.append(pid)
                else:
                    self.errors.append(str(exc))
                return
            busy = self.on_window(window) if window.counts else None
            rate = self._rate_after(pid, busy)
            if not alive(pid):
                self.exited.append(pid)
                return
