"""How code gets into a running CPython: one interface, one tested mechanism.

`Injector.inject(target, code)` queues `code` (Python source) to run in the target's main
thread at its next safe point, and returns how long the target was held. What the code does
there is the payload's business (`latprof.inject.payload`): it only starts a thread.

- **`GdbInjector`** (CPython 3.10-3.13): gdb in batch mode, as `memray attach` uses it. gdb is
  the well-kept tool made for stopping a process and calling a function in it; Debian and
  every other distribution package it, and its ptrace permission model is the one operators
  already know from py-spy. While the target is stopped gdb reads no symbols (latprof hands it
  addresses), maps a page, writes the code and calls `Py_AddPendingCall(PyRun_SimpleString,
  page)` (see `_gdb_inject.py`): a few milliseconds on an idle process.
- **Python 3.14's `sys.remote_exec`** (PEP 768) is the interpreter's own way to do the same
  (the code runs at the next safe point, in the main thread): it slots in here as a second
  `Injector` once it can be tested; until then 3.14 and later are refused, as are
  free-threaded builds (whose hooks' thread-safety is untested).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from latprof.errors import CollectorError
from latprof.inject.target import SUPPORTED, Target, not_permitted

#: gdb must have stopped, changed and released the target within this many seconds.
GDB_TIMEOUT_S = 20.0
_SCRIPT = Path(__file__).resolve().parent / "_gdb_inject.py"
_MARK = "LATPROF-GDB "


@dataclass
class Injection:
    """What one injection did to the target."""

    mechanism: str
    #: How long the target was stopped (attach to detach), ms.
    held_ms: float
    #: The thread the calls were made on, and whether it was inside a system call then.
    thread: int
    in_syscall: bool
    threads: int
    #: The calls were made by hand, with the general-purpose registers alone (`_gdb_inject.py`'s notes):
    #: gdb could not write the vector registers (gdb < 14 on a CPU with AMX), or `by_hand` asked for it.
    calls_by_hand: bool = False


class Injector(Protocol):
    """Queues Python source to run in a target's main thread at its next safe point."""

    name: str

    def inject(self, target: Target, code: str) -> Injection:
        """Queue `code`; raise `CollectorError` (one line) when it could not be queued."""
        ...


def injector_for(target: Target) -> Injector:
    """The mechanism for `target`'s Python, or a `CollectorError` saying why there is none."""
    if target.free_threaded:
        raise CollectorError(f"PID {target.pid} runs a free-threaded CPython {target.version}: --inject is not"
                             " supported there yet (sample it: `latprof attach` without --inject)")  # fmt: skip
    if target.python >= (3, 14):
        raise CollectorError(f"PID {target.pid} runs CPython {target.version}: --inject supports 3.10 to 3.13 (3.14's"
                             " sys.remote_exec is not tested yet); sample it: `latprof attach` without --inject")  # fmt: skip
    if target.python not in SUPPORTED:
        raise CollectorError(f"PID {target.pid} runs CPython {target.version}: --inject supports 3.10 to 3.13")
    return GdbInjector()


class GdbInjector:
    """CPython 3.10-3.13 through gdb in batch mode (see the module's notes)."""

    name = "gdb"

    def __init__(self, gdb: str | None = None, timeout_s: float = GDB_TIMEOUT_S, by_hand: bool = False) -> None:
        self.gdb = gdb or shutil.which("gdb")
        self.timeout_s = timeout_s
        #: Make the calls by hand even where gdb's own calls work (tests run both ways).
        self.by_hand = by_hand

    def inject(self, target: Target, code: str) -> Injection:
        if not self.gdb:
            raise CollectorError("--inject needs gdb: install it (Debian/Ubuntu: apt-get install gdb; Fedora: dnf install gdb)")
        orders = {"pid": target.pid, "addresses": target.addresses, "code": code.encode().hex(), "by_hand": self.by_hand}
        env = dict(os.environ, LATPROF_GDB_ORDERS=json.dumps(orders))
        for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP"):  # gdb's own Python, not the caller's
            env.pop(name, None)
        proc = subprocess.Popen([self.gdb, "-nx", "--batch", "-x", str(_SCRIPT)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, text=True)  # fmt: skip
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            # A call that never returns: gdb unwinds it on SIGINT (unwindonsignal) and detaches.
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise CollectorError(f"gdb did not finish with PID {target.pid} within {self.timeout_s:g} s; it was told to"
                                 " undo its call and detach")  # fmt: skip
        line = next((ln for ln in out.splitlines() if ln.startswith(_MARK)), None)
        if line is None:
            first = next((ln.strip() for ln in (err or out).splitlines() if ln.strip()), "no output")
            if "python" in first.lower() and ("not supported" in first.lower() or "scripting" in first.lower()):
                raise CollectorError("--inject needs a gdb built with Python support (Debian/Ubuntu's gdb package is)")
            raise CollectorError(f"gdb failed on PID {target.pid}: {first[:300]}")
        result = json.loads(line[len(_MARK):])
        if not result.get("attached"):
            message = str(result.get("error", ""))
            if "not permitted" in message.lower() or "permission" in message.lower():
                raise CollectorError(not_permitted(target.pid))
            if "no such process" in message.lower():
                raise CollectorError(f"PID {target.pid} exited")
            raise CollectorError(f"gdb could not attach to PID {target.pid}: {message[:300]}")
        if result.get("registers_not_put_back"):
            raise CollectorError(f"injecting into PID {target.pid} failed and its registers could not all be put back"
                                 f" ({str(result.get('error'))[:300]}): the process may fail; check it")  # fmt: skip
        if result.get("error") or not result.get("queued"):
            raise CollectorError(f"injecting into PID {target.pid} failed: {str(result.get('error'))[:300]}; the process"
                                 " was detached unchanged")  # fmt: skip
        return Injection(self.name, float(result["held_ms"]), int(result["thread"]), bool(result["in_syscall"]),
                         int(result["threads"]), bool(result.get("calls_by_hand")))  # fmt: skip
