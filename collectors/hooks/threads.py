"""Work a request hands to other threads stays the request's: `ThreadPoolExecutor` tasks and threads it starts.

A new thread starts with an empty context, so without this hook a query, a pool wait or an
HTTP call a request runs in a thread pool (a fan-out of lookups, `loop.run_in_executor`, a
tool called in parallel) belongs to no request: its time shows up as the request waiting on
a future, with no layer. With it:

- **`ThreadPoolExecutor.submit`** (and so `executor.map` and `loop.run_in_executor`) inside a
  request: the task runs as part of the request — the hooks' request and the segment open at
  `submit` are set in the worker thread for the task and reset after it (the worker's own
  context is otherwise left alone: the task does not see the caller's other context
  variables, as it would not without the hook). A task that waited `MIN_WAIT_NS` (1 ms) or
  more between `submit` and starting, because every worker of the pool was busy, gets a
  `queue` segment "thread pool wait" with `latprof.queue.source` = "executor", the pool's
  `latprof.thread_pool.name` (its thread name prefix) and `latprof.thread_pool.max_workers`.
  Worker threads a `submit` starts never carry the request (they outlive it).
- **`threading.Thread`** started inside a request: its `run` is part of the request, as
  OpenTelemetry's threading instrumentation does it (`start` notes the request, `Thread.run`
  sets it for the thread). A subclass that overrides `run` without calling `Thread.run`
  is not followed.

Segments recorded in those threads are ordinary segments of the request, children of the
segment that was open where the work was handed over; the analysis treats them like tasks of
an `asyncio.gather`: overlapping children of the request. A thread that outlives its request
records into it still; the analysis clips what lies past the request's end.

Outside a request each patched call costs a context-variable read. Every error of the hook
is counted, never raised into the service; `uninstall()` restores the originals.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from latprof.collectors.hooks import _scaffold, runtime
from latprof.layers import QUEUE
from latprof.semconv import QUEUE_SOURCE, THREAD_POOL_MAX_WORKERS, THREAD_POOL_NAME

HOOK = "threads"

#: A task that waited this long or longer for a worker of its pool gets a `queue` segment.
MIN_WAIT_NS = 1_000_000
#: The name of that segment.
EXECUTOR_WAIT = "thread pool wait"

_now = time.time_ns
_request_var = runtime._request
_parent_var = runtime._parent
_CARRIED = "_latprof_carried"  # on a Thread started inside a request: (request, parent)

def _patch_threading(module: Any) -> None:
    scaffold.wrap(module.Thread, "start", _make_start)
    scaffold.wrap(module.Thread, "run", _make_run)


def _patch_executor(module: Any) -> None:
    scaffold.wrap(module.ThreadPoolExecutor, "submit", _make_submit)  # once: a wrapped one is left alone


_T = _scaffold.Target
#: What the hook patches: `threading.Thread` now, `ThreadPoolExecutor` when it is imported.
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("threading", [_T("threading", "Thread", "start"), _T("threading", "Thread", "run")], _patch_threading),
    _scaffold.Library("concurrent.futures.thread", [_T("concurrent.futures.thread", "ThreadPoolExecutor", "submit")],
                      _patch_executor),
])  # fmt: skip
#: Patch `threading.Thread` now and `ThreadPoolExecutor` when it is imported; idempotent.
install = scaffold.install
#: Restore the originals (tests); work already handed over still finishes as it began.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: "work a recorded request hands to a ThreadPoolExecutor (pools made before the injection included) or to a"
        " thread it starts is followed from the injection on; threads and tasks already running are not"
    )


# --- ThreadPoolExecutor --------------------------------------------------------------------------


def _make_submit(original: Callable[..., Any]) -> Callable[..., Any]:
    def submit(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        state = _request_var.get()
        if state is None or runtime._writer is None:
            return original(self, fn, *args, **kwargs)
        try:
            task = _Task(fn, state, _parent_var.get(), self)
            runtime.saw(HOOK)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            return original(self, fn, *args, **kwargs)
        token = _request_var.set(None)  # a worker thread this submit starts must not carry the request
        try:
            return original(self, task, *args, **kwargs)
        finally:
            _request_var.reset(token)

    return submit


class _Task:
    """A callable handed to a pool inside a request: runs `fn` as part of the request."""

    __slots__ = ("fn", "state", "parent", "submitted_ns", "executor")

    def __init__(self, fn: Any, state: runtime.RequestState, parent: str | None, executor: Any) -> None:
        self.fn = fn
        self.state = state
        self.parent = parent
        self.executor = executor
        self.submitted_ns = _now()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = _now()
        try:
            request_token = _request_var.set(self.state)
            parent_token = _parent_var.set(self.parent)
        except Exception as exc:  # pragma: no cover - setting a context variable does not fail
            runtime.count_error(HOOK, exc)
            return self.fn(*args, **kwargs)
        try:
            if started - self.submitted_ns >= MIN_WAIT_NS:
                self._waited(started)
            return self.fn(*args, **kwargs)
        finally:
            _parent_var.reset(parent_token)
            _request_var.reset(request_token)

    def _waited(self, started: int) -> None:
        try:
            executor = self.executor
            attrs: dict[str, Any] = {QUEUE_SOURCE: "executor"}
            name = getattr(executor, "_thread_name_prefix", None)
            if name:
                attrs[THREAD_POOL_NAME] = name
            workers = getattr(executor, "_max_workers", None)
            if isinstance(workers, int):
                attrs[THREAD_POOL_MAX_WORKERS] = workers
            runtime.record(EXECUTOR_WAIT, QUEUE, self.submitted_ns, started, attrs,
                           parent_id=self.parent if self.parent is not None else runtime.ROOT,
                           state=self.state, copy_attrs=False)
        except Exception as exc:
            runtime.count_error(HOOK, exc)

    def __repr__(self) -> str:  # what a pool's error messages show: the task, not the wrapper
        return repr(self.fn)


# --- threading.Thread ----------------------------------------------------------------------------


def _make_start(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def start(self: Any) -> None:
        state = _request_var.get()
        if state is not None and runtime._writer is not None:
            try:
                if type(self).run is threading.Thread.run:  # else our `run` never runs: carry nothing
                    setattr(self, _CARRIED, (state, _parent_var.get()))
                    runtime.saw(HOOK)
            except Exception as exc:
                runtime.count_error(HOOK, exc)
        return original(self)

    return start


def _make_run(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def run(self: Any) -> None:
        carried = getattr(self, _CARRIED, None)
        if carried is None:
            return original(self)
        try:
            delattr(self, _CARRIED)
            request_token = _request_var.set(carried[0])
            parent_token = _parent_var.set(carried[1])
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            return original(self)
        try:
            return original(self)
        finally:
            _parent_var.reset(parent_token)
            _request_var.reset(request_token)

    return run
