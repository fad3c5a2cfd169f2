"""What a sampled thread is doing, from its Python stack (and its kernel wait channel): a layer, or idle.

`latprof attach` samples a running service from outside (py-spy). A sample is a thread's
frames, innermost first, each a function name and a file (`short_filename`: relative to
site-packages or the standard library), plus the thread's wait channel from
`/proc/PID/task/TID/wchan` when it was read. `classify` turns one sample into a
`Classification`: the layer that owns the moment, or that the thread was idle (a worker
waiting for its next request: not a layer, reported as `collection.idle_share`).

**Signatures** (`SIGNATURES`, a documented table; `extra` adds more) match a frame on its
file's suffix and its function name — never line numbers. Python 3.11+ reports qualified
names (`QueuePool._do_get`), 3.10 bare ones (`_do_get`); a signature's name is matched against
the frame's name and its last dotted part, so one entry serves both. Scanning from the innermost
frame outwards, the first frame a signature matches decides, with report-v1's precedence rule (docs/layers.md):
a *generic* wait (a `Condition.wait`, a `Queue.get`, a future's result) inside a *specific*
frame further out (a pool's checkout) is absorbed by it, so the scan goes on past generic
matches and takes the first specific one; only when none is found does the generic one decide.

Blocking C calls leave no Python frame of their own (`time.sleep`, `lock.acquire()`, a
psycopg2 execute, `socket.recv`): the innermost frame is their caller's. When no signature
matches, the wait channel tells them apart: a futex wait is `lock` — unless it is a wait for the
GIL (timed, while another thread of the process runs: `GIL_MARK`), which is `app`: threads
waiting for the GIL wait for the CPU, no lock the service could fix is involved — a timed sleep
stays unattributed (`sleep`), a socket wait is unattributed (`socket`); a thread running Python
(wait channel `0`, or py-spy's `active`) is `app`.

An LLM call seen in a stack is `provider` with `split_unknown`: from stacks, the time to the
first token and the decode cannot be told apart (report-v1, attach mode). An HTTP read counts
as an LLM call only when an openai frame is on the stack (openai 2.x runs on httpcore, 3.x on
httpcore2); any other HTTP read is `tool`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from latprof.events import Frame as EventFrame, StackSample
from latprof.layers import APP, DB_POOL, DB_QUERY, HTTP_POOL, LOCK, PROVIDER, RETRY, TOOL

#: `Classification.state` of a thread waiting for work (not a layer).
IDLE = "idle"
#: `Classification.state` of a thread working on something (its `layer` says what, when known).
BUSY = "busy"


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a sample: its function's name (qualified on 3.11+) and its short file name."""

    name: str
    file: str


@dataclass(frozen=True, slots=True)
class Signature:
    """A frame that says what the thread is doing.

    `file` is a path suffix (`sqlalchemy/pool/impl.py`), `name` a function name, qualified or
    bare (matched on the last dotted part when the frame's name is bare, and vice versa).
    `layer` None with `idle` True: the thread waits for work. `generic`: a wait that a specific
    frame further out absorbs. `requires`: a file prefix that must be on the stack too (openai
    for LLM reads).
    """

    id: str
    file: str
    name: str
    layer: str | None
    idle: bool = False
    generic: bool = False
    requires: str | None = None
    note: str = ""

    def matches(self, frame: Frame) -> bool:
        file = frame.file
        if not (file == self.file or file.endswith("/" + self.file)):
            return False
        if frame.name == self.name:
            return True
        return _tail(frame.name) == _tail(self.name) and ("." not in frame.name or "." not in self.name)


def _tail(name: str) -> str:
    return name.rsplit(".", 1)[-1]


@dataclass(frozen=True, slots=True)
class Classification:
    """What one sample says: `state` busy or idle; `layer` when busy and known (None: unattributed)."""

    state: str
    layer: str | None
    signature: str
    split_unknown: bool = False
    wchan: str | None = None  # the wait channel that decided, when one did


def _sig(id: str, file: str, name: str, layer: str | None, **kw: Any) -> Signature:
    return Signature(id, file, name, layer, **kw)


