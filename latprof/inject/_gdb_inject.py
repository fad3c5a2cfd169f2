"""Run by gdb's own Python (`gdb -nx --batch -x THIS`), not by latprof: the steps while the target is stopped.

Reads its orders from the environment variable LATPROF_GDB_ORDERS (JSON: pid, addresses, the
code as hex) and prints one line `LATPROF-GDB {json}` with what happened. The target is
stopped from `attach` to `detach`; in between, two calls and one write:

1. `mmap` a private page for the code (a system call: no allocator lock that the stopped
   thread might hold is taken, unlike `malloc`);
2. write the code (a NUL-terminated Python source) into it;
3. `Py_AddPendingCall(PyRun_SimpleString, page)`: the interpreter's main thread runs the code
   the next time it checks for pending calls between two bytecodes, with the GIL held - a
   safe point, never inside an allocation. The call takes the interpreter's pending-call
   lock, so it is made on a thread that cannot hold it: one stopped inside a system call,
   other than the main thread when there is one (only the main thread runs pending calls).

No symbol or debug information is read while the target is stopped: the addresses come
from latprof (read from the mapped files' dynamic symbol tables beforehand).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import gdb  # type: ignore  # gdb's embedded module (no stubs)

PROT_READ_WRITE = 3
MAP_PRIVATE_ANONYMOUS = 0x22
PAGE = 4096


def _quiet(command: str) -> None:
    try:
        gdb.execute(command, to_string=True)
    except gdb.error:
        pass


def _in_syscall(pid: int, tid: int) -> bool:
    """Whether thread `tid` is stopped inside a system call (/proc/PID/task/TID/syscall gives its number)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            first = f.read().split()[0]
    except (OSError, IndexError):
        return False
    return first.isdigit()


def _pick_thread(pid: int, threads: list[Any]) -> tuple[Any, bool]:
    """The thread to make the calls on (see the module's notes), and whether it is in a system call."""
    main = [t for t in threads if t.ptid[1] == pid]
    others = [t for t in threads if t.ptid[1] != pid]
    for thread in others:
        if _in_syscall(pid, thread.ptid[1]):
            return thread, True
    for thread in main:
        return thread, _in_syscall(pid, thread.ptid[1])
    return threads[0], _in_syscall(pid, threads[0].ptid[1])


def main() -> None:
    orders = json.loads(os.environ["LATPROF_GDB_ORDERS"])
    pid = orders["pid"]
    code = bytes.fromhex(orders["code"]) + b"\0"
    address = orders["addresses"]
    result: dict[str, Any] = {"attached": False}
    for command in ("set confirm off", "set pagination off", "set auto-load off", "set auto-solib-add off",
                    "set debug-file-directory /nonexistent", "set libthread-db-search-path /nonexistent",
                    "set debuginfod enabled off", "set unwindonsignal on", "set print thread-events off"):
        _quiet(command)
    started = time.monotonic()
    try:
        gdb.execute(f"attach {pid}", to_string=True)
        result["attached"] = True
        inferior = gdb.selected_inferior()
        threads = list(inferior.threads())
        thread, in_syscall = _pick_thread(pid, threads)
        thread.switch()
        result.update(threads=len(threads), thread=thread.ptid[1], main_thread=thread.ptid[1] == pid, in_syscall=in_syscall)
        size = (len(code) + PAGE - 1) // PAGE * PAGE
        page = int(gdb.parse_and_eval(
            f"(long)((void*(*)(void*,unsigned long,int,int,int,long))0x{address['mmap']:x})"
            f"(0, {size}, {PROT_READ_WRITE}, {MAP_PRIVATE_ANONYMOUS}, -1, 0)"))  # fmt: skip
        if page == -1 or page == 0:
            raise RuntimeError("mmap in the target failed")
        result["page"] = page
        inferior.write_memory(page, code)
        queued = int(gdb.parse_and_eval(
            f"((int(*)(void*,void*))0x{address['Py_AddPendingCall']:x})"
            f"((void*)0x{address['PyRun_SimpleString']:x}, (void*){page})"))  # fmt: skip
        result["queued"] = queued == 0
        if queued != 0:
            result["error"] = "Py_AddPendingCall refused the call (its queue is full)"
    except Exception as exc:  # reported to latprof; the target is detached below in any case
        result["error"] = f"{type(exc).__name__}: {exc}".strip()
    finally:
        if result["attached"]:
            try:
                gdb.execute("detach", to_string=True)
            except gdb.error as exc:
                result["detach_error"] = str(exc)
        result["held_ms"] = round((time.monotonic() - started) * 1000, 3)
        print("LATPROF-GDB " + json.dumps(result), flush=True)


main()
