"""What the connection-pool hooks (sqlalchemy, psycopg_pool, asyncpg, redis) share: patching, pool state, gauges.

Not a hook itself. Each pool hook keeps its wrappers and its hot paths in its own module
(inline, one clock reading per event); what is the same for all of them lives here:

- `LibraryPatches`: `install`/`uninstall` and the bookkeeping of the attributes a hook
  replaced in its library, patched when the service imports it, all or nothing, errors
  counted for the hook;
- `PoolState`: what a hook keeps per pool (its name, the attribute dicts its segments share,
  the 100 ms gauge limiter and the last reading), which each hook extends with its own slots;
- `emit_gauges`: one reading of a pool's gauges, emitted when it changed;
- `statement_attrs`: the attributes of a `db.query` segment;
- the hot paths' shortcuts into `runtime` (its context variables' `get`, the clock, `record`).
"""

from __future__ import annotations

import threading
import types
from typing import Any, Callable

from latprof.collectors.hooks import runtime
from latprof.semconv import (
    DB_OPERATION_NAME,
    DB_POOL_NAME,
    DB_QUERY_SUMMARY,
    DB_SYSTEM_NAME,
    GAUGE_POOL_IN_USE,
    GAUGE_POOL_MAX,
    GAUGE_POOL_OVERFLOW,
    GAUGE_POOL_SIZE,
    GAUGE_POOL_WAITERS,
)

#: At most one reading of a pool's gauges per this interval, unless a checkout waited.
GAUGE_INTERVAL_NS = 100_000_000
#: A checkout slower than this (beyond opening a connection) waited for one.
WAITED_NS = 1_000_000

# The hot paths call these without the frame of runtime's own one-line functions
# (`current_request`, `current_parent`, `record`'s module lookup): same context variables,
# same clock. Each hook binds them to module globals of its own.
request_get = runtime._request.get
parent_get = runtime._parent.get
now_ns = runtime.now_ns
record = runtime.record
ROOT = runtime.ROOT


class LibraryPatches:
    """A hook's patches of one library: applied when the service imports it, undone by `uninstall`.

    `apply(module)` replaces attributes through `replace` and may add steps to `undo` (event
    listeners to remove); all or nothing: when it raises, what it did is undone and the error
    counted for the hook. `reset` then forgets what `apply` set up besides (the hook's
    histogram). A wrapper carries its original as `__latprof_original__`, so an attribute is
    wrapped once, even by another copy of the hook's module.
    """

    def __init__(
        self, hook: str, library: str, apply: Callable[[types.ModuleType], None], reset: Callable[[], None]
    ) -> None:
        self.hook = hook
        self.library = library
        self._apply = apply
        self._reset = reset
        self.lock = threading.RLock()
        self.installed = False
        self.patched: list[tuple[type, str, Any]] = []  # (class, attribute, original) to restore
        self.undo: list[Callable[[], None]] = []  # run before the originals are restored, latest first

    def install(self) -> bool:
        """Patch the library when it is imported (now, if it already is). Idempotent."""
        with self.lock:
            if self.installed:
                return True
            self.installed = True
        runtime.when_imported(self.library, self.patch)
        return True

    def uninstall(self) -> None:
        """Undo every patch (tests); pools and connections keep their harmless bookkeeping."""
        with self.lock:
            self.installed = False
            self.unpatch()

    def patch(self, module: types.ModuleType) -> None:
        """Apply the patches to the library's `module` (once); errors counted, never raised."""
        with self.lock:
            if not self.installed or self.patched or self.undo:
                return
            try:
                self._apply(module)
            except Exception as exc:
                self.unpatch()
                runtime.count_error(self.hook, exc)

    def replace(self, cls: type, name: str, wrapper: Callable[..., Any]) -> None:
        """Set `cls.name` (defined on `cls` itself) to `wrapper`, unless it is wrapped already."""
        original = cls.__dict__[name]
        if getattr(original, "__latprof_original__", None) is not None:
            return  # patched already (another copy of the hook's module, or a class seen before)
        wrapper.__latprof_original__ = original  # type: ignore[attr-defined]
        setattr(cls, name, wrapper)
        self.patched.append((cls, name, original))

    def unpatch(self) -> None:
        """Run the undo steps (errors counted), restore every original, latest first, and reset."""
        for step in reversed(self.undo):
            try:
                step()
            except Exception as exc:
                runtime.count_error(self.hook, exc)
        self.undo.clear()
        for cls, name, original in reversed(self.patched):
            setattr(cls, name, original)
        self.patched.clear()
        self._reset()


class PoolState:
    """What a pool hook keeps per pool: its name, attributes ready to use, the gauge limiter.

    `attrs` (a checkout's: the pool's name and, when known, its `db.system.name`) and
    `pool_attrs` (gauges, holds and the OpenTelemetry histogram: the name only) are handed to
    every segment as they are (`copy_attrs=False`): never mutated once built.

    The limiter: a reading is due when `now >= gauge_due_ns or now < gauged_at_ns` (the wall
    clock went back), which the hot paths test inline with the `now_ns()` they read anyway
    (compares, no arithmetic); `read_at(now)` notes a reading, `emit_gauges` emits it.
    """

    __slots__ = ("name", "attrs", "pool_attrs", "gauged_at_ns", "gauge_due_ns", "gauged")

    def __init__(self, name: str, system: str | None) -> None:
        self.name = name
        self.attrs: dict[str, Any] = {DB_POOL_NAME: name}
        if system:
            self.attrs[DB_SYSTEM_NAME] = system
        self.pool_attrs = {DB_POOL_NAME: name}
        self.gauged_at_ns = 0  # `now_ns()` of the last reading
        self.gauge_due_ns = 0  # when the next one is due
        self.gauged: tuple[float, ...] | None = None  # the last values emitted

    def read_at(self, now: int) -> None:
        """A reading of the gauges is taken at `now`: the next one is due GAUGE_INTERVAL_NS later."""
        self.gauged_at_ns = now
        self.gauge_due_ns = now + GAUGE_INTERVAL_NS


def emit_gauges(state: PoolState, values: tuple[float, ...], force: bool) -> None:
    """Emit a reading of the pool's gauges if it differs from the last one, or always if `force`.

    `values` is (size, most allowed or -1 for no limit, in use, waiters), or (size, most, in
    use, overflow, waiters) for a pool that tells its overflow; a limit of -1 is not emitted.
    """
    if not force and values == state.gauged:
        return
    state.gauged = values
    attrs = state.pool_attrs
    gauge = runtime.gauge
    gauge(GAUGE_POOL_SIZE, values[0], attrs)
    if values[1] >= 0:
        gauge(GAUGE_POOL_MAX, values[1], attrs)
    gauge(GAUGE_POOL_IN_USE, values[2], attrs)
    if len(values) > 4:
        gauge(GAUGE_POOL_OVERFLOW, values[3], attrs)
    gauge(GAUGE_POOL_WAITERS, values[-1], attrs)


def statement_attrs(system: str, summary: str, operation: str) -> dict[str, Any]:
    """The attributes of a `db.query` segment: the system, the statement's summary and its operation if known."""
    attrs: dict[str, Any] = {DB_SYSTEM_NAME: system, DB_QUERY_SUMMARY: summary}
    if operation:
        attrs[DB_OPERATION_NAME] = operation
    return attrs
