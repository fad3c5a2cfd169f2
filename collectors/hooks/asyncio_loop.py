"""Who blocked the asyncio event loop, and when: a lateness probe per loop and per-request coroutine steps.

Works the same on the stock asyncio loop and on uvloop, whose handles are Cython (nothing
to patch there): it relies only on `loop.call_later`, `loop.set_task_factory` and wrapping
the coroutines a request runs.

- **Probe.** A `call_later` chain on each monitored loop, every `PROBE_INTERVAL_S`. How late
  a tick runs is how long the loop could not run anything. A lateness of `BLOCK_THRESHOLD_NS`
  or more is a blocked interval: it is remembered, and written at once as a reading of the
  gauge `event_loop.lag_ms`; a second without one is written as one reading, its largest
  lateness. So the gauge has a reading per block and one per quiet second.
- **Steps.** An inbound hook (the ASGI hook) runs each request's coroutine inside a
  `TimedCoroutine`, and the loop's task factory wraps the tasks that coroutine spawns (task
  groups, `gather`, Starlette's `BaseHTTPMiddleware`) the same way. Every step (one `send`
  into the coroutine, i.e. one turn of its task on the loop) is timed in wall-clock time; a
  step that held the loop for `BLOCK_THRESHOLD_NS` or more is a blocked interval owned by
  that request, and shorter steps of at least `STEP_MIN_NS` are remembered for a while so
  that a late probe tick can say whose work it waited behind.
- **CPU.** The request's own `cpu_ns` is the CPU time of its steps. Reading the thread's CPU
  clock is a system call that costs a busy server more (1-5 us) than most steps take, so a
  step shorter than `STEP_MIN_NS` counts its wall-clock time (a step that short hides no
  blocking call worth telling apart), and only a longer step reads the clock, once, at its
  end: its CPU is what the thread used since the last reading (the probe reads it on every
  tick, and every long step), less the short steps counted since, and at most its wall-clock
  time. A long step that blocked in a system call (a sync client inside `async def`) so
  shows as the little CPU it used, within about one probe interval.
- **Attribution** (`LoopMonitor.blocked`): a request's time that overlaps a blocked interval
  it did not cause is time it was ready to run but waited for the loop, `event_loop`; its
  own steps are its own (`app` as far as its CPU time goes).

Bounded: a few hundred intervals per loop, no threads, nothing is kept per finished request.
The monitor of a loop starts on its first request; there is nothing to install globally.

- **Installed late** (into a loop that is already serving): a loop's monitor starts with the
  first request an inbound hook records on it. Until its probe has ticked once it cannot tell
  whether the loop is late, so `lagging` says it is: the first requests are backdated to their
  arrival (TCP_INFO) even when they queued behind a block that began before the injection.
- **Uninstall** (`stop_monitors`, also run when the ASGI or aiohttp.web hook is uninstalled)
  closes every monitor: on the loop's own thread its pending tick is cancelled and the loop's
  previous task factory is put back, if latprof's is still the one set. A monitor also closes
  itself at its next tick once recording stopped. Requests already tracked still finish.
"""

from __future__ import annotations

import collections
import contextvars
import itertools
import threading
import time
import types
import weakref
from collections.abc import Coroutine
from typing import Any, Callable, Generator, NamedTuple

from latprof.collectors.hooks import _scaffold, runtime
from latprof.semconv import GAUGE_LOOP_LAG_MS

HOOK = "asyncio_loop"

#: How often the probe ticks while requests are in flight. Blocks longer than threshold +
#: interval are always seen (those of a request's own step always are, by the step's timing).
PROBE_INTERVAL_S = 0.010
#: ... and while none is: a block then delays nobody (a request arriving during it is backdated
#: to its arrival anyway), and an idle service should not wake 100 times a second for us.
IDLE_PROBE_INTERVAL_S = 0.1
#: Lateness (or a single coroutine step) from which the loop counts as blocked.
BLOCK_THRESHOLD_NS = 20_000_000
#: Coroutine steps at least this long are remembered to tell whose work a late tick waited behind.
STEP_MIN_NS = 1_000_000
#: A period without a block is written as one reading of the lag gauge: its largest lateness.
GAUGE_PERIOD_NS = 1_000_000_000
#: How long a tick's lateness is remembered by `lagging` (unless a larger one replaces it).
LAG_MEMORY_NS = 2_000_000_000
#: A lateness above this is a loop that was not running (stopped and restarted, process
#: suspended), not a block: it is ignored.
MAX_PLAUSIBLE_LAG_NS = 60_000_000_000
#: How many blocked intervals and how many recent steps each loop remembers.
MAX_BLOCKS = 512
MAX_STEPS = 2048
#: No blocked interval owner: the loop was held by something that is no request's step.
UNKNOWN_OWNER = 0

