"""Rule retry-backoff: the tail sleeps between attempts after 429s, 5xx or timeouts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from latprof.analysis.requests import Analysis
from latprof.engine import Finding, Rule, fmt_ms, layer_evidence, owns_tail, severity_for_share
from latprof.layers import RETRY
from latprof.semconv import HTTP_STATUS_CODE, RETRY_AFTER_ERROR, RETRY_AFTER_STATUS, RETRY_LIBRARY

#: The openai hook's name for the client's own backoff sleeps.
_SDK_RETRY_NAMES = ("openai retry",)


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0


def _cause(attrs: dict[str, object]) -> str:
    for key in (RETRY_AFTER_STATUS, HTTP_STATUS_CODE):
        value = attrs.get(key)
        if isinstance(value, int):
            return str(value)
    error = attrs.get(RETRY_AFTER_ERROR)
    return str(error) if error else "unknown"


class RetryBackoff(Rule):
    """The tail sleeps in backoff between attempts: rate limits or failures, not slow calls, make it slow.

    What it detects:
        The `retry` layer (sleeps between a failed attempt - HTTP 429, 5xx, a timeout - and
        the next attempt at the same target: the openai client's own backoff, tenacity,
        backoff, urllib3, and hand-written retry loops) explains a large part of the tail.

    Why it matters for p99:
        A retried request pays the failed attempt, the backoff and the next attempt: with
        exponential backoff, two 429s cost seconds. Only the requests that hit the limit pay,
        so the median looks fine while p99 jumps; dashboards show a slow provider, but the
        time is spent sleeping on the client.

    Evidence:
        retry sleep p50/p99 and its tail excess and share; what the sleeps followed (status
        codes and error types, counted); who slept (the SDK's own retries, a retry library,
        a hand-written loop); retries per tail request; example request ids.

    How to fix:
        For 429s: raise the rate limit (a higher tier, provisioned throughput), spread load
        over deployments or regions, and limit concurrency client-side so requests queue
        briefly instead of failing and sleeping. Honour `retry-after` rather than a long
        fixed backoff, add jitter, cap attempts and total retry time per request, and fail
        over to another deployment instead of sleeping. For 5xx and timeouts: a shorter
        timeout with a hedged second request, and a circuit breaker.

    Example:
        A summarisation API shares one OpenAI key with a batch job. At the top of every
        minute the key hits its TPM limit: 3% of requests get a 429 and back off 2 s, then
        4 s. Retry owns 90% of the tail excess; the provider's own latency did not change.
    """

    id = "retry-backoff"
    layer = RETRY
    Thresholds = Thresholds

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(RETRY)
        if not owns_tail(analysis, stats, min_share=t.min_share_of_tail_excess, min_excess_ms=t.min_tail_excess_ms):
            return
        causes: Counter[str] = Counter()
        sources: Counter[str] = Counter()
        tail = set(analysis.groups.tail)
        tail_retries = 0.0
        for i, segment in analysis.segments(RETRY):
            w = analysis.weight(i)
            attrs = dict(segment.attrs)
            causes[_cause(attrs)] += w
            if segment.name in _SDK_RETRY_NAMES:
                sources["sdk"] += w
            elif attrs.get(RETRY_LIBRARY):
                sources[str(attrs[RETRY_LIBRARY])] += w
            else:
                sources["hand-written loop"] += w
            if i in tail:
                tail_retries += 1
        evidence: dict[str, object] = {**layer_evidence(stats, "retry")}
        evidence["after"] = dict(sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])))
        evidence["retried_by"] = dict(sorted(sources.items(), key=lambda kv: (-kv[1], kv[0])))
        distinct_tail = len(tail) or 1
        evidence["retries_per_tail_request"] = round(tail_retries / distinct_tail, 3)
        evidence["example_request_ids"] = analysis.example_request_ids(RETRY)
        top_cause = next(iter(evidence["after"]), "unknown")  # type: ignore[call-overload]
        what = {"429": "rate limiting (429)"}.get(top_cause, f"failed attempts ({top_cause})")
        summary = (
            f"The slowest 1% of requests slept {fmt_ms(stats.tail_excess_ms)} longer in retry backoff than the median"
            f" request, mostly after {what} (retry sleep p99 {fmt_ms(stats.p99_ms)})."
        )
        if top_cause == "429":
            fix = (
                "Stop hitting the rate limit rather than sleeping on it: raise the limit (a higher tier, provisioned"
                " throughput), spread load across deployments or regions, and cap concurrency client-side so requests"
                " queue briefly instead of failing. Honour retry-after instead of a long fixed backoff, add jitter,"
                " and cap attempts and total retry time per request."
            )
        else:
            fix = (
                "Fail fast and hedge instead of sleeping: a shorter timeout with a hedged second request, a circuit"
                " breaker for a failing dependency, fail-over to another deployment, jittered backoff with a cap on"
                " attempts and total retry time per request."
            )
        yield self.finding(
            severity=severity_for_share(stats.share_of_tail_excess),
            confidence=stats.share_of_tail_excess + (0.2 if causes else 0.0),
            impact_ms=stats.tail_excess_ms,
            summary=summary,
            evidence=evidence,
            fix=fix,
            subject=top_cause,
        )
