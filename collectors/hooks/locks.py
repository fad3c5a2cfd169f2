"""Contended lock acquires inside a request: threading Lock, RLock, Semaphore and asyncio Lock, Semaphore as `lock`.

- **threading.Lock and RLock** are C factories whose locks cannot be patched, so `install()`
  (run at interpreter start by `latprof run`) replaces the factories `threading.Lock` and
  `threading.RLock` with ones that return a thin wrapper. Its fast path is a non-blocking
  acquire of the real lock; only when that fails (the lock is held by someone else) is the
  blocking acquire timed. Locks created by the `threading` module itself (the locks inside
  `Condition`, `Event`, `Semaphore`, `Barrier`) and by latprof stay native: waiting on an
  Event, a Condition's notification or a Future is waiting for work, not contention, and
  `Condition.wait` re-acquires through the lock's own `_acquire_restore`, which is not timed.
  Locks created before `install()` (modules imported earlier) are not seen. The names `Lock`
  and `RLock` that modules imported earlier bound to the factories (`from threading import
  Lock`) are pointed at the wrappers too, so that the locks those modules create after
  install are (what matters when the hook is installed into a process already serving).
- **threading.Semaphore** (and BoundedSemaphore) and **asyncio.Lock / asyncio.Semaphore** are
  Python classes: their `acquire` is patched in place, with the same fast path (`locked()` /
  a non-blocking acquire first).
- **What is recorded.** Inside a request, a contended acquire that waited `MIN_WAIT_NS` or
  more is a `lock` segment nested under the task's innermost open segment, so a lock wait
  inside a pool checkout stays `db.pool` (the spec's precedence rule). Attributes: the kind
  of lock and where it was created (`latprof.lock.site`, `file.py:line`; asyncio locks and
  semaphores: where they were first contended). Outside a request, or when recording is off,
  the cost is the wrapper's call.
- **Cost.** Every acquire and release of a wrapped lock pays a Python call (see
  `benchmarks/bench_locks.py`); contended ones also pay for the clock and the segment.
- **Uninstall** restores the factories; locks created meanwhile stay wrapped and keep working,
  but time nothing any more.
"""

from __future__ import annotations

import _thread
import functools
import os
import sys
import threading
import time
from typing import Any, Callable

from latprof.collectors.hooks import _scaffold, runtime
from latprof.layers import LOCK
from latprof.semconv import LOCK_KIND, LOCK_SITE

HOOK = "locks"

#: Contended acquires that waited less than this get no segment.
MIN_WAIT_NS = 1_000_000
SEGMENT = "lock wait"

_time_ns = time.time_ns
_native_lock = _thread.allocate_lock
_native_rlock: Callable[..., Any] = threading.RLock
_recording = threading.local()  # the recording thread is inside a lock wait's bookkeeping
_SKIP_MODULES = ("threading", "latprof.", "importlib.")


