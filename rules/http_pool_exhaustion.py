"""Rule http-pool-exhaustion: requests wait for a free connection of an outbound HTTP client pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from latprof.analysis.http_limit_inference import (
    AMBIGUOUS_CONFIDENCE,
    INFERRED_CALLS,
    INFERRED_SERVICE_MS,
    INFERRED_UNWAITED_MS,
    INFERRED_WAITED_CALLS,
    INFERRED_WAITED_SPAN_MS,
)
from latprof.analysis.inference import INFERRED, INFERRED_CEILING, INFERRED_CONFIDENCE, Inference
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
from latprof.layers import HTTP_POOL
from latprof.semconv import (
    GAUGE_HTTP_POOL_IN_USE,
    GAUGE_HTTP_POOL_MAX,
    GAUGE_HTTP_POOL_WAITERS,
    HTTP_POOL_MAX_CONNECTIONS,
    HTTP_POOL_MAX_KEEPALIVE,
    HTTP_POOL_NAME,
    SERVER_ADDRESS,
)

if TYPE_CHECKING:
    from latprof.attach.analysis import AttachAnalysis


#: Hosts named in the evidence, at most (the ones with the most waiting first).
MAX_HOSTS = 5


@dataclass(frozen=True, slots=True)
class Thresholds(WaitThresholds):
    #: Waits in this many client pools or more (in one process) mean clients are not shared.
    min_pools_for_sharing_advice: int = 2
    #: Attach captures: a finding when workers wait here for this share of their busy time (or of
    #: their busy time plus the time connections queued for them).
    attach_min_share: float = 0.2


class HttpPoolExhaustion(Rule):
    """Requests wait for a free connection of an outbound HTTP client pool: the pool is exhausted in the tail.

    What it detects:
        The `http.pool` layer (time waiting for a free connection slot in an outbound HTTP
        client pool, such as httpx's `Limits(max_connections=...)`) explains a large part of
        the tail: the slowest requests queued inside their own process for a connection to
        a tool, a service or a model API before the call was even sent. Or, tail or not, pool
        waits take most of the median request's latency (`min_share_of_median_latency`):
        every request waits for a connection and p99 stays close to p50. It says which hosts
        the waiting calls went to, the pools' limits, and whether the waits were spread over
        several client pools.

    Why it matters for p99:
        A client pool is a queue in front of every outbound call. httpx allows 100 connections
        per client by default (the openai client 1000), often far fewer when limits are set by
        hand; once they are all busy, the next call waits for one to come back, and a burst
        stacks the waits up: with 2 connections and 100 ms calls, the eighth concurrent call
        waits 300 ms before it is sent. The time looks like a slow tool or a slow LLM call,
        while the service it calls is idle.

    Evidence:
        pool wait p50/p99 and the tail excess; the hosts that waited (most waiting first);
        the pools' `max_connections` and `max_keepalive_connections`; how many client pools
        waited; peak connections in use and peak waiters from the pool gauges, and mean
        utilisation (time-weighted) when there is one limit; when the wait dominates the
        median request, its time there, that request's latency, the share and p99/p50;
        example request ids. From stock traces, where the client span starts before the wait
        for a connection, the waits are inferred by replaying each host's calls through a pool
        of the fewest connections that explain them (`latprof.analysis.http_limit_inference`):
        `inferred: true`, that `connection_ceiling`, the waiting calls' service against the
        others', and a confidence under 0.5 - a provider that serves that many calls at a time
        looks the same.

    How to fix:
        Size the pool for the concurrency the service sends to that host:
        `httpx.AsyncClient(limits=httpx.Limits(max_connections=N))` with N at least the peak
        in use plus the peak waiting (the openai client takes `http_client=` with such a
        client). Share one client per process, made at startup, instead of a client per
        worker or task with a small pool each. Do not go to the opposite extreme: a new
        client per request never waits in a pool but opens a new connection (and TLS
        handshake) per call and can exhaust sockets. When the host cannot take more
        concurrent calls, raising the limit only moves the queue there: bound concurrency
        before the call and set a pool timeout so overload fails fast.

    Example:
        An agent service calls its search tool through one shared `AsyncClient` with
        `max_connections=2`. Calls take 120 ms; bursts of 8 requests make 6 of them wait for
        a connection, up to 360 ms. http.pool owns 90% of the tail excess while the search
        service answers every call in 120 ms.
    """

    id = "http-pool-exhaustion"
    layer = HTTP_POOL
    Thresholds = Thresholds

    def judge_samples(self, samples: AttachAnalysis) -> Iterable[Finding]:
        """An attach capture: workers wait for a connection of an HTTP client pool (stack samples),
        or an asyncio service's requests wait behind a stable, busy ceiling of connections to one
        HTTP endpoint (socket census)."""
        from latprof.attach.analysis import layer_findings, wire_pool_findings

        return (
            layer_findings(self, samples, HTTP_POOL, min_share=self.thresholds.attach_min_share)
            + wire_pool_findings(self, samples, HTTP_POOL)
        )

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(HTTP_POOL)
        owns, dominates, judged_share = judge_wait(analysis, stats, t)
        if not owns and not dominates:
            return
        evidence = wait_evidence(analysis, stats, "pool_wait", dominates)
        waited_ns: dict[str, int] = {}
        pools: set[tuple[int, str]] = set()
        limits: set[int] = set()
        keepalive: set[int] = set()
        for i, segment in analysis.segments(HTTP_POOL):
            attrs = segment.attrs
            host = attrs.get(SERVER_ADDRESS)
            if host:
                waited_ns[str(host)] = waited_ns.get(str(host), 0) + analysis.weight(i) * (segment.end_ns - segment.start_ns)
            if attrs.get(HTTP_POOL_NAME):
                pools.add((segment.pid, str(attrs[HTTP_POOL_NAME])))
            for key, found in ((HTTP_POOL_MAX_CONNECTIONS, limits), (HTTP_POOL_MAX_KEEPALIVE, keepalive)):
                value = attrs.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    found.add(value)
        hosts = sorted(waited_ns, key=lambda h: (-waited_ns[h], h))[:MAX_HOSTS]
        if hosts:
            evidence["hosts"] = hosts
        if limits:
            evidence["max_connections"] = sorted(limits)
        if keepalive:
            evidence["max_keepalive_connections"] = sorted(keepalive)
        if pools:
            evidence["pools_waited"] = len(pools)
        evidence.update(_pool_gauges(analysis))
        evidence["example_request_ids"] = analysis.example_request_ids(HTTP_POOL)
        inferred = _inferred(analysis)
        evidence.update(inferred)

        details = []
        if limits:
            details.append("max_connections " + "/".join(str(n) for n in sorted(limits)))
        if "peak_in_use" in evidence:
            details.append(f"peak {evidence['peak_in_use']:g} in use")
        if "peak_waiters" in evidence:
            details.append(f"up to {evidence['peak_waiters']:g} waiting")
        to_hosts = f" to {', '.join(hosts)}" if hosts else ""
        summary = (
            f"The slowest 1% of requests waited {fmt_ms(stats.tail_excess_ms)} longer for a free HTTP connection{to_hosts}"
            f" than the median request" + (f" ({', '.join(details)})" if details else "") + "."
        )
        if not owns:
            summary = (
                median_summary(analysis, stats, f"waits for a free HTTP connection{to_hosts}")
                + (f" ({', '.join(details)})" if details else "")
                + "."
            )
        if inferred:
            ceiling = inferred["connection_ceiling"]
            summary = (
                "Inferred (the client spans start before the wait for a connection; no span times it): "
                + summary[0].lower() + summary[1:-1]
                + f": never more than {ceiling} calls{to_hosts} were served at once, and the calls that waited for one of"
                f" those {ceiling} were the slow ones. Either a client connection limit of {ceiling}, or a provider that"
                f" serves {ceiling} at a time: `latprof run` (its httpx pool hooks time the client's pool) or the"
                " provider's own concurrency limit tells them apart."
            )
        if len(pools) >= t.min_pools_for_sharing_advice:
            limit = f" of max_connections={min(limits)}" if limits else ""
            summary = summary[:-1] + f"; the waits were spread over {len(pools)} client pools."
            fix = (
                f"Share one HTTP client per process: the waits happened in {len(pools)} separate client pools{limit}"
                " (a client per worker or task, each with its own small pool). Create one client at startup and size"
                " its httpx.Limits(max_connections=...) for the total concurrency; a client per request would avoid"
                " the wait but open a new connection (and TLS handshake) per call."
            )
        else:
            needed = ""
            if "peak_in_use" in evidence and "peak_waiters" in evidence:
                peak = float(evidence["peak_in_use"]) + float(evidence["peak_waiters"])  # type: ignore[arg-type]
                needed = f" (at least {peak:g}: peak in use plus peak waiting)"
            fix = (
                f"Raise the client's pool limit: httpx.Limits(max_connections=...){needed}, on the one client the"
                " service shares (openai: http_client=httpx.AsyncClient(limits=...)). If the host cannot take more"
                " concurrent calls, bound concurrency before the call and set a pool timeout so overload fails fast;"
                " do not create a client per request to dodge the limit (a new connection per call)."
            )
        if inferred:
            fix = (
                f"If the client's limit is {inferred['connection_ceiling']} (httpx.Limits(max_connections=...), the"
                " openai client's http_client=): " + fix[0].lower() + fix[1:] + " If the provider serves only"
                f" {inferred['connection_ceiling']} calls at a time, raising the client's limit only moves the queue"
                " there: ask for more concurrency (a higher tier, more deployments) or spread the calls over more of them."
            )
        yield self.finding(
            severity=severity_for_share(judged_share) if owns else severity_for_median(analysis, stats),
            confidence=_confidence(judged_share, evidence),
            impact_ms=stats.tail_excess_ms,
            summary=summary,
            evidence=evidence,
            fix=fix,
            subject=",".join(sorted(hosts)),
        )


def _pool_gauges(analysis: Analysis) -> dict[str, float]:
    """Peak in use / waiters and mean utilisation (when there is one limit) from the HTTP pool gauges."""
    gauges = analysis.timeline.gauges
    out: dict[str, float] = {}
    maxima = {g.value for g in gauges.get(GAUGE_HTTP_POOL_MAX, ())}
    in_use = gauges.get(GAUGE_HTTP_POOL_IN_USE, [])
    if in_use:
        out["peak_in_use"] = max(g.value for g in in_use)
        if len(maxima) == 1 and max(maxima) > 0:
            out["mean_utilisation"] = round(analysis.gauge_utilisation(GAUGE_HTTP_POOL_IN_USE, GAUGE_HTTP_POOL_MAX), 4)
    if gauges.get(GAUGE_HTTP_POOL_WAITERS):
        out["peak_waiters"] = max(g.value for g in gauges[GAUGE_HTTP_POOL_WAITERS])
    return out


def _confidence(judged_share: float, evidence: dict[str, object]) -> float:
    """The share that decided, more with the pool gauges' waiters; an inferred limit scaled by
    `INFERRED_CONFIDENCE` and kept under 0.5 (`AMBIGUOUS_CONFIDENCE`): a provider serving that many at a
    time looks the same."""
    confidence = min(1.0, judged_share + (0.2 if "peak_waiters" in evidence else 0.0))
    if evidence.get("inferred"):
        confidence = min(confidence * INFERRED_CONFIDENCE, AMBIGUOUS_CONFIDENCE)
    return round(confidence, 4)


def _inferred(analysis: Analysis) -> dict[str, object]:
    """The inference's evidence when the `http.pool` time was inferred from client spans
    (`latprof.analysis.http_limit_inference`), else {}: the ceiling of the host that waited most."""
    pool = analysis.segments(HTTP_POOL)
    marked = [s for _, s in pool if s.attrs.get(INFERRED)]
    if not marked:
        return {}
    by_host: dict[str, int] = {}
    for s in marked:
        host = str(s.attrs.get(SERVER_ADDRESS))
        by_host[host] = by_host.get(host, 0) + s.end_ns - s.start_ns
    top = max(by_host, key=by_host.__getitem__)
    attrs = next(s.attrs for s in marked if str(s.attrs.get(SERVER_ADDRESS)) == top)
    ceiling = attrs.get(INFERRED_CEILING)
    return Inference.of_segment(attrs, {
        "inferred_share_of_pool_waits": round(len(marked) / len(pool), 4),
        "connection_ceiling": ceiling,
        "host": attrs.get(SERVER_ADDRESS),
        "calls": attrs.get(INFERRED_CALLS),
        "waited_calls": attrs.get(INFERRED_WAITED_CALLS),
        "waited_service_median_ms": attrs.get(INFERRED_SERVICE_MS),
        "unwaited_median_ms": attrs.get(INFERRED_UNWAITED_MS),
        "waited_span_median_ms": attrs.get(INFERRED_WAITED_SPAN_MS),
        "readings": [f"a client connection limit of {ceiling}", f"a provider that serves {ceiling} at a time"],
    }).evidence()  # fmt: skip
