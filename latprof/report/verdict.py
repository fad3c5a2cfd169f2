"""The verdict: which layer owns the latency, decided here for every source (report-v1's verdict rules).

`decide_verdict` is the one entry point. What it weighs depends on what the capture holds:

- **Requests** (`latprof run`, OTLP, Jaeger, Zipkin, `receive`): the layer with the largest
  excess in the slowest 1% over the median request, once there are enough requests and a tail
  worth explaining (`_of_requests`).
- **Stack samples** (`latprof attach`, which sees no requests): the layer that saturates the
  service - a pool or lock the workers wait in, a held event loop, a backlog in front of busy
  workers, the CPU - or null when nothing is saturated (`_of_samples`).

Both end the same way (`_named`): the verdict is measured, never taken from a finding; the
highest-impact finding on its layer (not one that crashed) only names its `rule`; and when that
finding is an inference (`evidence.inferred`), the verdict is no surer than it and says so.
`unattributed` and null verdicts say what would tell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from latprof.analysis.inference import INFERRED_CONFIDENCE, Inference
from latprof.analysis.requests import MIN_REQUESTS_FOR_VERDICT, TAIL_RATIO, Analysis
from latprof.analysis.stall_inference import POSSIBLE_STALL_CONFIDENCE, possible_stall_caveat
from latprof.engine import Finding, fmt_ms
from latprof.semconv import SPLIT_UNKNOWN
from latprof.layers import APP, DB_POOL, EVENT_LOOP, HTTP_POOL, LAYERS, PROVIDER, QUEUE, UNATTRIBUTED

if TYPE_CHECKING:
    from latprof.attach.analysis import AttachAnalysis

#: `Verdict.status` of an attach capture with no verdict: sampling sees no request latency, so
#: it never says "no tail". Nothing was saturated; or every worker was busy doing its job.
NOT_SATURATED = "not_saturated"
AT_CAPACITY = "at_capacity"

#: When the leading layer does not also lead the slowest 5%, its confidence is scaled by this.
NOT_LEADING_TAIL5_FACTOR = 0.5
#: A `provider` verdict whose tail time is mostly in LLM HTTP spans (`latprof.split_unknown`: the
#: span ends at the response headers and is extended to the caller's next step, so waiting for the
#: first token and the model's decode are one block) is believed at most this much: below 0.5,
#: because a long output (`model`) looks exactly the same from these spans.
SPLIT_UNKNOWN_CONFIDENCE = 0.4
#: ... when at least this share of the tail cohort's provider time is in such segments.
MIN_SPLIT_UNKNOWN_SHARE = 0.5

# How the verdict sentence says what the tail did in each layer: "... {phrase} than the median".
_PHRASES = {
    "queue": "queued {x} longer before a worker started on them",
    "event_loop": "waited {x} longer for a blocked event loop",
    "db.pool": "waited {x} longer for a database connection",
    "db.query": "spent {x} longer in database statements",
    "http.pool": "waited {x} longer for a free HTTP connection",
    "provider": "waited {x} longer for the LLM's first token",
    "model": "spent {x} longer generating after the first token",
    "tool": "spent {x} longer in tools and outbound calls",
    "retry": "slept {x} longer in retry backoff",
    "lock": "waited {x} longer on locks",
    "app": "spent {x} longer running the service's own code",
}

# What would see unattributed time, by how the data was collected.
_BLIND_SPOT_HINTS = {
    "run": "it is time outside every hooked library: sample the service's stacks with `latprof attach --pid` while it happens to see where it goes",
    "attach": "from outside the process the cause is not visible: run the service under `latprof run` so in-process hooks time each request",
    "otlp": "it lies in gaps between spans: instrument the calls made there, or record the service with `latprof run`",
    "jaeger": "it lies in gaps between spans: instrument the calls made there, or record the service with `latprof run`",
    "zipkin": "it lies in gaps between spans: instrument the calls made there, or record the service with `latprof run`",
    "receive": "it lies in gaps between spans: instrument the calls made there, or record the service with `latprof run`",
}



@dataclass(frozen=True, slots=True)
class Verdict:
    layer: str | None
    rule: str | None
    share_of_tail_excess: float | None
    confidence: float
    summary: str
    #: Which branch of the verdict rules decided: "layer", "unattributed", "no_tail" or
    #: "too_few_requests" (requests), "not_saturated" or "at_capacity" (attach); all but the
    #: first two have `layer` null.
    status: str = "layer"

    def to_dict(self) -> dict[str, Any]:
        """The report-v1 `verdict` object."""
        return {
            "layer": self.layer,
            "rule": self.rule,
            "share_of_tail_excess": self.share_of_tail_excess,
            "confidence": self.confidence,
            "summary": self.summary,
            "status": self.status,
        }



def decide_verdict(analysis: Analysis | AttachAnalysis, findings: Sequence[Finding]) -> Verdict:
    """The verdict of a request analysis, or of an attach capture's sample analysis, judged with `findings`."""
    if isinstance(analysis, Analysis):
        return _of_requests(analysis, findings)
    return _of_samples(analysis, findings)


