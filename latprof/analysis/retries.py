"""Which sleeps of a request were backoff between two attempts: `retry` the sleeps hook leaves to the analysis.

The sleeps hook records every sleep of a request (`sleep` segments without a layer) unless a
retry library made it. A sleep is a backoff when the last outbound call of the request that
ended before it failed - HTTP 429 or 5xx, or an error such as a timeout or a refused
connection - and the first outbound call that started after it went to the same target
(its `server.address`, or its name when it has none). Such a sleep becomes a `retry`
segment with the failed call's status (`latprof.retry.after_status`) or error type
(`latprof.retry.after_error`); any other sleep stays without a layer.
"""

from __future__ import annotations

from latprof.events import Segment
from latprof.layers import DB_QUERY, MODEL, PROVIDER, RETRY, TOOL
from latprof.semconv import (
    ERROR_TYPE,
    HTTP_STATUS_CODE,
    RETRY_AFTER_ERROR,
    RETRY_AFTER_STATUS,
    SERVER_ADDRESS,
    SLEEP_SEGMENT,
    SPAN_STATUS_ERROR,
)
from latprof.analysis.timeline import RequestTimeline

#: Layers of outbound calls whose failure a sleep can be the backoff of.
OUTBOUND = frozenset({TOOL, PROVIDER, MODEL, DB_QUERY})
#: The pre-1.21 HTTP semantic conventions' status code, still sent by some instrumentations.
OLD_HTTP_STATUS_CODE = "http.status_code"
#: A sleep begins this soon after the failed call at the latest counts as following it, and so on.
TOLERANCE_NS = 1_000_000


def is_pending_sleep(segment: Segment) -> bool:
    """A sleep the hook left without a layer (hot path: called on every segment)."""
    return segment[4] is None and segment[3] == SLEEP_SEGMENT  # layer, name


def failure_of(call: Segment) -> tuple[str, object] | None:
    """(attribute, value) saying how `call` failed - its HTTP status when 429 or 5xx (either
    convention's attribute), else its `error.type`, else a span's error status - or None when it
    did not (or may not have)."""
    for key in (HTTP_STATUS_CODE, OLD_HTTP_STATUS_CODE):
        status = call.attrs.get(key)
        if isinstance(status, int) and (status == 429 or status >= 500):
            return RETRY_AFTER_STATUS, status
    error = call.attrs.get(ERROR_TYPE)
    if error:
        return RETRY_AFTER_ERROR, str(error)
    if call.attrs.get(SPAN_STATUS_ERROR):
        return RETRY_AFTER_ERROR, "error status"
    return None


def _target(call: Segment) -> str:
    return str(call.attrs.get(SERVER_ADDRESS) or call.name)


def classify_sleeps(rt: RequestTimeline) -> RequestTimeline:
    """`rt` with each of its pending sleeps that was a backoff turned into a `retry` segment."""
    sleeps = [s for s in rt.segments if is_pending_sleep(s)]
    calls = [s for s in rt.segments if s.layer in OUTBOUND]
    if not sleeps or not calls:
        return rt
    changed: dict[str, Segment] = {}
    for sleep in sleeps:
        before = [c for c in calls if c.end_ns <= sleep.start_ns + TOLERANCE_NS]
        after = [c for c in calls if c.start_ns >= sleep.end_ns - TOLERANCE_NS]
        if not before or not after:
            continue
        failed = max(before, key=lambda c: (c.end_ns, c.start_ns))
        retried = min(after, key=lambda c: (c.start_ns, c.end_ns))
        how = failure_of(failed)
        if how is None or _target(failed) != _target(retried):
            continue
        changed[sleep.segment_id] = sleep._replace(layer=RETRY, attrs={**sleep.attrs, how[0]: how[1]})
    if not changed:
        return rt
    return RequestTimeline(rt.request, tuple(changed.get(s.segment_id, s) for s in rt.segments))