#: The built-in signatures, verified against the real libraries (docs/attach.md "Stack signatures"; tests/collectors/attach/test_signatures.py).
SIGNATURES: tuple[Signature, ...] = (
    # -- pools: waiting for a connection (db.pool) -----------------------------------------------
    _sig("sqlalchemy.pool_wait", "sqlalchemy/pool/impl.py", "QueuePool._do_get", DB_POOL,
         note="QueuePool checkout: Queue.get -> Condition.wait inside"),
    _sig("psycopg_pool.wait", "psycopg_pool/pool.py", "WaitingClient.wait", DB_POOL),
    _sig("psycopg_pool.getconn", "psycopg_pool/pool.py", "ConnectionPool.getconn", DB_POOL),
    _sig("redis.pool_wait", "redis/connection.py", "BlockingConnectionPool.get_connection", DB_POOL),
    # -- statements in flight (db.query) ----------------------------------------------------------
    _sig("psycopg.wait", "psycopg/connection.py", "Connection.wait", DB_QUERY,
         note="every psycopg 3 I/O waits here (execute, fetch, commit)"),
    _sig("sqlalchemy.do_execute", "sqlalchemy/engine/default.py", "DefaultDialect.do_execute", DB_QUERY,
         note="innermost under psycopg2, which has no Python frame of its own"),
    _sig("sqlalchemy.do_executemany", "sqlalchemy/engine/default.py", "DefaultDialect.do_executemany", DB_QUERY),
    _sig("sqlalchemy.do_execute_no_params", "sqlalchemy/engine/default.py", "DefaultDialect.do_execute_no_params", DB_QUERY),
    _sig("redis.read", "redis/_parsers/socket.py", "SocketBuffer._read_from_socket", DB_QUERY),
    _sig("redis.read_response", "redis/connection.py", "AbstractConnection.read_response", DB_QUERY),
    # -- outbound HTTP: the pool, then the exchange (http.pool, provider, tool) -------------------
    _sig("httpcore.pool_wait", "httpcore/_sync/connection_pool.py", "PoolRequest.wait_for_connection", HTTP_POOL),
    _sig("httpcore2.pool_wait", "httpcore2/_sync/connection_pool.py", "PoolRequest.wait_for_connection", HTTP_POOL),
    _sig("openai.retry_sleep", "openai/_base_client.py", "SyncAPIClient._sleep_for_retry", RETRY),
    _sig("openai.stream", "openai/_streaming.py", "Stream.__iter__", PROVIDER, requires="openai/"),
    _sig("openai.request", "openai/_base_client.py", "SyncAPIClient.request", PROVIDER, requires="openai/"),
    _sig("httpcore.exchange", "httpcore/_sync/http11.py", "HTTP11Connection.handle_request", TOOL),
    _sig("httpcore2.exchange", "httpcore2/_sync/http11.py", "HTTP11Connection.handle_request", TOOL),
    _sig("httpcore.body", "httpcore/_sync/http11.py", "HTTP11Connection._receive_response_body", TOOL),
    _sig("httpcore2.body", "httpcore2/_sync/http11.py", "HTTP11Connection._receive_response_body", TOOL),
    # -- retry libraries' backoff (retry) ----------------------------------------------------------
    _sig("tenacity.sleep", "tenacity/nap.py", "sleep", RETRY),
    _sig("backoff.retry", "backoff/_sync.py", "retry_exception.<locals>.retry", RETRY,
         note="no sleep frame: the wait channel is a timed sleep"),
    _sig("backoff.retry_predicate", "backoff/_sync.py", "retry_predicate.<locals>.retry", RETRY),
    # -- generic waits: absorbed by a specific frame further out ----------------------------------
    _sig("threading.condition_wait", "threading.py", "Condition.wait", LOCK, generic=True),
    _sig("threading.semaphore", "threading.py", "Semaphore.acquire", LOCK, generic=True),
    _sig("queue.get", "queue.py", "Queue.get", LOCK, generic=True),
    _sig("future.result", "concurrent/futures/_base.py", "Future.result", None, generic=True,
         note="waiting for work handed to another thread: that thread's sample says what it does"),
    _sig("future.wait", "concurrent/futures/_base.py", "wait", None, generic=True),
    # -- workers waiting for the next request (idle, not a layer) ---------------------------------
    _sig("gunicorn.sync_idle", "gunicorn/workers/sync.py", "SyncWorker.wait", None, idle=True),
    _sig("gunicorn.gthread_idle", "gunicorn/workers/gthread.py", "ThreadWorker.wait_for_and_dispatch_events", None, idle=True),
    _sig("gunicorn.master", "gunicorn/arbiter.py", "Arbiter.wait_for_signals", None, idle=True),
    _sig("gunicorn.master_sleep", "gunicorn/arbiter.py", "Arbiter.sleep", None, idle=True),
    _sig("gunicorn.control_socket", "gunicorn/ctl/server.py", "ControlSocketServer._run_loop", None, idle=True),
    _sig("executor.idle", "concurrent/futures/thread.py", "_worker", None, idle=True,
         note="innermost only: a busy worker has _WorkItem.run above it"),
    _sig("anyio.worker_idle", "anyio/_backends/_asyncio.py", "WorkerThread.run", None, idle=True),
    _sig("psycopg_pool.worker", "psycopg_pool/_acompat.py", "Queue.get", None, idle=True),
    _sig("psycopg_pool.worker_loop", "psycopg_pool/pool.py", "ConnectionPool.worker", None, idle=True),
    _sig("psycopg_pool.scheduler", "psycopg_pool/sched.py", "Scheduler.run", None, idle=True),
    _sig("asyncio.select", "selectors.py", "EpollSelector.select", None, idle=True,
         note="an event loop (or a selector-based server) waiting for events"),
    _sig("latprof.writer", "latprof/capture/writer.py", "CaptureWriter._run", None, idle=True),
)