def rule_for(layer: str, findings: Sequence[Finding]) -> str | None:
    """The rule of the highest-impact finding on `layer` that did not crash (findings come sorted by impact)."""
    for finding in findings:
        if finding.layer == layer and not finding.crashed:
            return finding.rule
    return None


def _named(layer: str, share: float | None, confidence: float, summary: str, findings: Sequence[Finding]) -> Verdict:
    """A verdict naming `layer`, measured: the rule of its top finding; no surer than that finding
    when it is an inference (no span or hook measured the layer), which the summary then says."""
    rule = rule_for(layer, findings)
    explaining = next((f for f in findings if f.rule == rule and f.layer == layer), None) if rule else None
    inference = Inference.of(explaining.evidence) if explaining is not None else None
    if explaining is not None and inference is not None:
        confidence = min(confidence, explaining.confidence)
        if "inferred" not in summary:
            summary = f"{summary.rstrip('.')} (inferred from {inference.inferred_from}; see the finding)."
    return Verdict(layer, rule, share, round(min(1.0, max(0.0, confidence)), 3), summary, "layer")


def _of_requests(analysis: Analysis, findings: Sequence[Finding]) -> Verdict:
    """Requests (run, traces): the layer that owns the tail, exactly by report-v1's verdict rules.

    - null when fewer than 50 requests, p99 < 2x p50, or the slowest 1% take less than
      `analysis.min_tail_excess_ms` longer than the median request (a fast healthy service's
      tail is noise; the summary still names the layer that dominates typical latency);
    - `unattributed` when it has the largest excess, or when attributed layers explain less
      than half of the tail cohort's excess over the median (the summary names what would
      see it);
    - else the layer with the largest positive excess; its confidence is its share, halved
      when it does not also lead in the slowest 5%.
    `rule` is the id of the highest-impact finding on the verdict layer, or null.
    """
    lat = analysis.latency
    typical = _typical_layer(analysis)
    if lat is None or lat.count < MIN_REQUESTS_FOR_VERDICT:
        count = 0 if lat is None else lat.count
        summary = (
            f"Too few requests for a verdict: {count} analysed, {MIN_REQUESTS_FOR_VERDICT} needed"
            + (f" ({analysis.warmup_skipped} more were warm-up)" if analysis.warmup_skipped else "")
            + (f"; typical latency is dominated by {typical}." if typical else ".")
        )
        return Verdict(None, None, None, 0.0, summary, "too_few_requests")
    if lat.p99_ms < TAIL_RATIO * lat.p50_ms:
        summary = f"No tail worth explaining: p99 {fmt_ms(lat.p99_ms)} is {lat.p99_ms / lat.p50_ms:.1f}x p50 {fmt_ms(lat.p50_ms)}"
        if typical:
            summary += f"; typical latency is dominated by {typical}."
        else:
            summary += "."
        return Verdict(None, None, None, 1.0, summary, "no_tail")
    if analysis.tail_excess_ms < analysis.min_tail_excess_ms:
        summary = (
            f"No tail worth explaining: the slowest 1% of requests took {fmt_ms(max(0.0, analysis.tail_excess_ms))}"
            f" longer than the median request (p99 {fmt_ms(lat.p99_ms)}, p50 {fmt_ms(lat.p50_ms)}), under the"
            f" {fmt_ms(analysis.min_tail_excess_ms)} worth acting on (min_tail_excess_ms)"
        )
        summary += f"; typical latency is dominated by {typical}." if typical else "."
        return Verdict(None, None, None, 1.0, summary, "no_tail")

    stats = [s for s in analysis.layers.values() if s.tail_excess_ms > 0]
    if not stats:  # every layer's excess is <= 0: cannot happen when p99 >= 2x p50, but be safe
        return Verdict(UNATTRIBUTED, None, None, 0.0, "The tail could not be attributed to any layer.", "unattributed")
    top = max(stats, key=lambda s: s.tail_excess_ms)
    total_excess = sum(s.tail_excess_ms for s in analysis.layers.values())
    attributed_excess = total_excess - analysis.layer(UNATTRIBUTED).tail_excess_ms
    unattributed = analysis.layer(UNATTRIBUTED)
    if top.layer == UNATTRIBUTED or (total_excess > 0 and attributed_excess < 0.5 * total_excess):
        hint = _BLIND_SPOT_HINTS.get(analysis.timeline.source_kind, _BLIND_SPOT_HINTS["run"])
        summary = (
            f"The tail is not explained by what was collected: {unattributed.share_of_tail_excess:.0%} of the"
            f" tail excess ({fmt_ms(unattributed.tail_excess_ms)} of {fmt_ms(total_excess)}) is unattributed;"
            f" {hint}."
        )
        # attributed excess can be negative (layers faster in the tail): the confidence stays within [0, 1]
        confidence = min(1.0, max(0.0, 1.0 - attributed_excess / total_excess)) if total_excess > 0 else 0.0
        return Verdict(
            UNATTRIBUTED,
            rule_for(UNATTRIBUTED, findings),
            round(unattributed.share_of_tail_excess, 4),
            round(confidence, 3),
            summary,
            "unattributed",
        )

    leads_tail5 = top.tail5_excess_ms >= max(s.tail5_excess_ms for s in analysis.layers.values())
    confidence = top.share_of_tail_excess * (1.0 if leads_tail5 else NOT_LEADING_TAIL5_FACTOR)
    phrase = _PHRASES.get(top.layer, "spent {x} longer in " + top.layer).format(x=fmt_ms(top.tail_excess_ms))
    summary = (
        f"{top.layer} owns {top.share_of_tail_excess:.0%} of the tail: the slowest 1% of requests"
        f" (p99 {fmt_ms(lat.p99_ms)}, p50 {fmt_ms(lat.p50_ms)}) {phrase} than the median request"
    )
    if not leads_tail5:
        leader = max(analysis.layers.values(), key=lambda s: s.tail5_excess_ms)
        summary += f"; across the slowest 5% {leader.layer} leads instead"
    caveat = possible_stall_caveat(analysis.cohort("tail"), top.layer, analysis.timeline.possible_stalls)
    if caveat is not None:
        confidence = min(confidence, POSSIBLE_STALL_CONFIDENCE)
        summary += f"; but {caveat}"
    if top.layer == PROVIDER and _provider_split_unknown(analysis):
        confidence = min(confidence, SPLIT_UNKNOWN_CONFIDENCE)
        summary += (
            "; but the LLM calls are HTTP spans that end at the response headers, so waiting for the first token"
            " (provider) and decoding a long answer (model) cannot be told apart: a GenAI instrumentation that"
            " records the first token, or `latprof run`, would tell"
        )
    return _named(top.layer, round(top.share_of_tail_excess, 4), confidence, summary + ".", findings)


