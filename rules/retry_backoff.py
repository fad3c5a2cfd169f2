"""Rule retry-backoff: the tail sleeps between attempts after 429s, 5xx or timeouts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from latprof.analysis.inference import INFERRED, INFERRED_CONFIDENCE, Inference
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
from latprof.layers import RETRY
from latprof.semconv import HTTP_STATUS_CODE, RETRY_AFTER_ERROR, RETRY_AFTER_STATUS, RETRY_LIBRARY

if TYPE_CHECKING:
    from latprof.attach.analysis import AttachAnalysis

#: The openai and anthropic hooks' names for the client's own backoff sleeps.
_SDK_RETRY_NAMES = ("openai retry", "anthropic retry")


@dataclass(frozen=True, slots=True)
class Thresholds(WaitThresholds):
    #: Attach captures: a finding when workers wait here for this share of their busy time (or of
    #: their busy time plus the time connections queued for them).
    attach_min_share: float = 0.2


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
        backoff, urllib3, and hand-written retry loops) explains a large part of the tail. Or,
        tail or not, retry sleeps take most of the median request's latency
        (`min_share_of_median_latency`): every request fails and sleeps at least once.

    Why it matters for p99:
        A retried request pays the failed attempt, the backoff and the next attempt: with
        exponential backoff, two 429s cost seconds. Only the requests that hit the limit pay,
        so the median looks fine while p99 jumps; dashboards show a slow provider, but the
        time is spent sleeping on the client.

    Evidence:
        retry sleep p50/p99 and its tail excess and share; what the sleeps followed (status
        codes and error types, counted); who slept (the SDK's own retries, a retry library,
        a hand-written loop); retries per tail request; from stock traces, where no span
        measures the sleep, the backoff inferred from the gap between a failed client span and
        the next span to the same target (`inferred: true`, lower confidence); when the sleeps dominate the median
        request, their time there, that request's latency, the share and p99/p50; example
        request ids.

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

    def judge_samples(self, samples: AttachAnalysis) -> Iterable[Finding]:
        """An attach capture: workers sleep in retry backoff (stack samples)."""
        from latprof.attach.analysis import layer_findings

        return layer_findings(self, samples, RETRY, min_share=self.thresholds.attach_min_share)

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(RETRY)
        owns, dominates, judged_share = judge_wait(analysis, stats, t)
        if not owns and not dominates:
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
        evidence = wait_evidence(analysis, stats, "retry", dominates)
        evidence["after"] = dict(sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])))
        evidence["retried_by"] = dict(sorted(sources.items(), key=lambda kv: (-kv[1], kv[0])))
        distinct_tail = len(tail) or 1
        evidence["retries_per_tail_request"] = round(tail_retries / distinct_tail, 3)
        evidence["example_request_ids"] = analysis.example_request_ids(RETRY)
        inferred = [s for _, s in analysis.segments(RETRY) if s.attrs.get(INFERRED)]
        if inferred:
            evidence.update(Inference.of_segment(inferred[0].attrs, {
                "inferred_share_of_retry_segments": round(len(inferred) / len(analysis.segments(RETRY)), 4),
            }).evidence())  # fmt: skip
        top_cause = next(iter(evidence["after"]), "unknown")  # type: ignore[call-overload]
        what = {"429": "rate limiting (429)"}.get(top_cause, f"failed attempts ({top_cause})")
        summary = (
            f"The slowest 1% of requests slept {fmt_ms(stats.tail_excess_ms)} longer in retry backoff than the median"
            f" request, mostly after {what} (retry sleep p99 {fmt_ms(stats.p99_ms)})."
        )
        if not owns:
            summary = median_summary(analysis, stats, "sleeps in retry backoff") + f", mostly after {what}."
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
        confidence = judged_share + (0.2 if causes else 0.0)
        if inferred:
            summary = "Inferred from the gaps between failed attempts and their retries: " + summary[0].lower() + summary[1:]
            confidence = min(confidence, 1.0) * INFERRED_CONFIDENCE
        yield self.finding(
            severity=severity_for_share(judged_share) if owns else severity_for_median(analysis, stats),
            confidence=confidence,
            impact_ms=stats.tail_excess_ms,
            summary=summary,
            evidence=evidence,
            fix=fix,
            subject=top_cause,
        )