#: Signatures that decide only as the innermost frame, or with nothing but generic waits inside
#: (a worker loop's frame is under every task it runs; idle, it waits on its queue).
_INNERMOST_ONLY = frozenset({"executor.idle", "anyio.worker_idle", "asyncio.select"})

#: Kernel wait channels (`/proc/PID/task/TID/wchan`) and what a thread without a matching frame
#: waits for there.
_WCHAN_LOCK = ("futex",)
#: Appended to a futex wait channel by the sampler (`pyspy.mark_gil_waits`) when the wait was a
#: timed one while another thread of the process was running: how a thread waits for the GIL
#: (CPython's GIL is a condition variable waited on with the switch interval as timeout; a
#: blocking `threading.Lock.acquire()` waits untimed).
GIL_MARK = "+gil"
_WCHAN_SLEEP = ("hrtimer_nanosleep", "do_nanosleep", "clock_nanosleep")
_WCHAN_SOCKET = ("poll_schedule_timeout", "wait_woken", "sk_wait_data", "do_select", "do_sys_poll")
#: An epoll wait no Python frame explains is an event loop in native code waiting for events:
#: uvloop (libuv) leaves `Runner.run` innermost while idle, where the stock loop has a
#: `selectors.py` frame.
_WCHAN_EPOLL = ("do_epoll_wait", "ep_poll")

#: Frames under which a thread runs an asyncio event loop (stock or uvloop: uvloop's own loop is
#: native, so only the runner is left; 3.10 names are bare, `run`).
LOOP_FRAMES = (
    ("asyncio/base_events.py", "BaseEventLoop.run_forever"),
    ("asyncio/runners.py", "Runner.run"),
    ("asyncio/runners.py", "run"),
)


def loop_waiting(wchan: str) -> bool:
    """An event loop's thread in this wait channel waits for events (epoll): the loop is free;
    in any other (running, a sleep, a lock, a blocking socket call) something holds it."""
    return wchan.strip().startswith(_WCHAN_EPOLL)


def has_frame(frames: Iterable[Any], wanted: Iterable[tuple[str, str]]) -> bool:
    """Whether a capture stack (frames with `.filename` and `.function`) has a frame of one of
    `wanted` (file suffix, function: qualified or bare, matched on its last dotted part)."""
    wanted = tuple((suffix, _tail(name)) for suffix, name in wanted)
    for f in frames:
        for suffix, name in wanted:
            if (f.filename == suffix or f.filename.endswith("/" + suffix)) and _tail(f.function) == name:
                return True
    return False