def _creator(depth: int = 2) -> tuple[str, Any, int] | None:
    """(module name, code, line) of the code that called the factory, or None when it is to stay native."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    module = frame.f_globals.get("__name__", "")
    if module == "threading" or module.startswith(_SKIP_MODULES):
        return None
    return module, frame.f_code, frame.f_lineno


class _Factory:
    """What replaces `threading.Lock` / `threading.RLock`: a callable that is not a descriptor.

    A plain function would be: code that keeps the factory as a class attribute (werkzeug's
    `Map.lock_class = threading.Lock`) and calls `self.lock_class()` would pass `self` to it,
    as it never does with the C factories.
    """

    __slots__ = ("_native", "_wrapper", "__name__", "__qualname__", "__latprof_original__")

    def __init__(self, native: Callable[..., Any], wrapper: type, name: str) -> None:
        self._native = native
        self._wrapper = wrapper
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        lock = self._native(*args, **kwargs)
        where = _creator()
        return lock if where is None else self._wrapper(lock, where[1], where[2])

    def __repr__(self) -> str:
        return f"<latprof lock factory {self.__name__}>"


# --- the waits ---------------------------------------------------------------------------------


def _site(code: Any, line: int) -> str:
    filename = str(getattr(code, "co_filename", "?")).replace(os.sep, "/")
    parts = filename.rsplit("/", 2)
    return f"{'/'.join(parts[-2:])}:{line}"


def _note_wait(kind: str, site: str | Callable[[], str], start_ns: int, end_ns: int) -> None:
    """A contended acquire waited from `start_ns` to `end_ns`: a segment if long enough, in a request."""
    if end_ns - start_ns < MIN_WAIT_NS:
        return
    try:
        _recording.active = True
        where = site() if callable(site) else site
        runtime.record(SEGMENT, LOCK, start_ns, end_ns, {LOCK_KIND: kind, LOCK_SITE: where})
        runtime.saw(HOOK)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    finally:
        _recording.active = False


def _timing() -> bool:
    """Whether a contended acquire now is worth timing: hook installed, in a request, not inside our own bookkeeping."""
    return scaffold.installed and runtime.current_request() is not None and not getattr(_recording, "active", False)


class _TimedLock:
    """A `threading.Lock` whose contended acquires inside a request are `lock` segments."""

    __slots__ = ("_lock", "_code", "_line", "__weakref__")
    _kind = "threading.Lock"

    def __init__(self, lock: Any, code: Any, line: int) -> None:
        self._lock = lock
        self._code = code
        self._line = line

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        lock = self._lock
        if lock.acquire(False):
            return True
        if not blocking:
            return False
        if not _timing():
            return bool(lock.acquire(True, timeout))
        start = _time_ns()
        try:
            return bool(lock.acquire(True, timeout))
        finally:
            _note_wait(self._kind, functools.partial(_site, self._code, self._line), start, _time_ns())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return bool(self._lock.locked())

    # What `Condition` uses when the lock offers it: its wait re-acquires the lock after the
    # notification through `_acquire_restore`, which is waiting for work, so not timed.
    def _release_save(self) -> Any:
        self._lock.release()
        return None

    def _acquire_restore(self, state: Any) -> None:
        self._lock.acquire()

    def _is_owned(self) -> bool:
        if self._lock.acquire(False):
            self._lock.release()
            return False
        return True

    def _at_fork_reinit(self) -> None:
        self._lock._at_fork_reinit()

    acquire_lock = acquire  # the old names of `_thread.lock`
    release_lock = release
    locked_lock = locked

    def __repr__(self) -> str:
        return repr(self._lock)


class _TimedRLock(_TimedLock):
    """A `threading.RLock` likewise; re-entry by its owner is the fast path. What `Condition` uses is delegated."""

    __slots__ = ()
    _kind = "threading.RLock"

    def _is_owned(self) -> bool:
        return bool(self._lock._is_owned())

    def _release_save(self) -> Any:
        return self._lock._release_save()

    def _acquire_restore(self, state: Any) -> None:  # Condition.wait: waiting for work, not contention
        self._lock._acquire_restore(state)

    def _recursion_count(self) -> int:
        return int(self._lock._recursion_count())

    def locked(self) -> bool:  # RLock has no locked() before 3.14
        inner = getattr(self._lock, "locked", None)
        if inner is not None:
            return bool(inner())
        if self._lock.acquire(False):
            self._lock.release()
            return False
        return True


# --- threading.Semaphore -------------------------------------------------------------------------


def _patch_acquire(cls: type, kind: str, make: Callable[[Any, str], Any]) -> None:
    original = cls.__dict__["acquire"]
    patched = make(original, kind)
    functools.update_wrapper(patched, original)
    if scaffold.replace(cls, "acquire", patched) and cls.__dict__.get("__enter__") is original:
        scaffold.replace(cls, "__enter__", patched)


def _threading_semaphore_acquire(original: Callable[..., Any], kind: str) -> Callable[..., Any]:
    def acquire(self: Any, blocking: bool = True, timeout: float | None = None) -> Any:
        if not blocking or not _timing():
            return original(self, blocking, timeout)
        if original(self, False):
            return True
        start = _time_ns()
        try:
            return original(self, True, timeout)
        finally:
            _note_wait(kind, _caller_site, start, _time_ns())

    return acquire


def _caller_site() -> str:
    """Where the contended acquire was called from (asyncio locks and semaphores record this)."""
    frame: Any = sys._getframe(1)
    while frame is not None and (
        frame.f_globals.get("__name__", "") in ("threading", __name__, "asyncio.locks", "functools", "contextlib")
    ):
        frame = frame.f_back
    return _site(frame.f_code, frame.f_lineno) if frame is not None else "?"


# --- asyncio ---------------------------------------------------------------------------------------


def _patch_asyncio(module: Any) -> None:
    for cls, kind in ((module.Lock, "asyncio.Lock"), (module.Semaphore, "asyncio.Semaphore")):
        _patch_acquire(cls, kind, _asyncio_acquire)


def _asyncio_acquire(original: Callable[..., Any], kind: str) -> Callable[..., Any]:
    def acquire(self: Any) -> Any:
        # Not a coroutine function: the uncontended path hands back the original coroutine
        # and costs one check; `await lock.acquire()` and `async with` work the same.
        if not self.locked() or not _timing():
            return original(self)
        return _timed_acquire(original(self), kind, sys._getframe(1))

    return acquire


async def _timed_acquire(acquiring: Any, kind: str, caller: Any) -> Any:
    start = _time_ns()
    try:
        return await acquiring
    finally:
        end = _time_ns()
        if end - start >= MIN_WAIT_NS:
            frame = caller
            while frame is not None and frame.f_globals.get("__name__", "") == "asyncio.locks":
                frame = frame.f_back  # `async with lock` calls acquire from __aenter__
            _note_wait(kind, _site(frame.f_code, frame.f_lineno) if frame is not None else "?", start, end)


# --- install ---------------------------------------------------------------------------------------


def _patch_threading(module: Any) -> None:
    factories = {"Lock": _Factory(_native_lock, _TimedLock, "Lock"), "RLock": _Factory(_native_rlock, _TimedRLock, "RLock")}
    natives = {name: vars(module)[name] for name in factories}
    for name, factory in factories.items():
        scaffold.replace(module, name, factory)
    _patch_acquire(module.Semaphore, "threading.Semaphore", _threading_semaphore_acquire)
    # `from threading import Lock` in modules imported before install (the skipped modules' locks stay native)
    scaffold.replace_aliases({name: (natives[name], factories[name]) for name in factories},
                             skip=("threading", "_thread", "importlib"))


_T = _scaffold.Target
#: What the hook patches: the lock factories and the semaphore now, asyncio's locks when imported.
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("threading", [
        _T("threading", "", "Lock"), _T("threading", "", "RLock"), _T("threading", "Semaphore", "acquire", False),
    ], _patch_threading),
    _scaffold.Library("asyncio.locks", [
        _T("asyncio.locks", "Lock", "acquire", True), _T("asyncio.locks", "Semaphore", "acquire", True),
    ], _patch_asyncio),
])  # fmt: skip
#: Replace the lock factories and patch the semaphores and asyncio locks; idempotent.
install = scaffold.install
#: Restore the factories and methods (tests). Locks created meanwhile stay wrapped, keep working, and time nothing.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: "threading locks created before the injection are not timed, only those created after it;"
        " threading semaphores and asyncio locks and semaphores are, whenever they were created"
    )
