"""Sleeps inside a request: the backoff of tenacity, backoff and hand-written retry loops (`retry`).

- **Where.** `time.sleep` and `asyncio.sleep` are replaced at interpreter start by wrappers,
  and so are the names `sleep` and `_sleep` of modules imported before that bound them
  (`from time import sleep`: redis-py's retry, psycopg's waiting; not asyncio's own modules),
  which matters when the hook is installed into a process that is already serving; other
  names bound to them earlier keep the original. Outside a request, or for sleeps under
  `MIN_SLEEP_S` (`asyncio.sleep(0)` yields the loop), the wrapper hands the call on and costs
  a check; `asyncio.sleep` then returns the original coroutine.
- **What.** A sleep of a request is a segment named `sleep`. Called by tenacity or backoff
  (retry libraries: every sleep of theirs is a backoff) it is `retry` at once, with
  `latprof.retry.library`. Otherwise it has no layer (it owns no time, like a marker) and
  the analysis decides (`latprof.analysis.retries`): a sleep after a failed outbound call (429, 5xx,
  a timeout or connection error) and before another call to the same target is `retry`;
  any other sleep stays what no collector explains. The openai client's own backoff is
  recorded by the openai hook.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, SupportsIndex

from latprof.collectors.hooks import _scaffold, runtime
from latprof.layers import RETRY
from latprof.semconv import RETRY_LIBRARY, SLEEP_SEGMENT

HOOK = "sleeps"

#: Sleeps shorter than this are not recorded.
MIN_SLEEP_S = 0.001
#: Modules whose sleeps are backoff by definition (retry libraries), by top-level package.
RETRY_LIBRARIES = frozenset({"tenacity", "backoff", "retrying", "stamina", "urllib3"})

_time_ns = time.time_ns


#: Module names that may hold a `sleep` bound before install (`from time import sleep`).
ALIASES = ("sleep", "_sleep")


def _patch_time(module: Any) -> None:
    original = module.sleep
    sleep = _make_sleep(original)
    if scaffold.replace(module, "sleep", sleep):
        scaffold.replace_aliases({alias: (original, sleep) for alias in ALIASES})


def _patch_asyncio(module: Any) -> None:
    original = module.tasks.sleep
    sleep = _make_async_sleep(original)
    if scaffold.replace(module.tasks, "sleep", sleep):
        scaffold.replace(module, "sleep", sleep)  # `asyncio.sleep` is asyncio.tasks.sleep, re-exported
        # (not asyncio's own modules: their sleep(0) only yields the loop)
        scaffold.replace_aliases({alias: (original, sleep) for alias in ALIASES}, skip=("asyncio",))


_T = _scaffold.Target
#: What the hook patches: `time.sleep` now, `asyncio.sleep` when asyncio is imported (most
#: processes never need it: not imported here).
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("time", [_T("time", "", "sleep")], _patch_time),
    _scaffold.Library("asyncio", [_T("asyncio.tasks", "", "sleep", True), _T("asyncio", "", "sleep", True)], _patch_asyncio),
])  # fmt: skip
#: Replace `time.sleep` now and `asyncio.sleep` when asyncio is imported; idempotent.
install = scaffold.install
#: Restore the originals (tests).
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""

    def describe() -> str:
        aliases = sum(1 for owner, _, _, _ in scaffold.patched if owner.__name__ not in ("time", "asyncio", "asyncio.tasks"))
        return ("sleeps of a recorded request through time.sleep and asyncio.sleep are seen from the injection on, and"
                f" through the {aliases} name(s) `sleep` that modules imported before had bound to them; a sleep function"
                " kept under any other name before the injection is not seen")

    return scaffold.late_coverage(describe)


def _library(depth: int) -> str | None:
    """The retry library that called sleep, if one did (looked up only for recorded sleeps)."""
    try:
        frame: Any = sys._getframe(depth)
    except ValueError:
        return None
    for _ in range(3):  # tenacity calls time.sleep from tenacity.nap.sleep, through a partial or two
        if frame is None:
            break
        top = str(frame.f_globals.get("__name__", "")).split(".", 1)[0]
        if top in RETRY_LIBRARIES:
            return top
        if top not in ("functools", "asyncio", __name__.split(".", 1)[0]):
            return None
        frame = frame.f_back
    return None


def _record(start: int, end: int, library: str | None) -> None:
    try:
        if library is not None:
            runtime.record(SLEEP_SEGMENT, RETRY, start, end, {RETRY_LIBRARY: library})
        else:
            runtime.record(SLEEP_SEGMENT, None, start, end)
        runtime.saw(HOOK)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _make_sleep(original: Callable[[float | SupportsIndex], None]) -> Callable[[float | SupportsIndex], None]:
    def sleep(seconds: float | SupportsIndex) -> None:
        if runtime.current_request() is None or not isinstance(seconds, (int, float)) or seconds < MIN_SLEEP_S:
            return original(seconds)
        library = _library(2)
        start = _time_ns()
        try:
            return original(seconds)
        finally:
            _record(start, _time_ns(), library)

    sleep.__doc__ = original.__doc__
    sleep.__wrapped__ = original  # type: ignore[attr-defined]
    return sleep


def _make_async_sleep(original: Callable[..., Any]) -> Callable[..., Any]:
    def sleep(delay: float, result: Any = None) -> Any:
        # Not a coroutine function: the common case hands back the original coroutine.
        if runtime.current_request() is None or not isinstance(delay, (int, float)) or delay < MIN_SLEEP_S:
            return original(delay, result)
        return _timed(original(delay, result), _library(2))

    sleep.__doc__ = original.__doc__
    sleep.__wrapped__ = original  # type: ignore[attr-defined]
    return sleep


async def _timed(sleeping: Any, library: str | None) -> Any:
    start = _time_ns()
    try:
        return await sleeping
    finally:
        _record(start, _time_ns(), library)