def event_loop_thread(frames: Iterable[Any]) -> bool:
    """Whether a capture stack is an event loop's thread: whatever runs on top of it holds the loop.

    The one definition: `latprof attach`, `latprof top` and the event-loop-blocked rule use it."""
    return has_frame(frames, LOOP_FRAMES)


#: Top-level packages that are libraries, not the service (besides the standard library): what
#: tells a library's relative file name (py-spy's `short_filename`) from the service's own.
LIBRARIES = frozenset({
    "sqlalchemy", "psycopg", "psycopg2", "psycopg_pool", "asyncpg", "redis", "httpx", "httpx2", "httpcore",
    "httpcore2", "h11", "anyio", "openai", "anthropic", "gunicorn", "flask", "werkzeug", "starlette", "fastapi",
    "uvicorn", "aiohttp", "tenacity", "backoff", "urllib3", "requests", "pydantic", "jinja2", "click", "latprof",
})
#: The standard library's folder in an absolute file name (`/usr/lib/python3.12/`).
_STDLIB_PATH = re.compile(r"/lib/python\d+(?:\.\d+)?/")


def library_file(filename: str) -> bool:
    """Whether a frame's file is a library's or the standard library's, not the service's own code.

    `<frozen ...>` and `<string>` are; an absolute file name is when it is under site-packages or
    dist-packages or in the standard library's folder; a relative one (py-spy names library files
    relative to site-packages or the standard library) when its top-level package is a known
    library (`LIBRARIES`) or a standard-library module.
    """
    path = filename.replace("\\", "/")
    if path.startswith("<") or "site-packages/" in path or "dist-packages/" in path or _STDLIB_PATH.search(path):
        return True
    if path.startswith("/") or path[1:3] == ":/":
        return False
    top = path.split("/", 1)[0].removesuffix(".py")
    return top in LIBRARIES or top in sys.stdlib_module_names


def own_frame(frames: Iterable[EventFrame]) -> EventFrame | None:
    """The service's own frame: the innermost frame of a capture stack outside libraries and the
    standard library (`library_file`), or None. The one definition: `latprof attach` (hot frames)
    and the event-loop-blocked rule (where a finding points) use it."""
    return next((f for f in frames if not library_file(f.filename)), None)


def classify_sample(sample: StackSample, *, extra: Sequence[Signature] = ()) -> Classification:
    """What a capture's stack sample says: its frames by `classify`, with its wait channel and
    whether it was running (`active`: py-spy's flag, or the wait channel "0"). The one classifier
    of stack samples: what `latprof attach` writes (`latprof.attach.session.classify_window`),
    `latprof top` shows and the analysis of an attach capture reads are classified by it, alike."""
    frames = [Frame(f.function, f.filename) for f in sample.frames]
    return classify(frames, wchan=sample.wchan, active=sample.active, extra=extra)


def frames_from_pyspy(thread: Mapping[str, Any]) -> list[Frame]:
    """The frames of one thread of `py-spy dump --json`, innermost first."""
    frames = []
    for f in thread.get("frames") or ():
        name = f.get("name") or ""
        file = f.get("short_filename") or f.get("filename") or ""
        frames.append(Frame(str(name), str(file)))
    return frames


def _index(signatures: Iterable[Signature]) -> dict[str, list[Signature]]:
    """Signatures by the last part of their function name (what a frame is looked up by)."""
    index: dict[str, list[Signature]] = {}
    for sig in signatures:
        index.setdefault(_tail(sig.name), []).append(sig)
    return index


_BUILTIN_INDEX = _index(SIGNATURES)


def classify(
    frames: Sequence[Frame],
    *,
    wchan: str | None = None,
    active: bool | None = None,
    extra: Sequence[Signature] = (),
) -> Classification:
    """What the thread whose stack is `frames` (innermost first) is doing."""
    found = match(frames, extra=extra)
    return found if found is not None else by_wait_channel(wchan, active)


