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
   When no thread stands in a system call at the attach (a main thread between two sleeps),
   gdb detaches and attaches again a few milliseconds later (`ATTACH_ATTEMPTS`).

No symbol or debug information is read while the target is stopped: the addresses come
from latprof (read from the mapped files' dynamic symbol tables beforehand).

**Calls by hand.** gdb's own calls put every register back afterwards, the vector registers
through the x86 extended state (PTRACE_SETREGSET NT_X86_XSTATE). Linux takes only the whole
XSAVE area there, and gdb before 14 sends a smaller one on a CPU with AMX tiles (Sapphire Rapids
and later): every call then fails as it puts the registers back ("Couldn't write extended state
status: Bad address") - Debian 12's gdb 13 on such a host. `_can_write_vector_registers`
finds out first (one vector register changed and put back), and where gdb cannot, each call is
made by hand with the general-purpose registers alone (`_call_by_hand`): saved, the arguments and
a return address set (the program's entry point, from /proc/PID/auxv, with a temporary
breakpoint on it), run to that breakpoint with the other threads held (scheduler-locking: a stop
is that thread's own; a signal it gets meanwhile is handed on), the registers put back, `orig_rax`
last so that the interrupted system call restarts as it would have. They are made on the main
thread when it is inside a system call (where it holds no pending-call lock either: the lock is
held only between two bytecodes' checks, never across a system call). Each register is written in
the thread's innermost frame (`_set_register`): gdb writes a register of the *selected* frame, and
after a write it may select an outer one, where writing `$pc` rewrites a return address on the
stack and `$rsp` cannot be written at all - on Debian's python3.11 (no unwind information for
`_start`) that sent threads into their stack and left a uvicorn half put back, which crashed. Should
a register still not go back, latprof says so rather than "detached unchanged". The vector
registers are left as they are:
neither mmap's wrapper nor Py_AddPendingCall uses them (and across the system call the stopped
thread is in, the C ABI keeps none live).
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
#: A thread stopped outside a system call may hold the pending-call lock (and live vector registers):
#: the process is let go and stopped again, a little later each time, up to this many times, before
#: the calls are made where it stands (a main thread that never enters a system call).
ATTACH_ATTEMPTS = 6
ATTACH_RETRY_S = 0.003


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


def _pick_thread(pid: int, threads: list[Any], main_first: bool = False) -> tuple[Any, bool]:
    """The thread to make the calls on (see the module's notes), and whether it is in a system call.
    `main_first`: the main thread when it is inside a system call (calls by hand)."""
    main = [t for t in threads if t.ptid[1] == pid]
    others = [t for t in threads if t.ptid[1] != pid]
    if main_first:
        for thread in main:
            if _in_syscall(pid, thread.ptid[1]):
                return thread, True
    for thread in others:
        if _in_syscall(pid, thread.ptid[1]):
            return thread, True
    for thread in main:
        return thread, _in_syscall(pid, thread.ptid[1])
    return threads[0], _in_syscall(pid, threads[0].ptid[1])


#: The general-purpose registers a call by hand changes and puts back (one PTRACE_SETREGS each).
_GPRS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15",
         "eflags")  # fmt: skip
_ARGUMENT_REGISTERS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
#: /proc/PID/auxv's entry for the program's entry point (AT_ENTRY), where a call by hand returns to.
_AT_ENTRY = 9
#: Below the stopped thread's stack pointer, past the red zone (128 bytes) with room to spare.
_STACK_GAP = 1024


def _entry_point(pid: int) -> int:
    """The program's entry point in the target (AT_ENTRY of its auxiliary vector)."""
    with open(f"/proc/{pid}/auxv", "rb") as f:
        data = f.read()
    for offset in range(0, len(data) - 15, 16):
        key = int.from_bytes(data[offset : offset + 8], "little")
        if key == _AT_ENTRY:
            return int.from_bytes(data[offset + 8 : offset + 16], "little")
        if key == 0:
            break
    raise RuntimeError(f"no entry point in /proc/{pid}/auxv")


def _can_write_vector_registers() -> bool:
    """Whether gdb can write the selected thread's vector registers (see the module's notes): one
    changed and put back. False when gdb cannot (nothing was changed then)."""
    try:
        value = int(gdb.parse_and_eval("$xmm15.v4_int32[0]"))
        gdb.execute(f"set var $xmm15.v4_int32[0] = {value ^ 1}", to_string=True)
    except gdb.error:
        return False
    gdb.execute(f"set var $xmm15.v4_int32[0] = {value}", to_string=True)
    return True


def _register(name: str) -> int:
    """The selected thread's register `name` as a Python int (pointers and flags included)."""
    return int(gdb.parse_and_eval(f"${name}"))


def _set_register(name: str, value: int) -> None:
    """Set the selected thread's register `name` in its innermost frame. gdb writes a register of the
    selected frame, and re-selects a frame after each write by the frame's identity: once `$pc` and
    `$rbp` are back in a function without unwind information, that can be an outer frame (seen: level
    51, at `_start`), whose `$rsp` is computed and cannot be assigned ("Attempt to assign to an
    unmodifiable value") - the thread was then left half put back and crashed. So frame 0 is selected
    before every write."""
    gdb.newest_frame().select()
    gdb.execute(f"set var ${name} = {value}", to_string=True)


#: Signals that mean a call by hand went wrong (or latprof's timeout interrupted it): it is abandoned.
_FATAL_STOPS = frozenset({"SIGINT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGTRAP"})
#: Other signals the thread may get while it runs the call are delivered and the call goes on, this many times at most.
_MAX_RESUMES = 20


class _Stops:
    """The last stop gdb reported (a breakpoint, a signal): what ended a `continue`."""

    def __init__(self) -> None:
        self.last: Any = None
        gdb.events.stop.connect(self._record)

    def _record(self, event: Any) -> None:
        self.last = event


def _call_by_hand(inferior: Any, thread: Any, stops: _Stops, entry: int, function: int, *args: int) -> int:
    """`function(*args)` on `thread` with the general-purpose registers alone (module's notes); its
    return value (rax). Only that thread runs meanwhile (scheduler-locking): a stop is its own. The
    registers are put back whatever happens, on that thread."""
    thread.switch()
    saved = {name: _register(name) for name in _GPRS}
    pc = _register("pc")
    try:
        orig_rax: int | None = _register("orig_rax")
    except gdb.error:
        orig_rax = None
    # as after a `call`: 16-byte aligned before the return address is pushed
    sp = ((saved["rsp"] - _STACK_GAP) & ~0xF) - 8
    try:
        inferior.write_memory(sp, entry.to_bytes(8, "little"))
        for name, value in zip(_ARGUMENT_REGISTERS, args):
            _set_register(name, value)
        _set_register("rax", 0)  # no vector arguments (for a variadic callee)
        _set_register("rsp", sp)
        _set_register("pc", function)  # also sets orig_rax to -1: no restart into the call
        gdb.execute(f"tbreak *{entry}", to_string=True)
        for _ in range(_MAX_RESUMES):
            stops.last = None
            gdb.execute("continue", to_string=True)
            thread.switch()
            event = stops.last
            signal = getattr(event, "stop_signal", None)
            if signal is None or signal in _FATAL_STOPS:
                break
            # a signal for the process, delivered to the one thread running: `continue` hands it on
        stopped = _register("pc")
        if stopped != entry or not isinstance(stops.last, gdb.BreakpointEvent):
            raise RuntimeError(f"the call to 0x{function:x} stopped at 0x{stopped:x} ({getattr(stops.last, 'stop_signal', '')}),"
                               " not at its return")  # fmt: skip
        return _register("rax")
    finally:
        thread.switch()
        _put_back(dict(pc=pc, **saved, **({} if orig_rax is None else {"orig_rax": orig_rax})))


class RegistersNotPutBack(RuntimeError):
    """A call by hand could not put every register back: the thread may fail when it runs again."""


def _put_back(registers: dict[str, int]) -> None:
    """Set each of `registers` in order (`_set_register`), every one tried even when one fails;
    `RegistersNotPutBack` naming those that failed."""
    failed = []
    for name, value in registers.items():
        try:
            _set_register(name, value)
        except gdb.error as exc:
            failed.append(f"${name} ({exc})")
    if failed:
        raise RegistersNotPutBack(f"could not put back {', '.join(failed)}")


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
    held_before = 0.0  # the stops of earlier attempts, which found no thread in a system call
    try:
        by_hand: bool | None = None
        for attempt in range(1, ATTACH_ATTEMPTS + 1):
            started = time.monotonic()
            gdb.execute(f"attach {pid}", to_string=True)
            result["attached"] = True
            inferior = gdb.selected_inferior()
            threads = list(inferior.threads())
            thread, in_syscall = _pick_thread(pid, threads)
            thread.switch()
            if by_hand is None:
                by_hand = bool(orders.get("by_hand")) or not _can_write_vector_registers()
            if by_hand:
                thread, in_syscall = _pick_thread(pid, threads, main_first=True)
                thread.switch()
            if in_syscall or attempt == ATTACH_ATTEMPTS:
                break
            gdb.execute("detach", to_string=True)
            result["attached"] = False
            held_before += time.monotonic() - started
            time.sleep(ATTACH_RETRY_S * attempt)
        result.update(threads=len(threads), thread=thread.ptid[1], main_thread=thread.ptid[1] == pid,
                      in_syscall=in_syscall, attempts=attempt)  # fmt: skip
        size = (len(code) + PAGE - 1) // PAGE * PAGE
        result["calls_by_hand"] = by_hand
        if by_hand:
            entry = _entry_point(pid)
            stops = _Stops()
            _quiet("set scheduler-locking on")
            page = _call_by_hand(inferior, thread, stops, entry, address["mmap"],
                                 0, size, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, -1, 0)  # fmt: skip
        else:
            page = int(gdb.parse_and_eval(
                f"(long)((void*(*)(void*,unsigned long,int,int,int,long))0x{address['mmap']:x})"
                f"(0, {size}, {PROT_READ_WRITE}, {MAP_PRIVATE_ANONYMOUS}, -1, 0)"))  # fmt: skip
        if page == 0 or -4096 < page < 0:  # NULL, or -errno (MAP_FAILED is -1)
            raise RuntimeError("mmap in the target failed")
        result["page"] = page
        inferior.write_memory(page, code)
        if by_hand:
            queued = _call_by_hand(inferior, thread, stops, entry, address["Py_AddPendingCall"],
                                   address["PyRun_SimpleString"], page) & 0xFFFFFFFF  # fmt: skip
            queued = queued - (1 << 32) if queued >= 1 << 31 else queued  # an int in eax
        else:
            queued = int(gdb.parse_and_eval(
                f"((int(*)(void*,void*))0x{address['Py_AddPendingCall']:x})"
                f"((void*)0x{address['PyRun_SimpleString']:x}, (void*){page})"))  # fmt: skip
        result["queued"] = queued == 0
        if queued != 0:
            result["error"] = "Py_AddPendingCall refused the call (its queue is full)"
    except Exception as exc:  # reported to latprof; the target is detached below in any case
        result["error"] = f"{type(exc).__name__}: {exc}".strip()
        result["registers_not_put_back"] = isinstance(exc, RegistersNotPutBack)
    finally:
        if result["attached"]:
            try:
                gdb.execute("detach", to_string=True)
            except gdb.error as exc:
                result["detach_error"] = str(exc)
        result["held_ms"] = round((held_before + time.monotonic() - started) * 1000, 3)
        print("LATPROF-GDB " + json.dumps(result), flush=True)


main()
