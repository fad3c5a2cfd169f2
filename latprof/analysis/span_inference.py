"""What stock spans imply but do not record, read from their shape: retry backoff between attempts (here), pool
waits and queues behind a fixed concurrency (`latprof.analysis.inference`), waits for an outbound HTTP connection
slot hidden in client spans (`latprof.analysis.http_limit_inference`), an event loop blocked by a request's
own code (`latprof.analysis.stall_inference`), the queue in front of the app from a proxy's stamp or span
(`latprof.analysis.ingress_inference`).

Every conclusion (save the request-start header's, which a proxy measured) is an inference in
`latprof.analysis.inference`'s sense: the segment it
adds carries `latprof.inferred: true` and `latprof.inferred.from`, the rules that read it say
`inferred: true` in their evidence and scale their confidence by `INFERRED_CONFIDENCE`, and the
verdict says it was inferred. `infer_from_spans` is the one place that runs the trace
inferences, in order; the pipeline calls it for trace sources.

**Retries.** Stock HTTP instrumentations (httpx, aiohttp, requests) emit one client span per
attempt and nothing for the sleep between attempts. A failed client span (HTTP 429 or 5xx, or
an error status / `error.type`) whose very next sibling under the same parent is another call
to the same target, after an uncovered gap, is read as an attempt, a backoff and a retry: the
gap becomes an inferred `retry` segment. An agent loop that calls a tool twice with an LLM call
between does not match (the LLM call is the next sibling, not the retry), nor does a call that
succeeded, nor two calls back to back (no gap worth a backoff).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from latprof.analysis.http_limit_inference import infer_http_limits
from latprof.analysis.inference import INFERRED, INFERRED_FROM, infer_pool_waits, infer_queueing
from latprof.analysis.ingress_inference import infer_ingress_queue
from latprof.analysis.stall_inference import infer_event_loop_stalls
from latprof.analysis.timeline import RequestTimeline, Timeline
from latprof.events import Segment
from latprof.layers import MODEL, PROVIDER, RETRY, TOOL
from latprof.analysis.retries import failure_of
from latprof.collectors.traces.tracemap import may_have_failed
from latprof.semconv import SERVER_ADDRESS

#: Layers of client spans whose failure a following gap can be the backoff of.
RETRIED_LAYERS = frozenset({TOOL, PROVIDER, MODEL})
#: The gap between a failed attempt and the next one must be at least this long to be a backoff:
#: the client's own work between two attempts (building the request again, a loaded event loop)
#: takes well under this on a shared 2-core machine, while retry libraries and SDKs back off for
#: tens of milliseconds at the least (openai: 500 ms, tenacity/backoff defaults: >= 100 ms).
MIN_BACKOFF_NS = 10_000_000
#: str on an inferred `retry` segment: the target both attempts called.
INFERRED_TARGET = "latprof.inferred.retry_target"
INFERRED_RETRY = "retry backoff (inferred)"
SOURCE_GAP_AFTER_FAILED_CALL = (
    "the uncovered gap between a failed client span (429, 5xx or an error) and the next span to the same target"
    " under the same parent"
)


#: How a client span failed, or None: `latprof.analysis.retries.failure_of` (429 or 5xx, error.type, error status).
attempt_failure = failure_of


def call_target(call: Segment) -> str:
    """What a client span called: its host, port and span name (method and route, for HTTP)."""
    host = call.attrs.get(SERVER_ADDRESS) or call.attrs.get("net.peer.name") or ""
    port = call.attrs.get("server.port") or call.attrs.get("net.peer.port") or ""
    return f"{host}:{port} {call.name}"


def retries_in(rt: RequestTimeline) -> list[Segment]:
    """The inferred `retry` segments of one request (module docstring): for each failed client
    span whose next sibling is a call to the same target after at least `MIN_BACKOFF_NS`."""
    # most requests have no failed call, or one call: found without grouping every segment by parent
    calls = [s for s in rt.segments if s[4] in RETRIED_LAYERS and s[6] > s[5]]  # layer, start, end
    if len(calls) < 2:
        return []
    if not any(may_have_failed(call[8]) for call in calls):
        return []
    by_parent: dict[str | None, list[Segment]] = {}
    for s in rt.segments:
        if s.layer is not None and s.end_ns > s.start_ns:
            by_parent.setdefault(s.parent_id, []).append(s)
    out: list[Segment] = []
    for siblings in by_parent.values():
        if len(siblings) < 2:
            continue
        siblings.sort(key=lambda s: (s.start_ns, s.end_ns))
        for failed, retried in zip(siblings, siblings[1:]):
            if failed.layer not in RETRIED_LAYERS or retried.layer not in RETRIED_LAYERS:
                continue
            gap_ns = retried.start_ns - failed.end_ns
            if gap_ns < MIN_BACKOFF_NS or call_target(failed) != call_target(retried):
                continue
            how = attempt_failure(failed)
            if how is None:
                continue
            attrs: dict[str, Any] = {INFERRED: True, INFERRED_FROM: SOURCE_GAP_AFTER_FAILED_CALL, how[0]: how[1],
                                     INFERRED_TARGET: call_target(failed)}  # fmt: skip
            out.append(Segment(rt.request.request_id, f"{failed.segment_id}.backoff", failed.parent_id, INFERRED_RETRY,
                               RETRY, failed.end_ns, retried.start_ns, failed.pid, attrs))  # fmt: skip
    return out


def infer_retries(timeline: Timeline) -> Timeline:
    """The timeline with an inferred `retry` segment in each gap between a failed attempt and
    its retry (`retries_in`); the same timeline when there is none."""
    added: dict[int, list[Segment]] = {}
    facts = timeline.span_facts  # when mapping noted which requests have a call that may have failed, only those
    if facts is not None and not facts.failed_calls:
        return timeline
    for i, rt in enumerate(timeline.requests):
        if facts is not None and rt.request[0] not in facts.failed_calls:
            continue
        found = retries_in(rt)
        if found:
            added[i] = found
    if not added:
        return timeline
    requests = [
        RequestTimeline(rt.request, rt.segments + tuple(added[i])) if i in added else rt for i, rt in enumerate(timeline.requests)
    ]  # fmt: skip
    return dataclasses.replace(timeline, requests=requests)


def infer_from_spans(timeline: Timeline, warmup_s: float = 0.0) -> Timeline:
    """Every trace inference, in order: retries (they are per request), then waits for an outbound HTTP
    connection (inside client spans: they shorten the calls the steps after read), then pool waits and queues
    (they read gaps the earlier steps may have filled), then event-loop stalls (own-code gaps the
    earlier steps left, and the spans a stall released), then the queue in front of the app from a
    proxy's stamp or span (it replaces what `infer_queueing` could only guess there, and it moves
    requests' starts, which the gap readings before it must not see). Those judged across requests
    judge the ones after `warmup_s`, as the analysis does."""
    return infer_ingress_queue(
        infer_event_loop_stalls(
            infer_queueing(infer_pool_waits(infer_http_limits(infer_retries(timeline), warmup_s), warmup_s)), warmup_s
        )
    )

