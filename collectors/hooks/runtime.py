"""What every in-process hook shares: the capture writer, the current request, ids, error counting.

Hooks run inside someone else's service. Everything here is cheap, never raises into the
caller, and is a no-op until `start()` was called (by `latprof.collectors.hooks.bootstrap` when
`latprof run` started the process), so importing a hook module has no effect of its own.

A request is opened by an inbound hook (`begin_request`) and closed with `end_request`,
which emits the request root. While it is open, `current_request()` returns its state in
every task and thread that inherited the context (anyio and asyncio copy contexts), and
`segment()` / `record()` emit segments that belong to it, nested under the innermost
open segment of the calling task.

What the hooks cost the process is written as `overhead` quality records (see "what the hooks
cost" below): the CPU of the capture writer's thread, read from its clock, plus the time
spent in the recording functions here, timed on about 1 in `COST_TIMING_STRIDE` calls.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import math
import os
import random
import sys
import threading
import time
import types
from typing import Any, Callable, Iterator, Mapping, ParamSpec, Sequence, TypeVar

from latprof import semconv
from latprof.events import NO_ATTRS, Event, Gauge, QualityRecord, Request, Segment
from latprof.semconv import LAST_ERROR, NOTE_ERROR, NOTE_OVERHEAD, OVERHEAD_SOURCE, OVERHEAD_SOURCE_HOOKS

#: Environment variables `latprof run` sets for the processes it starts.
ENV_CAPTURE = "LATPROF_CAPTURE"  # path of the capture file every process appends to
ENV_HOOKS = "LATPROF_HOOKS"  # comma-separated hook names, or "all"
ENV_MAX_RATE = "LATPROF_MAX_RATE"  # requests recorded per second per process, at most about; 0: all

#: How often a hook's swallowed errors are written as a quality record, at most.
ERROR_REPORT_INTERVAL_S = 1.0


class RequestState:
    """An open request: what its root will say when `end_request` emits it."""

    __slots__ = ("request_id", "route", "start_ns", "pid", "attrs", "cpu_ns", "status_code", "spans", "scratch")

    def __init__(
        self,
        request_id: str,
        route: str,
        start_ns: int,
        pid: int,
        attrs: dict[str, Any] | None = None,
        cpu_ns: int | None = None,
        status_code: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.route = route
        self.start_ns = start_ns
        self.pid = pid
        self.attrs: dict[str, Any] = {} if attrs is None else attrs
        self.cpu_ns = cpu_ns
        self.status_code = status_code
        #: The request's segments so far: (segment_id, parent_id, start_ns, end_ns, thread id),
        #: the first MAX_SPANS_KEPT of them; see `spans_of`.
        self.spans: list[tuple[str, str | None, int, int, int]] | None = None
        #: Per-request data of hooks, by hook name (bounded by each hook); gone with the request.
        self.scratch: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"RequestState({self.request_id!r}, {self.route!r}, start_ns={self.start_ns})"


_request: contextvars.ContextVar[RequestState | None] = contextvars.ContextVar("latprof_request", default=None)
_parent: contextvars.ContextVar[str | None] = contextvars.ContextVar("latprof_parent", default=None)

_writer: Any = None  # a CaptureWriter once started; Any keeps this module free of its import cost
#: The hooks were loaded into a running process (`latprof attach --inject`): a child it forks
#: drops them (`latprof.collectors.hooks.injected`), it is nobody's to watch.
injected = False
_pid = os.getpid()
_id_prefix = ""
_ids: Iterator[int] = itertools.count(1)
_errors: dict[str, int] = {}
_last_error: dict[str, str] = {}
_errors_reported_at: dict[str, float] = {}
# Re-entrant: a finalizer (garbage collection) may count an error while this thread holds it.
_errors_lock = threading.RLock()


_seen: set[str] = set()  # hooks that have recorded something in this process (`saw`)


def _reset_ids() -> None:
    global _pid, _id_prefix, _ids
    _pid = os.getpid()
    _id_prefix = os.urandom(4).hex()
    _ids = itertools.count(1)
    _seen.clear()  # a forked worker says for itself which hooks see its traffic


# --- what the hooks cost -----------------------------------------------------------------------
#
# Two parts, neither touching the service's threads beyond the hooks' own calls:
# - the capture writer's flush thread: its CPU clock (`time.pthread_getcpuclockid`), measured;
# - the hooks' own code on the service's threads: the recording functions (`open_request`,
#   `end_request`, `record`, `gauge`) and the stretches of hook code marked with `cost_begin` /
#   `cost_end` (the inbound hooks' per-request bookkeeping with the sampler's decision and
#   TCP_INFO, closing a request, the event-loop probe's tick, reading the loop thread's CPU clock
#   after a long step; the outbound hooks' bookkeeping before and after each call they wrap and
#   per chunk read: the openai hook's calls and stream chunks, the httpx and aiohttp_client
#   hooks' calls, pool notes and waits and body chunks, the psycopg_pool, sqlalchemy, asyncpg
#   and redis hooks' checkouts, returns and statements or commands; `stretch` makes a whole
#   function of hook code one). About 1 in COST_TIMING_STRIDE of these calls is timed with
#   `perf_counter_ns` (the gap to the next timed call drawn at random from 1 to 2 * stride - 1, so
#   no pattern of calls per request locks onto one phase), and the sum scaled by calls made /
#   calls timed. While a stretch is timed, every recording call it makes times itself and is taken
#   out of the stretch's time (so it counts once: as a call of its own, sampled like the others).
#   Wall-clock time: a timed call of `MAX_TIMED_NS` or more was not running all that time (its
#   thread was preempted, or the garbage collector ran) and is left out of the sample, which would
#   otherwise count it 16 times over. What each call costs beyond that (about 50-90 ns: the
#   counter) is not counted.
# Not measured: the wrappers' per-call frames and per-step accounting (the asyncio coroutine
# proxies, the task factory: cheaper than the timing would be), the few lines before a
# statement or command that the asyncpg and redis hooks run inline and those of an outbound
# wrapper outside its stretches (its check for an open request, an error path's unnest), what
# runs from the garbage collector (a stream dropped unread ends its call there: the collector
# may run inside another stretch, and stretches must not nest), and the cost in no code of latprof's (the
# service's own code running slower beside it: caches, more garbage collection). A sampler of
# the service threads' frames from a thread of latprof's was tried and dropped: it only gets the
# GIL where a thread releases it, which under uvloop is the loop's poll, never inside the hooks.
# `benchmarks/bench_reported_overhead.py` measures how much of the side-by-side cost this catches.

#: About 1 in this many calls of the recording functions is timed.
COST_TIMING_STRIDE = 16
#: A timed call this long is an outlier (a few microseconds is usual): not part of the sample.
MAX_TIMED_NS = 1_000_000
#: An `overhead` record is written at most this often while recording (from a timed call), and at exit.
OVERHEAD_REPORT_INTERVAL_S = 2.0

_perf_ns = time.perf_counter_ns
_calls: Iterator[int] = itertools.count()  # the recording functions' calls, numbered (next() is atomic)
_timed_at = 0  # the number of the next call to time
_timed_ns = 0  # the timed calls' total duration
_timed = 0  # how many calls were timed
_last_call = 0  # the number of the latest timed call: about how many calls were made until then
_recorded = 0  # requests whose root was emitted (`end_request`)
_cost_wall_ns = 0  # perf_counter_ns when this process's accounting began
_cost_cpu_s = 0.0  # process CPU then
_arrivals_base: tuple[int, int] = (0, 0)  # (id of the sampler, its arrivals) then
_writer_cpu_s = 0.0  # the writer threads' CPU, summed over threads that came and went
_writer_thread: tuple[int, float] | None = None  # (ident, its CPU at the last reading)
_overhead_due_ns = 0  # perf_counter_ns from which the next periodic `overhead` record is due
_region_started = 0  # perf_counter_ns when the hook code stretch being timed began (`cost_begin`; 0: none)
_region_number = 0  # its call number
_region_nested_ns = 0  # the recording calls' time inside it, taken out of its own


def _reset_cost() -> None:
    """Start this process's accounting from zero (at `start`, and in a forked child)."""
    global _calls, _timed_at, _timed_ns, _timed, _last_call, _recorded, _cost_wall_ns, _cost_cpu_s
    global _arrivals_base, _writer_cpu_s, _writer_thread, _overhead_due_ns, _region_started, _region_nested_ns
    _calls = itertools.count()
    _timed_at = int(random.random() * COST_TIMING_STRIDE)
    _timed_ns = _timed = _last_call = _recorded = 0
    _region_started = _region_nested_ns = 0
    _cost_wall_ns = _perf_ns()
    _cost_cpu_s = time.process_time()
    _arrivals_base = (id(sampler), sampler.arrivals + sampler.seen) if "sampler" in globals() else (0, 0)
    _writer_cpu_s = 0.0
    _writer_thread = None
    _overhead_due_ns = _cost_wall_ns + int(OVERHEAD_REPORT_INTERVAL_S * 1e9)


