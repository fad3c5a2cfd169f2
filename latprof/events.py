"""The event model every collector emits: requests, segments, gauges, stack samples, quality records.

All times are wall-clock nanoseconds since the Unix epoch (`time.time_ns()`), so events from
several processes and machines line up; durations are derived, never stored. Nothing here
knows which collector produced it.

The types are typed named tuples: immutable like frozen dataclasses, but built about twice
as fast, which matters when a capture holds millions of segments (see benchmarks/).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, NamedTuple, Union

#: The shared empty attribute mapping (read-only), so events without attributes cost nothing.
NO_ATTRS: Mapping[str, Any] = MappingProxyType({})


class Request(NamedTuple):
    """A request root: one inbound request, from its arrival at the server to its response.

    `start_ns` is when the request's bytes reached the server's socket (or the best
    measurement of it a collector had); time before the handler ran is a `queue` or
    `event_loop` segment. `route` is the route template (`POST /chat`), never the raw path.
    `cpu_ns` is the CPU time the handling thread spent on it, when the collector measured it:
    it is what lets time no segment covers count as `app` instead of `unattributed`.
    """

    request_id: str
    route: str
    start_ns: int
    end_ns: int
    pid: int
    cpu_ns: int | None = None
    status_code: int | None = None
    attrs: Mapping[str, Any] = NO_ATTRS

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


class Segment(NamedTuple):
    """A timed part of a request, owned by exactly one layer.

    `parent_id` is another segment's id, or None when the segment hangs off the request root.
    A segment with `layer=None` owns no time of its own (an agent wrapper, a connection-hold
    marker): its children are attributed as if they hung off its parent.
    """

    request_id: str
    segment_id: str
    parent_id: str | None
    name: str
    layer: str | None
    start_ns: int
    end_ns: int
    pid: int
    attrs: Mapping[str, Any] = NO_ATTRS

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


class Gauge(NamedTuple):
    """One reading of a value over time (pool in use, loop lag, accept queue, CPU).

    The unit is part of `name` where there is one (`event_loop.lag_ms`); `attrs` says which
    instance it measures (e.g. the pool's name).
    """

    name: str
    value: float
    ts_ns: int
    pid: int
    attrs: Mapping[str, Any] = NO_ATTRS


class Frame(NamedTuple):
    """One Python frame of a stack sample; matched by file suffix and function, never line."""

    function: str
    filename: str
    line: int = 0


class StackSample(NamedTuple):
    """What one thread was doing at one instant, innermost frame first.

    `weight` is how many identical consecutive samples this one stands for; `wchan` is the
    kernel wait channel of the thread (`futex_do_wait`, `hrtimer_nanosleep`, ...) when read.
    """

    ts_ns: int
    pid: int
    tid: int
    thread_name: str
    frames: tuple[Frame, ...]
    active: bool
    wchan: str | None = None
    weight: int = 1


class QualityRecord(NamedTuple):
    """How well collection went: hooks loaded, dropped events, errors, permissions, clock notes.

    `kind` is one of the `NOTE_*` names in `latprof.semconv`; `occurrences` how many times it
    happened (e.g. events dropped) since the collector's previous record of that kind.
    """

    kind: str
    ts_ns: int
    pid: int
    message: str = ""
    occurrences: int = 1
    attrs: Mapping[str, Any] = NO_ATTRS


Event = Union[Request, Segment, Gauge, StackSample, QualityRecord]