def _provider_split_unknown(analysis: Analysis) -> bool:
    """True when most of the tail cohort's `provider` time is in segments whose first token and
    decode were not told apart (`latprof.split_unknown`: LLM HTTP client spans)."""
    tail = set(analysis.groups.tail)
    total = unknown = 0
    for i, segment in analysis.segments(PROVIDER):
        if i in tail:
            took = segment.end_ns - segment.start_ns
            total += took
            if segment.attrs.get(SPLIT_UNKNOWN):
                unknown += took
    return total > 0 and unknown >= MIN_SPLIT_UNKNOWN_SHARE * total


def _typical_layer(analysis: Analysis) -> str | None:
    """'provider (610 ms of the median request's 780 ms)': the layer with most median-cohort time."""
    seen = [s for s in analysis.layers.values() if s.median_mean_ms > 0]
    if not seen:
        return None
    top = max(seen, key=lambda s: s.median_mean_ms)
    total = sum(s.median_mean_ms for s in seen)
    return f"{top.layer} ({fmt_ms(top.median_mean_ms)} of the median request's {fmt_ms(total)}, {top.median_mean_ms / total:.0%})"


def _of_asyncio_server(aa: AttachAnalysis, findings: Sequence[Finding], where: str) -> Verdict | None:
    """An asyncio server's verdict (None: decide as for a threaded one): a held loop, a pool the
    census (and pg_stat_activity) points at, requests waiting on nothing visible (unattributed),
    or null. Measured, as the threaded verdict is: the findings name its rule."""
    from latprof.attach import analysis as attach  # it builds reports: imported when it is used

    if aa.loop is None:
        return None
    if attach.loop_held(aa) and attach.loop_delayed_requests(aa):
        summary, _, confidence = attach.loop_statement(aa)
        return _named(EVENT_LOOP, round(aa.share(EVENT_LOOP), 4) if aa.asyncio else None, confidence, summary, findings)
    wire = aa.wire
    if wire is None:  # no census (or a threaded server beside the loop): the stack-based view decides
        return None
    if attach.wire_pool_inferred(aa):
        summary, _, confidence = attach.wire_pool_statement(aa)
        return _named(DB_POOL, round(aa.share(DB_POOL), 4), confidence, summary, findings)
    if attach.wire_http_limit_inferred(aa):
        summary, _, confidence = attach.wire_http_limit_statement(aa)
        return _named(HTTP_POOL, round(aa.share(HTTP_POOL), 4), confidence, summary, findings)
    total = sum(wire.in_flight.values())
    if wire.saturated:
        return Verdict(UNATTRIBUTED, None, round(aa.share(UNATTRIBUTED), 4), 0.0,
                       f"{wire.in_flight_mean:.0f} requests were in flight on average and about {wire.waiting_mean:.0f} of"
                       f" them (waiting {wire.in_flight_age_ms:.0f} ms so far, the median) waited inside the process on nothing visible from outside (not the loop, which was free,"
                       " and no pool the wire shows: no stable ceiling of DB connections carrying statements): an asyncio service's suspended tasks leave no"
                       " stack. Run it under `latprof run` so in-process hooks time each request's pool waits, locks and"
                       f" calls. Request time: {where or 'none sampled'}.", "unattributed")  # fmt: skip
    loop = (f"the event loop was free {1 - (aa.loop.busy_share or 0):.0%} of the time" if not attach.loop_held(aa) else
            f"the event loop's thread was seldom waiting for events, yet requests spent only {aa.share(EVENT_LOOP):.0%}"
            " of their time waiting for it (see event-loop-blocked's finding),")  # fmt: skip
    return Verdict(None, None, None, 1.0 if total else 0.0,
                   f"Not saturated: {loop} and"
                   f" {wire.in_flight_mean:.1f} requests were in flight on average, waiting on the wire"
                   f" ({wire.outstanding_mean():.1f} at outbound endpoints); "
                   + (f"request time went to {where}." if where else "no request was seen in flight.")
                   + " A tail is not visible from outside an asyncio service (a suspended request leaves no stack):"
                   " `latprof run` times each request's layers.",
                   NOT_SATURATED)  # fmt: skip