def _took(number: int, started_ns: int) -> None:
    """The timed call, the `number`th, that began at `started_ns` ended: add it, pick the next call
    to time and, when due, write the periodic `overhead` record. Not locked: threads racing here
    may lose a timing now and then, never corrupt anything."""
    global _region_started, _region_nested_ns
    now = _perf_ns()
    if _region_started:  # inside a stretch being timed: its time is taken out of the stretch's
        if now - _region_started < MAX_TIMED_NS:
            _region_nested_ns += now - started_ns
            return
        _region_started = 0  # a stretch whose end never came (an exception past it): given up
    _sample(number, now - started_ns, now - started_ns, now)


def _sample(number: int, elapsed_ns: int, own_ns: int, now: int) -> None:
    """Add the `number`th call's own time to the sample (unless it was an outlier), pick the next
    call to time and, when due, write the periodic `overhead` record."""
    global _timed_at, _timed_ns, _timed, _last_call
    if elapsed_ns < MAX_TIMED_NS and own_ns >= 0:
        _timed_ns += own_ns
        _timed += 1
        _last_call = number
    _timed_at = number + 1 + int(random.random() * (2 * COST_TIMING_STRIDE - 1))
    if now >= _overhead_due_ns:
        report_overhead()


def cost_begin() -> int:
    """Call where a stretch of a hook's own code begins on the service's thread (bookkeeping
    around the service's calls, not containing them); hand the result to `cost_end` where the
    stretch ends. Counted as one of the calls timed about 1 in `COST_TIMING_STRIDE`; the
    recording functions it calls are timed apart and taken out of its time. Stretches must not
    nest. Returns 0 when this one is not timed (then `cost_end` does nothing)."""
    global _timed_at, _region_started, _region_number, _region_nested_ns
    number = next(_calls)
    if number < _timed_at:
        return 0
    if _region_started and _perf_ns() - _region_started < MAX_TIMED_NS:  # another thread's stretch
        return 0
    _region_number = number
    _region_nested_ns = 0
    _timed_at = -1  # until the stretch ends, every recording call times itself (`_took` takes it out)
    _region_started = started = _perf_ns()
    return started