_time_ns = time.time_ns
_thread_time_ns = time.thread_time_ns
_monotonic_ns = time.monotonic_ns
_CoroutineType = types.CoroutineType
_cost_begin = runtime.cost_begin  # the hooks' own cost, timed 1 call in about 16 (runtime)
_cost_end = runtime.cost_end


class Block(NamedTuple):
    """An interval in which the loop ran nothing but `owner`'s step (or unknown work)."""

    start_ns: int
    end_ns: int
    owner: int  # an `Owner.key`, or UNKNOWN_OWNER
    noted_ns: int  # when it was appended: non-decreasing along the deque


class Owner:
    """What the loop side knows about one request: its CPU on the loop, and whether it is over.

    `done` stops the accounting (background work after the response is not the request's
    latency); `key` identifies the request's steps in blocked intervals without keeping the
    request alive.
    """

    __slots__ = ("key", "cpu_ns", "done")

    def __init__(self) -> None:
        self.key = next(_keys)
        self.cpu_ns = 0
        self.done = False


_keys = itertools.count(1)
_owner: contextvars.ContextVar[Owner | None] = contextvars.ContextVar("latprof_loop_owner", default=None)


def current_owner() -> Owner | None:
    """The request (Owner) whose coroutine, or a task it spawned, is running in this context."""
    return _owner.get()


#: adopt(owner): make `owner` the owner of the current context (a request's own task, on its
#: first step). Tasks created from this context afterwards inherit it, and the task factory
#: times them for `owner` too. (The context variable's own `set`: a call less per request.)
adopt: Callable[[Owner], Any] = _owner.set


