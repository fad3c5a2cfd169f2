"""Rule request-queueing: requests wait before any worker starts on them because every worker is busy."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from latprof.analysis.requests import Analysis
from latprof.engine import (
    Finding,
    Rule,
    WaitThresholds,
    fmt_ms,
    judge_wait,
    median_summary,
    severity_for_median,
    severity_for_share,
    wait_evidence,
)
from latprof.analysis.inference import INFERRED, INFERRED_CONCURRENCY, INFERRED_CONFIDENCE, INFERRED_SERVICE, Inference
from latprof.analysis.ingress_inference import QUEUE_PROXY, QUEUE_READ_FROM, QUEUE_SOURCE_HEADER, QUEUE_SOURCE_PROXY
from latprof.layers import QUEUE
from latprof.semconv import GAUGE_ACCEPT_QUEUE, QUEUE_SOURCE

if TYPE_CHECKING:
    from latprof.attach.analysis import AttachAnalysis

#: Where-it-queued values the collectors write (`latprof.queue.source`), in the user's words.
_SOURCE_PHRASES = {
    "backlog": "the accept backlog",
    "threadpool": "the worker thread pool",
    "limiter": "a concurrency limiter",
    "executor": "a thread pool the handlers hand work to",
    "header": "front of the service, measured from the proxy's request-start header",
    "downstream": "front of a called service (from the caller's client span to that service's server span)",
    "proxy": "front of the app, between the proxy's span and the app's server span below it",
}

#: The first thing to change, by where the requests queued; the general advice follows it.
_SOURCE_FIXES = {
    "backlog": "Every worker was busy while connections piled up in the accept backlog: run more worker"
    " processes (gunicorn/uvicorn `--workers`) or more threads per worker.",
    "threadpool": "Requests waited for a thread of the worker pool (sync endpoints run on anyio's 40-thread"
    " limiter in FastAPI/Starlette, Django/Flask on the server's threads): raise the pool size or make the"
    " slow handlers async.",
    "executor": "Work the handlers hand to a ThreadPoolExecutor (or `loop.run_in_executor`) waited for a"
    " free worker of that pool: raise its `max_workers` to the fan-out you need, or give the slow tasks"
    " their own pool so they do not queue in front of the quick ones.",
    "limiter": "Requests waited on the service's own concurrency limiter: raise the limit if the"
    " dependencies behind it have headroom, otherwise shed the excess early (429) instead of queueing it.",
    "header": "Requests waited in front of the service (between the proxy and the app): add worker"
    " processes or replicas.",
    "downstream": "The called service ran at a fixed concurrency, its requests back to back: give it more"
    " workers or replicas, or cap the callers' concurrency at what it serves.",
    "proxy": "Requests waited between the proxy and the app (the app's accept backlog or a free worker, the"
    " hop, the proxy's own queue for an upstream connection): add worker processes or replicas behind the"
    " proxy, or cap what the proxy sends the app (Envoy circuit breakers, nginx `max_conns`) and shed the"
    " excess early.",
}


@dataclass(frozen=True, slots=True)
class Thresholds(WaitThresholds):
    #: Attach captures: a finding when connections queue in the accept backlog for this share of
    #: busy worker time plus queue time.
    attach_min_share: float = 0.2


class RequestQueueing(Rule):
    """Requests queue before a worker starts on them: the service is out of workers in the tail.

    What it detects:
        The `queue` layer (time between a request's arrival at the socket and the moment a
        worker, thread or handler started on it: accept backlog, worker thread pool,
        concurrency limiter) explains a large part of the tail: the slowest requests waited
        far longer for a worker than the median one. Or, tail or not, queueing takes most of
        the median request's latency (`min_share_of_median_latency`): every request waits
        for a worker, p99 stays close to p50 and there is no tail.

    Why it matters for p99:
        Workers are a pool like any other. When every worker is busy - usually because each
        one sits for seconds waiting on an LLM call - new requests wait in line, and the wait
        grows with the burst: at 90% utilisation a queue of a few requests means the unlucky
        ones wait several whole request-times before their handler even starts. None of that
        time is visible in handler spans or application metrics.

    Evidence:
        queue time p50/p99 and its tail excess and share; where requests queued (the
        `latprof.queue.source` of the queue segments, counted: backlog, threadpool,
        limiter, header, executor); peak and mean (time-weighted) accept-queue depth from the
        `accept.queue_depth` gauge when it was recorded; when queueing dominates the median
        request, its time there, that request's latency, the share and p99/p50; the most
        requests in flight at once (arrived and not yet answered, queued or served), from the
        request intervals; example request ids. From traces: a proxy's X-Request-Start
        header recorded on the app's server span measures the queue (`header`; the attribute
        it was read from in `request_start_read_from`); a proxy's span above the app's server
        span gives an inferred one (`proxy`; the proxy and what recognised it in `proxies`);
        a queue in front of a called service is inferred when that service ran at a fixed
        concurrency with its spans back to back (`downstream`). Inferred ones say
        `inferred: true`, at lower confidence.

    How to fix:
        Add capacity where the requests queued: more worker processes or threads (gunicorn
        `--workers`/`--threads`, uvicorn `--workers`, a larger thread pool or limiter). If
        workers are busy waiting on slow calls (LLM requests), make those handlers async or
        move the wait off the worker so one worker serves many requests. Shed or limit load
        upstream (rate limits, a 429 before the backlog grows), and autoscale on queue depth
        or in-flight requests rather than CPU, which stays low while workers wait.

    Example:
        A classification API runs 4 sync workers; each request spends ~300 ms waiting for the
        LLM. Every 10 s a burst triples the arrival rate, the accept backlog grows to a dozen
        connections and the slowest 1% wait 1.8 s before a worker picks them up: queue owns 80%
        of the tail excess while every handler span looks normal.
    """

    id = "request-queueing"
    layer = QUEUE
    Thresholds = Thresholds

    def judge_samples(self, samples: AttachAnalysis) -> Iterable[Finding]:
        """An attach capture: connections wait in the accept backlog for a free worker (/proc gauges)."""
        from latprof.attach.analysis import layer_findings

        return layer_findings(self, samples, QUEUE, min_share=self.thresholds.attach_min_share)

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(QUEUE)
        owns, dominates, judged_share = judge_wait(analysis, stats, t)
        if not owns and not dominates:
            return
        evidence = wait_evidence(analysis, stats, "queue", dominates)
        sources = Counter(
            str(s.attrs[QUEUE_SOURCE]) for _, s in analysis.segments(QUEUE) if s.attrs.get(QUEUE_SOURCE)
        )
        # Most segments first, ties by name, so the evidence and the subject are deterministic.
        ranked = sorted(sources.items(), key=lambda kv: (-kv[1], kv[0]))
        if ranked:
            evidence["queue_sources"] = dict(ranked)
        depth = [g.value for g in analysis.timeline.gauges.get(GAUGE_ACCEPT_QUEUE, ())]
        if depth:
            evidence["peak_accept_queue"] = max(depth)
            # time-weighted per socket, then averaged over the sockets read
            means = analysis.gauge_means(GAUGE_ACCEPT_QUEUE)
            evidence["mean_accept_queue"] = round(sum(means.values()) / len(means), 3) if means else 0.0
        evidence["peak_in_flight"] = _peak_in_flight(analysis)
        evidence["example_request_ids"] = analysis.example_request_ids(QUEUE)
        segments = [s for _, s in analysis.segments(QUEUE)]
        read_from = sorted({str(s.attrs[QUEUE_READ_FROM]) for s in segments if s.attrs.get(QUEUE_READ_FROM)})
        if read_from:
            evidence["request_start_read_from"] = read_from
        proxies = sorted({str(s.attrs[QUEUE_PROXY]) for s in segments if s.attrs.get(QUEUE_PROXY)})
        if proxies:
            evidence["proxies"] = proxies
        top_source = ranked[0][0] if ranked else ""
        inferred = [s for s in segments if s.attrs.get(INFERRED)]
        # the finding is as sure as the source that explains most of the queue: a measured header is not
        # made an inference by a few inferred segments elsewhere
        if top_source and inferred and not any(s.attrs.get(QUEUE_SOURCE) == top_source for s in inferred):
            inferred = []
        services = sorted(
            {f"{s.attrs.get(INFERRED_SERVICE) or '?'} ({s.attrs[INFERRED_CONCURRENCY]} at a time)"
             for s in inferred if s.attrs.get(INFERRED_CONCURRENCY) is not None}
        )  # fmt: skip
        if inferred:
            details: dict[str, object] = {"inferred_share_of_queue_segments": round(len(inferred) / len(segments), 4)}
            if services:
                details["services_at_fixed_concurrency"] = services
            top = next((s for s in inferred if s.attrs.get(QUEUE_SOURCE) == top_source), inferred[0])
            evidence.update(Inference.of_segment(top.attrs, details).evidence())

        where = _SOURCE_PHRASES.get(top_source, f"'{top_source}'") if top_source else ""
        summary = (
            f"The slowest 1% of requests waited {fmt_ms(stats.tail_excess_ms)} longer than the median request"
            f" before a worker started on them"
            + (f", mostly in {where}" if where else "")
            + f" (queue p99 {fmt_ms(stats.p99_ms)}"
            + (f", accept queue up to {evidence['peak_accept_queue']:g}" if depth else "")
            + f", up to {evidence['peak_in_flight']} requests in flight)."
        )
        if not owns:
            summary = (
                median_summary(analysis, stats, "waits for a worker before its handler starts")
                + (f", mostly in {where}" if where else "")
                + f" (up to {evidence['peak_in_flight']} requests in flight): the service runs at its concurrency limit."
            )
        fix = (
            (_SOURCE_FIXES.get(top_source, "") + " " if top_source in _SOURCE_FIXES else "")
            + "Add workers/threads (or processes) for the concurrency you serve; if workers mostly wait on"
            " LLM calls, make those handlers async so a worker is not tied up by the wait; shed or limit load"
            " upstream instead of letting the backlog grow; autoscale on queue depth or requests in flight,"
            " not CPU."
        )
        confidence = min(1.0, judged_share + (0.2 if depth or ranked else 0.0))
        if inferred:
            confidence *= INFERRED_CONFIDENCE
            summary = "Inferred (no span times the wait): " + summary[0].lower() + summary[1:]
            if top_source == QUEUE_SOURCE_PROXY and proxies:
                summary = summary[:-1] + f"; read from the spans of {', '.join(proxies)} and of the app below it."
            if services:
                summary = summary[:-1] + f"; {', '.join(services)} ran at a fixed concurrency, its spans back to back."
        elif read_from and top_source == QUEUE_SOURCE_HEADER:
            summary = summary[:-1] + f"; read from each request's {' or '.join(read_from)}."
        yield self.finding(
            severity=severity_for_share(judged_share) if owns else severity_for_median(analysis, stats),
            confidence=round(confidence, 4),
            impact_ms=stats.tail_excess_ms,
            summary=summary,
            evidence=evidence,
            fix=fix,
            subject=top_source,
        )


def _peak_in_flight(analysis: Analysis) -> int:
    """The most analysed requests between arrival and response at any one instant (all processes).

    In flight at an arrival is every request that arrived at or before it and has not yet
    ended; the peak is always at some arrival, so checking arrivals is enough. A sampled
    request counts as the requests it stands for (an estimate, then).
    """
    times = analysis.arrivals  # every analysed request, also those a cohort-first analysis did not read
    if all(w == 1 for *_, w in times):
        starts = sorted(t[0] for t in times)
        ends = sorted(t[1] for t in times)
        peak = 0
        for n_started, start in enumerate(starts, 1):
            # A request that ended exactly as another arrived is no longer in flight.
            in_flight = n_started - bisect.bisect_right(ends, start)
            peak = max(peak, in_flight)
        return peak
    # Weighted sweep: at equal times an end comes before an arrival (as bisect_right above).
    changes = []
    for start_ns, end_ns, _, w in times:
        changes.append((start_ns, 1, w))
        changes.append((end_ns, 0, -w))
    changes.sort()
    peak = level = 0
    for _, _, delta in changes:
        level += delta
        peak = max(peak, level)
    return peak