def _of_samples(aa: AttachAnalysis, findings: Sequence[Finding]) -> Verdict:
    """Stack samples (attach): the layer that saturates the service, or null, or unattributed (report-v1's attach mode).

    A waiting layer (`WAITING`) holding at least `MIN_VERDICT_SHARE` of busy worker time is
    the verdict whether or not every worker was busy: the pool or lock behind it is what is
    saturated (and a backlog in front of workers waiting for it is its doing). Otherwise, when
    the workers are saturated: `queue` when a backlog stood, else `app` when workers mostly ran
    Python, else `unattributed` (the cause is not visible); not saturated: null.
    """
    from latprof.attach import analysis as attach  # it builds reports: imported when it is used

    ranked = sorted(((aa.share(layer), layer) for layer in LAYERS if aa.share(layer) > 0), reverse=True)
    where = ", ".join(f"{layer} {share:.0%}" for share, layer in ranked[:3])  # "": no busy sample at all
    waiting = max(((attach.busy_share(aa, layer), layer) for layer in attach.WAITING), default=(0.0, ""))
    if waiting[0] < attach.MIN_VERDICT_SHARE:  # no pool or lock that sync workers wait in: an asyncio server decides its own way
        decided = _of_asyncio_server(aa, findings, where)
        if decided is not None:
            return decided
    layer = None
    if waiting[0] >= attach.MIN_VERDICT_SHARE:  # workers queue for a pool or a lock: that resource is saturated
        layer = waiting[1]
    elif not aa.saturated:
        summary = (f"Not saturated: workers were idle {aa.idle_share or 0:.0%} of the time and no backlog stood; "
                   + (f"busy time went to {where}." if where else "no worker was seen busy (no load?)."))  # fmt: skip
        tail, said = _of_reconstructed(aa, findings)
        if tail is not None:
            return tail
        return Verdict(None, None, None, 1.0 if ranked else 0.0,
                       f"{summary}{said} Sampling sees no request's latency from its arrival: `latprof run` times each"
                       " request's layers.", NOT_SATURATED)  # fmt: skip
    elif aa.backlog_seconds_share >= attach.MIN_BACKLOG_SECONDS_SHARE and aa.share(QUEUE) >= attach.MIN_VERDICT_SHARE:
        layer = QUEUE  # a backlog that holds a real share of request time; a brief one behind busy CPUs is not the cause
    elif attach.busy_share(aa, APP) >= 0.5:
        layer = APP
    elif aa.busy_s and max(aa.busy_s, key=lambda k: aa.busy_s[k]) != UNATTRIBUTED:
        top = max(aa.busy_s, key=lambda k: aa.busy_s[k])
        return Verdict(None, None, None, 0.5,
                       f"Every worker was busy, mostly in {top} ({attach.busy_share(aa, top):.0%} of busy time), with no backlog"
                       f" and no pool or lock wait: the service is at its capacity doing its job; add workers, or make"
                       f" the handlers async so a worker is not tied up while it waits. Busy time: {where}.",
                       AT_CAPACITY)  # fmt: skip
    if layer is None:
        return Verdict(UNATTRIBUTED, None, round(aa.share(UNATTRIBUTED), 4), 0.0,
                       f"Saturated, but the cause is not visible from outside (busy time: {where or 'none sampled'}); run the service"
                       " under `latprof run` so in-process hooks time each request.", "unattributed")  # fmt: skip
    finding = next((f for f in findings if f.layer == layer and not f.crashed), None)
    summary = f"Saturated: {layer} holds {aa.share(layer):.0%} of busy worker time plus queue time"
    if finding is not None:
        summary = finding.summary.rstrip(".")
    if layer != QUEUE and aa.share(QUEUE) > 0.05:
        summary += f"; requests also queued in the accept backlog meanwhile ({aa.share(QUEUE):.0%}), behind the workers it held"
    confidence = attach.busy_share(aa, layer) if layer in (*attach.WAITING, APP) else aa.share(layer)
    return _named(layer, round(aa.share(layer), 4), confidence, summary + ".", findings)


