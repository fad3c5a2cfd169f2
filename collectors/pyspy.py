"""Out-of-process stack samples of a running Python process, for `latprof attach`: py-spy and /proc.

Not a hook (nothing here runs inside the observed service). `dump(pid)` asks py-spy for one
snapshot of every thread (`py-spy dump --pid PID --json --nonblocking`: the target is not
paused) and reads each thread's kernel wait channel (`/proc/PID/task/TID/wchan`) right after,
so a thread blocked in a C call (a lock, a sleep, a socket read), which leaves no Python frame
of its own, can be told apart (`latprof.stacks`). py-spy's `os_thread_id` is the kernel TID
that /proc and psutil use.

Errors are `SamplerError`s with one line a person can act on (no such process, not Python,
ptrace not permitted, py-spy missing or failing).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latprof.stacks import Frame, frames_from_pyspy

#: How long one `py-spy dump` may take before it is given up.
DUMP_TIMEOUT_S = 10.0


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


def py_spy() -> str:
    """The py-spy executable: beside this Python (a venv's bin), else on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    found = shutil.which("py-spy")
    if found is None:
        raise SamplerError("py-spy is not installed (pip install py-spy)")
    return found


def wchan(pid: int, tid: int) -> str | None:
    """The kernel function thread `tid` of `pid` sleeps in ("0" when running); None when unreadable."""
    try:
        with open(f"/proc/{pid}/task/{tid}/wchan") as f:
            return f.read().strip()
    except OSError:
        return None


def dump(pid: int, *, timeout_s: float = DUMP_TIMEOUT_S) -> list[ThreadSample]:
    """One snapshot of every thread of `pid`, without pausing it."""
    if not os.path.exists(f"/proc/{pid}"):
        raise SamplerError(f"no process with PID {pid}")
    try:
        out = subprocess.run(
            [py_spy(), "dump", "--pid", str(pid), "--json", "--nonblocking"],
            capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SamplerError(f"py-spy dump of PID {pid} did not answer within {timeout_s:g} s") from None
    if out.returncode != 0:
        raise SamplerError(_explain(pid, out.stderr or out.stdout))
    try:
        threads: Any = json.loads(out.stdout)
    except ValueError:
        raise SamplerError(f"py-spy dump of PID {pid} printed something that is not JSON") from None
    samples = []
    for thread in threads if isinstance(threads, list) else ():
        tid = thread.get("os_thread_id")
        if not isinstance(tid, int):
            continue
        samples.append(
            ThreadSample(pid, tid, str(thread.get("thread_name") or ""), frames_from_pyspy(thread),
                         thread.get("active") if isinstance(thread.get("active"), bool) else None, wchan(pid, tid))
        )  # fmt: skip
    return samples


def _explain(pid: int, stderr: str) -> str:
    """py-spy's failure as one line that says what to do."""
    text = " ".join(stderr.split())
    lower = text.lower()
    if "permission" in lower or "operation not permitted" in lower or "ptrace" in lower:
        return (
            f"not permitted to read PID {pid}: run latprof as the same user or root; check"
            " kernel.yama.ptrace_scope (0 or 1); in a container add --cap-add SYS_PTRACE"
        )
    if "no such process" in lower or not os.path.exists(f"/proc/{pid}"):
        return f"PID {pid} exited"
    if "python" in lower and ("not" in lower or "fail" in lower):
        return f"PID {pid} does not look like a Python process (py-spy: {text[:200]})"
    return f"py-spy failed on PID {pid}: {text[:300]}"