class LoopMonitor:
    """The probe, recent steps and blocked intervals of one event loop."""

    def __init__(self, loop: Any) -> None:
        self._loop_ref = weakref.ref(loop)
        self.blocks: collections.deque[Block] = collections.deque(maxlen=MAX_BLOCKS)
        self.steps: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=MAX_STEPS)
        self._due_ns = 0
        self._window_start_ns = 0
        self._window_max_ns = 0
        self._window_reported = False  # a block was written as a reading of its own this period
        self._running = False
        self.closed = False  # for good (`close`): never ticks again, a new monitor replaces it
        self._measured = False  # a tick ran: the probe can tell whether the loop is late
        self._handle: Any = None  # the pending tick
        self._interval_s = IDLE_PROBE_INTERVAL_S
        self.in_flight = 0  # requests begun and not finished on this loop
        self.task_factory: Callable[..., Any] | None = None
        # The loop thread's CPU clock at its last reading, and the wall-clock time of steps
        # counted as CPU since (see `step_cpu`).
        self.cpu_mark = 0
        self.short_ns = 0
        # The largest lateness of a tick in about the last LAG_MEMORY_NS (see `lagging`).
        self.lag_recent_ns = 0
        self._lag_recent_at = 0

    # --- the probe -------------------------------------------------------------------------

    def start(self) -> None:
        """Start ticking on the loop (call on the loop's thread); idempotent. Never after `close`."""
        if self._running or self.closed:
            return
        loop = self._loop_ref()
        if loop is None:
            return
        self._running = True
        self._window_start_ns = _time_ns()
        self.cpu_mark = _thread_time_ns()
        self.short_ns = 0
        self._schedule(loop)

    def _schedule(self, loop: Any) -> None:
        interval = PROBE_INTERVAL_S if self.in_flight > 0 else IDLE_PROBE_INTERVAL_S
        self._interval_s = interval
        self._due_ns = _monotonic_ns() + int(interval * 1e9)
        self._handle = loop.call_later(interval, self._tick)

    def request_started(self) -> None:
        """A request arrived: tick often from now on (at once if the probe was idling)."""
        self.in_flight += 1
        if self._interval_s != PROBE_INTERVAL_S and self._running and not self.closed:
            loop = self._loop_ref()
            if loop is None:
                return
            self.catch_up()
            if self._handle is not None:
                self._handle.cancel()
            self._schedule(loop)

    def request_finished(self) -> None:
        if self.in_flight > 0:
            self.in_flight -= 1

    def _tick(self) -> None:
        if self.closed:
            self._running = False
            return
        self._measured = True
        timing = _cost_begin()
        try:
            self.cpu_mark = _thread_time_ns()
            self.short_ns = 0
            late = _monotonic_ns() - self._due_ns
            now = _time_ns()
            if late > MAX_PLAUSIBLE_LAG_NS:
                late = 0
            self._remember_lag(late, now)
            if late >= BLOCK_THRESHOLD_NS:
                self._late(late, now)
            elif late > self._window_max_ns:
                self._window_max_ns = late
            if now - self._window_start_ns >= GAUGE_PERIOD_NS:
                if not self._window_reported:
                    runtime.gauge(GAUGE_LOOP_LAG_MS, max(self._window_max_ns, 0) / 1e6)
                self._window_start_ns = now
                self._window_max_ns = 0
                self._window_reported = False
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        _cost_end(timing)
        loop = self._loop_ref()
        if loop is None:
            self._running = False
            return
        if not runtime.active():  # recording stopped: leave the loop as it was
            self.close()
            return
        try:
            self._schedule(loop)
        except Exception as exc:  # the loop is closing
            self._running = False
            runtime.count_error(HOOK, exc)

    def _late(self, late: int, now: int) -> None:
        """The loop ran nothing else for `late` ns until `now`: a blocked interval, and a lag reading."""
        self._blocked(now - late, now)
        runtime.gauge(GAUGE_LOOP_LAG_MS, late / 1e6)
        self._window_reported = True

    def _remember_lag(self, late: int, now: int) -> None:
        if late >= self.lag_recent_ns or now - self._lag_recent_at >= LAG_MEMORY_NS:
            self.lag_recent_ns = late
            self._lag_recent_at = now

    def lagging(self, threshold_ns: int) -> bool:
        """Whether ready callbacks wait `threshold_ns` or more for this loop: now, or lately.

        True when the pending tick is that late already (the loop is busy, or was blocked
        just now and has not got to the tick), or when a tick was that late in about the last
        `LAG_MEMORY_NS`. A readable socket waits for the loop like a due timer does. Also True
        until the probe's first tick: a monitor started on a loop that was already serving
        (hooks installed late) cannot tell yet, and its first requests may have queued.
        """
        if self.lag_recent_ns >= threshold_ns or not self._measured:
            return True
        return self._running and _monotonic_ns() - self._due_ns >= threshold_ns

    def catch_up(self) -> None:
        """Note a block that just ended, before the probe's overdue tick gets its turn.

        After a block the loop runs everything that became ready meanwhile, in an order of
        its own: a request finishing there must still see the block. The tick, when it runs,
        measures its lateness from here.
        """
        if not self._running:
            return
        mono = _monotonic_ns()
        late = mono - self._due_ns
        if BLOCK_THRESHOLD_NS <= late <= MAX_PLAUSIBLE_LAG_NS:
            now = _time_ns()
            self._late(late, now)
            self._remember_lag(late, now)
            self._due_ns = mono

    def close(self) -> None:
        """Stop for good: cancel the pending tick and put the loop's previous task factory back,
        if latprof's is still the one set. Call on the loop's thread (or while it is not running)."""
        self.closed = True
        self._running = False
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()
        factory, self.task_factory = self.task_factory, None
        loop = self._loop_ref()
        if loop is not None and factory is not None and not loop.is_closed() and loop.get_task_factory() is factory:
            loop.set_task_factory(_not_latprofs(factory))

    def _blocked(self, start: int, end: int) -> None:
        """A late tick: the loop ran nothing else in [start, end]. Split it by whose steps ran there.

        Steps of `BLOCK_THRESHOLD_NS` or more are blocked intervals of their own already;
        shorter remembered steps become intervals of their owners; what no step covers (work
        outside any request: other tasks, callbacks, the GC) has no owner.
        """
        covered: list[tuple[int, int]] = []
        for step_start, step_end, key in reversed(self.steps):
            if step_end <= start:
                break
            if step_start >= end:
                continue
            lo, hi = max(step_start, start), min(step_end, end)
            covered.append((lo, hi))
            if step_end - step_start < BLOCK_THRESHOLD_NS:
                self.blocks.append(Block(lo, hi, key, end))
        covered.sort()
        cursor = start
        for lo, hi in covered:
            if lo - cursor >= STEP_MIN_NS:
                self.blocks.append(Block(cursor, lo, UNKNOWN_OWNER, end))
            cursor = max(cursor, hi)
        if end - cursor >= STEP_MIN_NS:
            self.blocks.append(Block(cursor, end, UNKNOWN_OWNER, end))

    # --- steps and attribution ---------------------------------------------------------------

    def step_cpu(self, start: int, end: int) -> int:
        """The CPU time of a step of the loop's thread that ran from `start` to `end` (wall-clock ns).

        Short steps count their wall-clock time; a long one reads the thread's CPU clock (see
        the module's notes). Call once per step, on the loop's thread, when it ended.
        """
        wall = end - start
        if wall < STEP_MIN_NS:
            if wall <= 0:
                return 0
            self.short_ns += wall
            return wall
        timing = _cost_begin()  # reading the thread's CPU clock is a system call: part of the hooks' cost
        now = _thread_time_ns()
        used = now - self.cpu_mark - self.short_ns
        self.cpu_mark = now
        self.short_ns = 0
        _cost_end(timing)
        return used if 0 < used < wall else (0 if used <= 0 else wall)

    def step(self, start: int, end: int, key: int) -> None:
        """One step of `key`'s coroutine held the loop from `start` to `end` (wall-clock ns).

        A request that closes in the middle of a step notes the step so far, and the step is
        noted again, whole, when it ends: overlapping intervals of one owner merge.
        """
        if end - start >= STEP_MIN_NS:
            self.steps.append((start, end, key))
            if end - start >= BLOCK_THRESHOLD_NS:
                self.blocks.append(Block(start, end, key, end))

    def blocked(self, key: int, start: int, end: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The parts of [start, end] in which the loop was blocked: (by others, by `key` itself).

        Each a sorted list of non-overlapping (start_ns, end_ns) pairs; "others" includes
        blocks of no known owner. Only intervals noted since `start` are looked at: the deque
        is in the order intervals were noted, and an interval is noted once it has ended.
        """
        self.catch_up()
        blocks = self.blocks
        if not blocks or blocks[-1].noted_ns < start:  # nothing blocked the loop since: the usual case
            return [], []
        others: list[tuple[int, int]] = []
        own: list[tuple[int, int]] = []
        for block in reversed(blocks):
            if block.noted_ns < start:
                break
            lo = block.start_ns if block.start_ns > start else start
            hi = block.end_ns if block.end_ns < end else end
            if hi > lo:
                (own if block.owner == key and key != UNKNOWN_OWNER else others).append((lo, hi))
        return _merged(others), _merged(own)


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    if len(intervals) < 2:
        return intervals
    intervals.sort()
    merged = [intervals[0]]
    for lo, hi in intervals[1:]:
        last_lo, last_hi = merged[-1]
        if lo <= last_hi:
            merged[-1] = (last_lo, max(last_hi, hi))
        else:
            merged.append((lo, hi))
    return merged


# --- timing a request's coroutine steps ------------------------------------------------------


class TimedCoroutine(Coroutine):  # type: ignore[type-arg]
    """A coroutine proxy that times each step of the wrapped coroutine for `owner`.

    The event loop's task drives it through `send`/`throw` exactly as it would drive the
    coroutine itself; attributes it does not define (`cr_frame`, `cr_running`, `__qualname__`
    ...) are the wrapped coroutine's, so `inspect.getcoroutinestate`, anyio and task reprs see
    the real thing.
    """

    __slots__ = ("_coro", "_owner", "_monitor")

    def __init__(self, coro: Any, owner: Owner, monitor: LoopMonitor) -> None:
        self._coro = coro
        self._owner = owner
        self._monitor = monitor

    def send(self, value: Any) -> Any:
        owner = self._owner
        if owner.done:
            return self._coro.send(value)
        wall0 = _time_ns()
        try:
            return self._coro.send(value)
        finally:
            self._account(owner, wall0)

    def throw(self, *args: Any) -> Any:
        owner = self._owner
        if owner.done:
            return self._coro.throw(*args)
        wall0 = _time_ns()
        try:
            return self._coro.throw(*args)
        finally:
            self._account(owner, wall0)

    def _account(self, owner: Owner, wall0: int) -> None:
        """A step of `owner` that began at `wall0` just ended: its CPU, and the loop time it held."""
        try:
            wall1 = _time_ns()
            monitor = self._monitor
            owner.cpu_ns += monitor.step_cpu(wall0, wall1)
            if wall1 - wall0 >= STEP_MIN_NS:
                monitor.step(wall0, wall1, owner.key)
        except Exception as exc:
            runtime.count_error(HOOK, exc)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self  # an iterator driven through send/throw, as a generator is

    def __iter__(self) -> TimedCoroutine:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def __getattr__(self, name: str) -> Any:
        # object.__getattribute__: an unset slot must not recurse back into __getattr__.
        return getattr(object.__getattribute__(self, "_coro"), name)

    def __repr__(self) -> str:
        return repr(self._coro)


# --- loops ----------------------------------------------------------------------------------

_monitors: weakref.WeakKeyDictionary[Any, LoopMonitor] = weakref.WeakKeyDictionary()
_monitors_lock = threading.Lock()  # taken on a loop's first request and by `stop_monitors`, never per request
_last: tuple[Any, LoopMonitor | None] = (lambda: None, None)  # (weakref to the loop, its monitor)
_PREVIOUS = "_latprof_previous"  # on latprof's task factory: the factory it chains to


def monitor(loop: Any) -> LoopMonitor | None:
    """The monitor of `loop` (a running loop; call on its thread), started on first use.

    Also (re)installs the task factory that times the tasks a request spawns, chained to any
    factory the service set. None when recording is off or the loop cannot be monitored.
    """
    global _last
    ref, found = _last
    if ref() is loop and found is not None and not found.closed:
        mon = found
    else:
        if not runtime.active():
            return None
        try:
            with _monitors_lock:
                known = _monitors.get(loop)
                if known is None or known.closed:
                    known = _monitors[loop] = LoopMonitor(loop)
            mon = known
            runtime.saw(HOOK)
            _last = (weakref.ref(loop), mon)
        except TypeError:  # a loop that cannot be weakly referenced: not monitored
            return None
    if not mon._running:
        mon.start()
    factory = mon.task_factory
    if factory is None or loop.get_task_factory() is not factory:
        _install_task_factory(loop, mon)
    return mon


def _install_task_factory(loop: Any, mon: LoopMonitor) -> None:
    """Time the tasks created while a request owns the context; leave every other task alone."""
    import asyncio

    previous = _not_latprofs(loop.get_task_factory())  # not the factory of a monitor closed since
    task_class = asyncio.Task

    owner_of_context = _owner.get

    def latprof_task_factory(loop: Any, coro: Any, **kwargs: Any) -> Any:
        owner = owner_of_context()
        if owner is not None and not owner.done and type(coro) is _CoroutineType:
            coro = TimedCoroutine(coro, owner, mon)
        if previous is not None:
            return previous(loop, coro, **kwargs)
        return task_class(coro, loop=loop, **kwargs)

    setattr(latprof_task_factory, _PREVIOUS, previous)
    loop.set_task_factory(latprof_task_factory)
    mon.task_factory = latprof_task_factory


def _not_latprofs(factory: Any) -> Any:
    """`factory`, or the first factory down its chain that is not latprof's (None: the loop's default)."""
    while factory is not None and hasattr(factory, _PREVIOUS):
        factory = getattr(factory, _PREVIOUS)
    return factory


def monitors() -> list[LoopMonitor]:
    """The monitors of the loops watched now (not closed)."""
    with _monitors_lock:
        return [mon for mon in _monitors.values() if not mon.closed]


def stop_monitors() -> None:
    """Close every monitor (see `LoopMonitor.close`) on its loop's thread, and forget them; never raises.

    A loop that is not running is closed from here; a running one through
    `call_soon_threadsafe` (at once when called on that loop's own thread). A loop's next
    request under an inbound hook that is still installed starts a new monitor.
    """
    global _last
    try:
        _last = (lambda: None, None)
        with _monitors_lock:
            found = list(_monitors.items())
            _monitors.clear()
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return
    for loop, mon in found:
        try:
            mon.closed = True  # from now on it never ticks again, whatever runs first
            if loop.is_closed():
                continue
            if not loop.is_running() or _running_loop() is loop:
                mon.close()
            else:
                loop.call_soon_threadsafe(mon.close)
        except RuntimeError:  # closed meanwhile: nothing of ours runs on it any more
            pass
        except Exception as exc:
            runtime.count_error(HOOK, exc)


def _running_loop() -> Any:
    import asyncio

    return asyncio._get_running_loop()


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: "each event loop is watched from the first request an inbound hook records on it after the injection"
        f" ({len(monitors())} watched now): blocks before that, and tasks spawned by requests already running, are not seen"
    )


#: Nothing to patch globally: an inbound hook starts the monitor of a loop on its first request.
#: Uninstall closes every monitor (their probes and task factories).
scaffold = _scaffold.Hook(HOOK, [], stop_monitors)
install = scaffold.install
uninstall = scaffold.uninstall