def classify_count(
    frames: Sequence[Frame], count: int, wchans: Mapping[str, int] | None, *, extra: Sequence[Signature] = ()
) -> list[tuple[Classification, int]]:
    """`count` samples of one stack, of a thread whose wait channels over the same time were
    `wchans` (value -> times seen): a stack a signature explains is that; the samples of any
    other stack are shared out over the wait channels in proportion (a frameless C call: a lock,
    a sleep, a socket wait, or running)."""
    found = match(frames, extra=extra)
    if found is not None:
        return [(found, count)]
    if not wchans or sum(wchans.values()) <= 0:
        return [(by_wait_channel(None, None), count)]
    shares: dict[Classification, int] = {}
    for w, n in share_out(count, wchans):
        c = by_wait_channel(w, None)
        shares[c] = shares.get(c, 0) + n
    return list(shares.items())


def share_out(count: int, wchans: Mapping[str, int]) -> list[tuple[str, int]]:
    """`count` samples shared out over the wait channels a thread was seen in (value -> times
    seen), in proportion, most seen first, what rounding leaves to the last; no empty shares."""
    total = sum(wchans.values())
    shares = []
    left = count
    ranked = sorted(wchans.items(), key=lambda kv: -kv[1])
    for i, (w, seen) in enumerate(ranked):
        n = left if i == len(ranked) - 1 else min(left, round(count * seen / total))
        left -= n
        if n:
            shares.append((w, n))
    return shares


def match(frames: Sequence[Frame], *, extra: Sequence[Signature] = ()) -> Classification | None:
    """What a signature says of `frames`, or None when none matches (the wait channel decides)."""
    index = _index((*extra, *SIGNATURES)) if extra else _BUILTIN_INDEX
    generic: Signature | None = None
    adjacent = False  # the frame just inside this one was a generic wait
    only_waits = True  # every frame inside this one was a generic wait (a worker loop waiting on its queue)
    for depth, frame in enumerate(frames):
        matched = False
        for sig in index.get(_tail(frame.name), ()):
            if not sig.matches(frame):
                continue
            if sig.id in _INNERMOST_ONLY and not only_waits:
                continue
            if sig.requires is not None and not any(in_package(f.file, sig.requires) for f in frames):
                continue
            if sig.generic:
                # the outer of two generic waits right inside each other says more (a future's
                # result around its Condition.wait); go on outwards: a specific frame absorbs it
                if generic is None or adjacent:
                    generic = sig
                matched = True
                break
            return _decided(sig, frames)
        adjacent = matched
        only_waits = only_waits and matched
    if generic is not None:
        return Classification(BUSY, generic.layer, generic.id)
    return None


def in_package(file: str, package: str) -> bool:
    """`file` (a short file name, or a full path) belongs to `package` (`openai/`)."""
    return file.startswith(package) or ("/" + package) in file


def _decided(sig: Signature, frames: Sequence[Frame]) -> Classification:
    if sig.idle:
        return Classification(IDLE, None, sig.id)
    layer = sig.layer
    if layer == TOOL and any(in_package(f.file, "openai/") for f in frames):
        layer = PROVIDER  # an HTTP exchange of an LLM call (the openai frames further out say so)
    if layer == PROVIDER:
        return Classification(BUSY, PROVIDER, sig.id, split_unknown=True)
    return Classification(BUSY, layer, sig.id)


def by_wait_channel(wchan: str | None, active: bool | None) -> Classification:
    """What a thread no signature explains does: runs its own code, or waits in a C call that
    left no frame (told apart by its wait channel, else by py-spy's `active`)."""
    w = (wchan or "").strip()
    if w == "0" or (w == "" and active is not False):
        return Classification(BUSY, APP, "running")
    if w == "":  # not running, and no wait channel to say what it waits for
        return Classification(BUSY, None, "waiting")
    if w.startswith(_WCHAN_LOCK):
        if w.endswith(GIL_MARK):  # waiting for the GIL is waiting for the CPU: the service's own Python
            return Classification(BUSY, APP, "wchan.gil", wchan=w)
        return Classification(BUSY, LOCK, "wchan.futex", wchan=w)
    if w.startswith(_WCHAN_SLEEP):
        return Classification(BUSY, None, "wchan.sleep", wchan=w)
    if w.startswith(_WCHAN_EPOLL):
        return Classification(IDLE, None, "wchan.epoll", wchan=w)
    if w.startswith(_WCHAN_SOCKET):
        return Classification(BUSY, None, "wchan.socket", wchan=w)
    return Classification(BUSY, None, "wchan.other", wchan=w)