def _of_reconstructed(aa: AttachAnalysis, findings: Sequence[Finding]) -> tuple[Verdict | None, str]:
    """A service that is not saturated may still have a tail: the requests reconstructed from its
    threaded workers' samples (`latprof.attach.reconstruct`) are judged as requests are. A layer
    that owns their tail is the verdict, inferred (believed `INFERRED_CONFIDENCE` as much) and
    said to be; otherwise (None, what they showed, to add to the summary)."""
    made = aa.reconstructed
    if made is None or not made.get("requests"):
        return None, ""
    how = f"{made['requests']} requests reconstructed from the worker threads' samples at {made['rate_hz']:g} Hz"
    if aa.requests is None:
        return None, (f" The {how} have a tail whose time went where the median request's did: two requests a"
                      " thread served back to back with no sample between them look like one slow one, so it is not"
                      " judged.")  # fmt: skip
    told = _of_requests(aa.requests, findings)
    if told.status == "layer" and told.layer == PROVIDER:  # a stack in an LLM call is TTFT or decoding: either
        return None, (f" The {how} have a tail in their LLM calls: waiting for the first token (provider) or"
                      " decoding (model), which stack samples cannot tell apart; `latprof run` times each.")  # fmt: skip
    if told.status == "layer" and told.layer not in (None, UNATTRIBUTED):
        summary = (f"Not saturated, but the {how} have a tail (the time before a thread picked a request up is not"
                   f" in them): {told.summary}")  # fmt: skip
        if "inferred" not in summary:
            summary = f"{summary.rstrip('.')} (inferred from {made['from']})."
        # the rule's finding was believed less already; a verdict with none is, here
        confidence = round(min(told.confidence, INFERRED_CONFIDENCE * (told.share_of_tail_excess or 0.0)), 3)
        return Verdict(told.layer, told.rule, told.share_of_tail_excess, confidence, summary, "layer"), ""
    return None, f" The {how}: {told.summary[0].lower()}{told.summary[1:]}"