def cost_end(started_ns: int) -> None:
    """The stretch `cost_begin` returned `started_ns` for ended."""
    global _region_started
    if not started_ns or started_ns != _region_started:
        return
    now = _perf_ns()
    _region_started = 0
    _sample(_region_number, now - started_ns, now - started_ns - _region_nested_ns, now)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def stretch(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn`, a function of hook code only (it calls none of the service's), as a stretch of hook
    code (`cost_begin` / `cost_end`) each time it runs: for a hook's event listeners and its
    bookkeeping after a call, which must not run inside another stretch."""

    @functools.wraps(fn)
    def timed(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        timing = cost_begin()
        try:
            return fn(*args, **kwargs)
        finally:
            cost_end(timing)

    return timed


def _writer_cpu() -> float:
    """CPU seconds the capture writer's flush threads used in this process so far (their CPU
    clocks, read from here: the thread itself is never touched)."""
    global _writer_cpu_s, _writer_thread
    ident = getattr(_writer, "flush_thread_ident", None)
    if isinstance(ident, int):
        try:
            cpu: float | None = time.clock_gettime(time.pthread_getcpuclockid(ident))
        except (OSError, OverflowError, ValueError):
            cpu = None
        if cpu is not None:
            if _writer_thread is not None and _writer_thread[0] == ident and cpu >= _writer_thread[1]:
                _writer_cpu_s += cpu - _writer_thread[1]
            elif _writer_thread is None or _writer_thread[0] != ident:  # a new flush thread: its clock began at 0
                _writer_cpu_s += cpu
            _writer_thread = (ident, cpu)
    return _writer_cpu_s


def requests_served() -> int:
    """Requests the inbound hooks saw arrive in this process since recording began (recorded or
    not: the sampler counts each), or those recorded when that is more."""
    base_id, base = _arrivals_base
    arrived = sampler.arrivals + sampler.seen - (base if id(sampler) == base_id else 0)
    return max(arrived, _recorded)


def cost() -> dict[str, Any]:
    """What the hooks have cost this process since recording began (or it was forked): the attrs
    of its `overhead` record.

    - `writer_cpu_ms`: CPU of the capture writer's flush thread, read from its clock (measured).
    - `hook_ms`: time in the hooks' own code on the service's threads (the recording functions
      and the stretches `cost_begin` marks: the inbound hooks' per-request bookkeeping, the
      event-loop probe, and the outbound hooks' (openai, httpx, aiohttp_client, and the DB pools' and drivers')
      bookkeeping around each call and per chunk read), estimated from the timed
      calls (`timed_calls` of `recording_calls`, which counts both) scaled by calls made / calls
      timed.
    - `cpu_percent`: the two together, as a percentage of one CPU core over the wall-clock time
      since recording began in this process; `process_cpu_percent` the same as a percentage
      of the CPU the process used meanwhile.
    - `added_ms_per_request`: `hook_ms` per request served, recorded or not (None before the
      first): what a request spent in the hooks' code on average. The writer's CPU is spent off
      the requests' path and is not in it.
    - `requests`: every request the inbound hooks saw arrive, recorded or not.
    """
    wall_s = max((_perf_ns() - _cost_wall_ns) / 1e9, 1e-9)
    process_s = time.process_time() - _cost_cpu_s
    writer_s = _writer_cpu()
    timed, timed_ns = _timed, _timed_ns
    calls = max(_last_call + 1, timed) if timed else 0
    hook_s = timed_ns * calls / timed / 1e9 if timed else 0.0
    recorded = _recorded
    served = requests_served()
    return {
        OVERHEAD_SOURCE: OVERHEAD_SOURCE_HOOKS,
        "cpu_percent": round(100 * (writer_s + hook_s) / wall_s, 4),
        "added_ms_per_request": round(hook_s * 1000 / served, 5) if served else None,
        "process_cpu_percent": round(100 * (writer_s + hook_s) / process_s, 3) if process_s > 0 else None,
        "writer_cpu_ms": round(writer_s * 1000, 3),
        "hook_ms": round(hook_s * 1000, 3),
        "timed_calls": timed,
        "recording_calls": calls,
        "recorded_requests": recorded,
        "requests": served,
        "wall_s": round(wall_s, 3),
        "injected": injected,
    }


def report_overhead() -> None:
    """Write what the hooks cost this process so far as an `overhead` record; never raises.

    Every `OVERHEAD_REPORT_INTERVAL_S` at most from a timed recording call, at `stop` and at
    exit (a process killed by a signal keeps its latest). The report reads the latest of each
    process.
    """
    global _overhead_due_ns
    try:
        if _writer is None:
            return
        _overhead_due_ns = _perf_ns() + int(OVERHEAD_REPORT_INTERVAL_S * 1e9)
        # No message: the attrs say it all, and the report reads them (`collection.overhead`).
        emit(QualityRecord(NOTE_OVERHEAD, now_ns(), _pid, "", 1, cost()))
    except Exception as exc:
        count_error("runtime", exc)


def _after_fork_in_child() -> None:
    _reset_ids()
    _reset_cost()  # what the hooks cost a forked worker is its own, from its fork on


_reset_ids()
_reset_cost()
os.register_at_fork(after_in_child=_after_fork_in_child)


# --- lifecycle ---------------------------------------------------------------------------------


def start(writer: Any) -> None:
    """Send every event from now on to `writer` (a `CaptureWriter`)."""
    global _writer
    _seen.clear()  # a new capture notes again which hooks see traffic
    _reset_cost()
    _writer = writer


def stop() -> None:
    """Stop recording (tests); events emitted afterwards are ignored."""
    global _writer
    report_errors(force=True)
    if _timed or _recorded:  # the last word on what the hooks cost (`attach --inject` removing them)
        report_overhead()
    _writer = None


def active() -> bool:
    return _writer is not None


def emit(event: Event) -> None:
    """Hand one event to the capture writer; never raises, never blocks."""
    writer = _writer
    if writer is not None:
        writer.emit(event)


def saw(hook: str) -> None:
    """`hook` is recording traffic: the first time in this process, write a `hook_active` record
    (the report lists the hooks that saw traffic, not every hook that loaded). Cheap after that."""
    if hook in _seen or _writer is None:
        return
    _seen.add(hook)
    emit(QualityRecord(semconv.NOTE_HOOK_ACTIVE, now_ns(), _pid, f"{hook} recorded its first event", 1, {"collector": hook}))


# --- which requests to record ------------------------------------------------------------------

#: Requests recorded per second and process, at most about, unless `latprof run --max-rate`
#: says otherwise.
DEFAULT_MAX_RATE = semconv.DEFAULT_MAX_RATE
#: The arrival rate that sets the sampling stride is measured over windows this long.
SAMPLING_WINDOW_NS = 250_000_000


class Sampler:
    """Which inbound requests to record: every one up to `max_rate` a second, above that 1 in k.

    Call it once per arriving request: 0 means do not record it, otherwise record it with
    that weight. The stride k of a window is the arrival rate of the window before divided
    by `max_rate`, rounded up. Of each k consecutive arrivals one is recorded, with weight k,
    at a position drawn at random for that block (stratified sampling): each request is
    recorded with chance exactly 1/k. The choice never looks at the request (its route, its
    latency), so the recorded requests, each counted k times, are an unbiased estimate of
    every request of the process: its count, its percentiles, its slowest 1%
    (Horvitz-Thompson; the analysis weighs by `latprof.sample_weight`). Slow requests come in
    runs (a pool or a queue backs up for a while): a run of m of them keeps at least m // k,
    where independent 1-in-k draws can miss a whole run; and the random position keeps a
    pattern that repeats every k requests from being seen through one phase only. A burst
    that would record more than twice a window's budget ends the window at once.
    `max_rate` 0 records every request.

    Not locked: threads that race on the counters only make the rate estimate a little off.
    """

    __slots__ = ("max_rate", "stride", "seen", "arrivals", "window_start", "window_end", "limit", "_window_ns", "_clock", "_random",
                 "_position", "_pick")  # fmt: skip

    def __init__(
        self,
        max_rate: float = DEFAULT_MAX_RATE,
        *,
        window_ns: int = SAMPLING_WINDOW_NS,
        clock: Callable[[], int] = time.monotonic_ns,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.max_rate = max_rate
        self._window_ns = window_ns
        self._clock = clock
        self._random = rng
        self.stride = 1
        self.seen = 0
        #: Arrivals counted in the windows before the current one (`seen` counts the current one's).
        self.arrivals = 0
        self.window_start = self.window_end = 0
        self.limit = 0
        self._position = self._pick = 0  # of the next arrival in its block of `stride`; the one recorded
        self._new_window(clock())

    def __call__(self) -> int:
        if self.max_rate <= 0:
            self.seen += 1  # counted all the same: what the hooks cost is per request served
            return 1
        now = self._clock()
        if now >= self.window_end or self.seen >= self.limit:
            self._roll(now)
        self.seen += 1
        stride = self.stride
        if stride == 1:
            return 1
        position = self._position
        if position >= stride:  # a new block of `stride` arrivals: which of them to record
            position = 0
            self._pick = int(self._random() * stride)
        self._position = position + 1
        return stride if position == self._pick else 0

    def _roll(self, now: int) -> None:
        """Set the stride from the rate of the window that ends now, and start the next one."""
        if now - self.window_end >= self._window_ns:  # a whole window without a request since
            self.stride = 1
        else:
            rate = self.seen * 1e9 / max(now - self.window_start, 1_000_000)
            self.stride = max(1, math.ceil(rate / self.max_rate - 1e-9))
        self._new_window(now)

    def _new_window(self, now: int) -> None:
        self.arrivals += self.seen
        self.seen = 0
        self._position = self.stride  # the stride may change: the next arrival starts a block
        self.window_start = now
        self.window_end = now + self._window_ns
        budget = self.max_rate * self._window_ns / 1e9  # requests to record per window
        self.limit = max(16, math.ceil(2 * budget * self.stride))


#: The sampler of inbound hooks; `configure_sampling` replaces it.
sampler = Sampler()


def configure_sampling(max_rate: float) -> None:
    """Record about `max_rate` requests a second in this process at most (0: every request)."""
    global sampler
    sampler = Sampler(max_rate)


# --- ids and clocks ----------------------------------------------------------------------------


def new_id() -> str:
    """A short id unique across the processes of one capture (random per process, then counted)."""
    return f"{_id_prefix}{next(_ids):x}"


now_ns = time.time_ns  # wall clock, nanoseconds: what every event stores


def pid() -> int:
    return _pid


# --- requests and segments ---------------------------------------------------------------------


def current_request() -> RequestState | None:
    return _request.get()


def begin_request(route: str, start_ns: int, attrs: Mapping[str, Any] | None = None) -> contextvars.Token[RequestState | None]:
    """Open a request in the current context; returns the token `end_request` needs."""
    return open_request(route, start_ns, attrs)[0]


def open_request(
    route: str, start_ns: int, attrs: Mapping[str, Any] | None = None
) -> tuple[contextvars.Token[RequestState | None], RequestState]:
    """`begin_request`, also returning the request's state (what `current_request()` now returns)."""
    number = next(_calls)
    started = _perf_ns() if number >= _timed_at else 0
    state = RequestState(new_id(), route, start_ns, _pid, dict(attrs) if attrs else {})
    token = _request.set(state)
    if started:
        _took(number, started)
    return token, state


def end_request(token: contextvars.Token[RequestState | None], end_ns: int | None = None) -> None:
    """Emit the root of the request opened with `token` and close it in this context."""
    global _recorded
    number = next(_calls)
    started = _perf_ns() if number >= _timed_at else 0
    state = _request.get()
    try:
        _request.reset(token)
    except ValueError:  # ended from another context: still emit, and leave the context alone
        pass
    if state is None:
        return
    emit(
        Request(
            state.request_id,
            state.route,
            state.start_ns,
            now_ns() if end_ns is None else end_ns,
            state.pid,
            state.cpu_ns,
            state.status_code,
            state.attrs or NO_ATTRS,
        )
    )
    _recorded += 1  # not locked: a lost count now and then only shifts a per-request average
    if started:
        _took(number, started)


#: `record(..., parent_id=ROOT)`: hang the segment off the request root, whatever is open.
ROOT: Any = object()
#: How many of its segments a request remembers for `spans_of` (bounded memory per request).
MAX_SPANS_KEPT = 256
_get_ident = threading.get_ident


def spans_of(state: RequestState) -> list[tuple[str, str | None, int, int, int]]:
    """The segments recorded for the request so far, as (segment_id, parent_id, start_ns, end_ns, thread id).

    An inbound hook closing a request uses them to nest a wait it found late (the event loop
    blocked by other work) under the segments that were waiting at the time. Only the first
    `MAX_SPANS_KEPT` segments are kept.
    """
    return list(state.spans or ())


def current_parent() -> str | None:
    """The id of the innermost open segment of this task, or None at the request root."""
    return _parent.get()


@contextlib.contextmanager
def nested_under(segment_id: str) -> Iterator[None]:
    """Make segments recorded in the block children of `segment_id` (a segment that ends later)."""
    token = _parent.set(segment_id)
    try:
        yield
    finally:
        try:
            _parent.reset(token)
        except ValueError:  # left from another context
            pass


def record(
    name: str,
    layer: str | None,
    start_ns: int,
    end_ns: int,
    attrs: Mapping[str, Any] | None = None,
    *,
    parent_id: str | None = None,
    segment_id: str | None = None,
    state: RequestState | None = None,
    copy_attrs: bool = True,
) -> str | None:
    """Emit a finished segment of the current request (or `state`); None outside any request.

    `parent_id` None nests it under this task's innermost open segment; `ROOT` under the root.
    `copy_attrs=False`: `attrs` is a dict the caller made for this segment and will not touch
    again, kept as it is (a copy less on a hook's hot path).
    """
    state = state or _request.get()
    if state is None or _writer is None:
        return None
    number = next(_calls)
    started = _perf_ns() if number >= _timed_at else 0
    sid = segment_id or new_id()
    if parent_id is ROOT:
        parent_id = None
    elif parent_id is None:
        parent_id = _parent.get()
    spans = state.spans
    if spans is None:
        state.spans = [(sid, parent_id, start_ns, end_ns, _get_ident())]
    elif len(spans) < MAX_SPANS_KEPT:
        spans.append((sid, parent_id, start_ns, end_ns, _get_ident()))
    emit(
        Segment(
            state.request_id,
            sid,
            parent_id,
            name,
            layer,
            start_ns,
            end_ns,
            state.pid,
            (dict(attrs) if copy_attrs else attrs) if attrs else NO_ATTRS,
        )
    )
    if started:
        _took(number, started)
    return sid


@contextlib.contextmanager
def segment(name: str, layer: str | None, attrs: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Time the block as a segment of the current request; segments opened inside nest under it.

    Yields the attribute dict, which the block may fill in (a status code, token counts).
    Outside a request, or when recording is off, it only runs the block.
    """
    state = _request.get()
    if state is None or _writer is None:
        yield attrs if attrs is not None else {}
        return
    attrs = attrs if attrs is not None else {}
    sid = new_id()
    parent = _parent.get()
    token = _parent.set(sid)
    start = now_ns()
    try:
        yield attrs
    finally:
        end = now_ns()
        try:
            _parent.reset(token)
        except ValueError:
            pass
        record(name, layer, start, end, attrs, parent_id=parent, segment_id=sid, state=state)


def gauge(name: str, value: float, attrs: Mapping[str, Any] | None = None) -> None:
    """Emit one reading of a gauge (pool in use, loop lag, ...)."""
    if _writer is not None:
        number = next(_calls)
        started = _perf_ns() if number >= _timed_at else 0
        emit(Gauge(name, float(value), now_ns(), _pid, dict(attrs) if attrs else NO_ATTRS))
        if started:
            _took(number, started)


def connection_wait_histogram(hook: str) -> Any:
    """OpenTelemetry's `db.client.connection.wait_time` histogram (seconds), through opentelemetry-api.

    Every pool hook asks for the same meter, name, unit and description, so an SDK gives them
    one instrument, told apart by the pool name. None (the error counted for `hook`) when
    opentelemetry-api is missing or broken: the rest of the hook still works.
    """
    try:
        from opentelemetry import metrics

        return metrics.get_meter("latprof").create_histogram(
            semconv.METRIC_DB_CONNECTION_WAIT_TIME,
            unit="s",
            description="The time it took to obtain an open connection from the pool",
        )
    except Exception as exc:
        count_error(hook, exc)
        return None


# --- the hooks' own errors ---------------------------------------------------------------------


def count_error(hook: str, exc: BaseException, *, own_message: bool = False) -> None:
    """Count an error a hook swallowed; written as a quality record at most once a second per hook.

    The record says the last one's type and where it was raised (`describe_error`); its message
    only when latprof wrote it (`own_message`), since a library's message can quote a value of
    the service's: a key, a parameter, part of a prompt."""
    try:
        with _errors_lock:
            _errors[hook] = _errors.get(hook, 0) + 1
            _last_error[hook] = describe_error(exc, own_message=own_message)
        report_errors()
    except Exception:
        pass


def describe_error(exc: BaseException, *, own_message: bool = False) -> str:
    """`exc`'s type and the innermost place it passed through ("KeyError at redis.py:812 in
    _end_command"), with its message only when `own_message`; at most 300 characters."""
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        where = f" at {os.path.basename(code.co_filename)}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    text = f"{type(exc).__qualname__}{where}"
    return (f"{text}: {exc}" if own_message else text)[:300]


def errors() -> dict[str, int]:
    """Errors swallowed so far, by hook, not yet written to the capture."""
    with _errors_lock:
        return dict(_errors)


def report_errors(force: bool = False) -> None:
    """Write the counted errors of each hook as a quality record (rate-limited unless `force`)."""
    if _writer is None:
        return
    now = time.monotonic()
    with _errors_lock:
        due = [
            hook
            for hook, count in _errors.items()
            if count and (force or now - _errors_reported_at.get(hook, 0.0) >= ERROR_REPORT_INTERVAL_S)
        ]
        batch = [(hook, _errors.pop(hook), _last_error.get(hook, "")) for hook in due]
        for hook in due:
            _errors_reported_at[hook] = now
    for hook, count, last in batch:
        emit(
            QualityRecord(
                NOTE_ERROR,
                now_ns(),
                _pid,
                f"hook {hook} swallowed {count} error(s)",
                count,
                {"collector": hook, LAST_ERROR: last},
            )
        )


def _at_exit() -> None:
    report_errors(force=True)
    report_overhead()


atexit.register(_at_exit)


def guarded(hook: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a hook callback so that its exceptions are counted, never raised into the service."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                count_error(hook, exc)
                return None

        wrapper.__name__ = getattr(fn, "__name__", "hook")
        wrapper.__doc__ = fn.__doc__
        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    return decorate


# --- patching libraries when they are imported -------------------------------------------------


_pending: dict[str, list[Callable[[types.ModuleType], None]]] = {}
_pending_lock = threading.RLock()


def when_imported(module_name: str, callback: Callable[[types.ModuleType], None]) -> None:
    """Run `callback(module)` once `module_name` is imported (now, if it already is).

    The service pays nothing for libraries it never imports. `callback` runs right after the
    module's code, before the importer sees it; its exceptions are the caller's to guard.
    """
    with _pending_lock:
        module = sys.modules.get(module_name)
        if module is None:
            _pending.setdefault(module_name, []).append(callback)
            if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _PostImportFinder())
            return
    callback(module)


def forget_imports() -> None:
    """Patch no library imported from now on: drop the waiting callbacks and latprof's import
    finder from `sys.meta_path` (a process latprof injected into, when the hooks are removed)."""
    with _pending_lock:
        _pending.clear()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PostImportFinder)]


def _run_callbacks(module: types.ModuleType) -> None:
    with _pending_lock:
        callbacks = _pending.pop(module.__name__, [])
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # a hook that cannot patch must not break the service's import
            count_error(getattr(callback, "__module__", "import-hook").rsplit(".", 1)[-1], exc)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the loader of a module someone waits for."""

    def __init__(self) -> None:
        self._finding = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending:
            return None
        finding: set[str] = self._finding.__dict__.setdefault("names", set())
        if fullname in finding:
            return None
        finding.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:
            return None
        finally:
            finding.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _CallbackLoader(spec.loader)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        result: types.ModuleType | None = self._loader.create_module(spec)
        return result

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        _run_callbacks(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)
