"""Rule event-loop-blocked: blocking or CPU-heavy work on the asyncio event loop stalls every request in flight."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence, TypeVar

from latprof.analysis.inference import INFERRED, INFERRED_CONFIDENCE, Inference
from latprof.analysis.requests import Analysis, percentile
from latprof.analysis.stall_inference import (
    INFERRED_BLOCKED_BY,
    INFERRED_BLOCKING_REQUEST,
    INFERRED_BLOCKING_SPAN,
    INFERRED_STALL_MS,
    INFERRED_STALLS,
)
from latprof.collectors.attach.stacks import event_loop_thread, own_frame
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
from latprof.events import Frame, Gauge, Segment, StackSample
from latprof.layers import EVENT_LOOP
from latprof.semconv import GAUGE_LOOP_LAG_MS

if TYPE_CHECKING:
    from latprof.attach.analysis import AttachAnalysis

#: A standard-library file: what follows `lib/python3.12/`.
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?/(.+)$")
_Timed = TypeVar("_Timed", Gauge, StackSample)

#: How many of the hottest frames the evidence names.
_HOT_FRAMES = 3


@dataclass(frozen=True, slots=True)
class Thresholds(WaitThresholds):
    #: Loop-lag readings at or above this, at p99, fire the rule even without event_loop segments.
    min_lag_p99_ms: float = 100.0
    #: Attach captures: a finding when the loop is held at least this share of the time...
    attach_min_loop_busy_share: float = 0.5
    #: ...or blocked in intervals of 100 ms or more adding up to this share of the time.
    attach_min_loop_blocked_share: float = 0.1


class EventLoopBlocked(Rule):
    """The asyncio event loop is blocked: requests that are ready to run wait for it in the tail.

    What it detects:
        The `event_loop` layer (time a request was ready to run but the asyncio event loop
        was busy with other work) explains a large part of the tail, or the loop-lag probe
        (`event_loop.lag_ms`, how late a periodic callback ran) shows a p99 lag at or above
        `min_lag_p99_ms` even where no event_loop segments were recorded, or, tail or not,
        event_loop takes most of the median request's latency (`min_share_of_median_latency`):
        every request waits for the loop. With segments the
        impact is the layer's tail excess; from the lag gauge alone it cannot be tied to
        requests, so the finding is a warning with no impact (or `info` when segments were
        recorded and show the stalls do not land on the slow requests). From stock traces, which
        record no loop, the segments are inferred (`latprof.analysis.stall_inference`: the spans
        of other requests all released at once when one request's own code gave the loop back).

    Why it matters for p99:
        One event loop serves every request of the process. A handler that calls a sync SDK,
        a sync database driver, `time.sleep`, or does 300 ms of CPU work (parsing, tokenising,
        rendering) inside `async def` freezes all of them: every request in flight, even ones
        waiting on nothing, is delayed by the whole stall. A rare slow endpoint becomes
        everybody's tail.

    Evidence:
        event_loop p50/p99 and its tail excess and share (when segments were recorded), and
        when it dominates the median request its time there, that request's latency, the share
        and p99/p50; loop
        lag p99 and max from the gauge, how many readings there were and how many reached
        the threshold; when the segments were inferred from traces, `inferred: true`, what from,
        how many stalls, their p50 and longest, and the routes (and layer-less spans) of the
        requests whose own code ran across them, with example ids, at lower confidence;
        when stack samples were captured, the three hottest innermost frames
        of the active samples, as "function (file)" with their share of those samples - on
        the event-loop thread when it can be recognised (asyncio frames on its stack), else
        across all threads; example request ids. Gauges and samples outside the analysed
        requests' time span (before traffic started, warm-up) are left out.

    How to fix:
        Move blocking or CPU-heavy work off the loop: `await asyncio.to_thread(fn, ...)` or
        `loop.run_in_executor(...)` for blocking calls, a `ProcessPoolExecutor` for CPU-bound
        work (the GIL makes threads no help there). Use async drivers and clients
        (asyncpg or psycopg's async connection, httpx.AsyncClient, the SDK's Async* client);
        never call a sync SDK client in an `async def` handler - declare the handler `def`
        so the framework runs it in its thread pool instead. `PYTHONASYNCIODEBUG=1` (slow
        callback warnings) finds the culprit in development.

    Example:
        A FastAPI service streams chat completions with the async OpenAI client, but its
        `async def export()` endpoint renders a PDF synchronously for 500 ms. Whenever a
        dashboard hits /export, every chat request in flight stalls: loop lag p99 is 480 ms,
        and event_loop owns 70% of the tail excess of POST /chat.
    """

    id = "event-loop-blocked"
    layer = EVENT_LOOP
    Thresholds = Thresholds

    def judge_samples(self, samples: AttachAnalysis) -> Iterable[Finding]:
        """An attach capture: the event loop among the workers was held (wait channels and stack samples)."""
        from latprof.attach.analysis import loop_findings

        t: Thresholds = self.thresholds
        return loop_findings(self, samples, min_busy_share=t.attach_min_loop_busy_share,
                             min_blocked_share=t.attach_min_loop_blocked_share)

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(EVENT_LOOP)
        owns, dominates, judged_share = judge_wait(analysis, stats, t)
        lag = sorted(g.value for g in _in_traffic(analysis, analysis.timeline.gauges.get(GAUGE_LOOP_LAG_MS, ())))
        lag_p99 = percentile(lag, 99) if lag else 0.0
        lagging = bool(lag) and lag_p99 >= t.min_lag_p99_ms
        if not owns and not dominates and not lagging:
            return

        evidence = wait_evidence(analysis, stats, "event_loop", dominates) if stats.seen else {}
        if lag:
            evidence.update(
                lag_p99_ms=round(lag_p99, 3),
                lag_max_ms=round(lag[-1], 3),
                lag_readings=len(lag),
                lag_readings_over_threshold=sum(1 for v in lag if v >= t.min_lag_p99_ms),
                lag_threshold_ms=t.min_lag_p99_ms,
            )
        hot, scope = _hot_frames(_in_traffic(analysis, analysis.timeline.samples))
        if hot:
            evidence["hot_frames"] = hot
            evidence["hot_frames_scope"] = scope
        if stats.seen:
            evidence["example_request_ids"] = analysis.example_request_ids(EVENT_LOOP, with_time_only=True)
        inferred = [s for _, s in analysis.segments(EVENT_LOOP) if s.attrs.get(INFERRED)] if stats.seen else []
        blocker: tuple[str, int, int] | None = None
        if inferred:
            details, blocker = _stalls(inferred, len(analysis.segments(EVENT_LOOP)))
            evidence.update(Inference.of_segment(inferred[0].attrs, details).evidence())

        if owns:
            summary = (
                f"The slowest 1% of requests waited {fmt_ms(stats.tail_excess_ms)} longer than the median request"
                f" for a blocked event loop (event_loop p99 {fmt_ms(stats.p99_ms)}"
                + (f", loop lag p99 {fmt_ms(lag_p99)}" if lag else "")
                + ")"
            )
            severity = severity_for_share(stats.share_of_tail_excess)
            confidence = stats.share_of_tail_excess + (0.2 if lagging else 0.0) + (0.1 if hot else 0.0)
        elif dominates:
            summary = median_summary(analysis, stats, "waits for a blocked event loop") + (
                f" (loop lag p99 {fmt_ms(lag_p99)})" if lag else ""
            )
            severity = severity_for_median(analysis, stats)
            confidence = judged_share + (0.2 if lagging else 0.0) + (0.1 if hot else 0.0)
        else:
            over = evidence["lag_readings_over_threshold"]
            summary = (
                f"The event loop was blocked: loop lag p99 {fmt_ms(lag_p99)}, max {fmt_ms(lag[-1])}"
                f" ({over} of {len(lag)} readings at or over {fmt_ms(t.min_lag_p99_ms)})"
            )
            if stats.seen:
                # Segments were recorded and say the stalls are not what makes the tail slow.
                summary += f", but event_loop explains only {fmt_ms(max(0.0, stats.tail_excess_ms))} of the tail"
                severity, confidence = "info", 0.3
            else:
                summary += "; no event_loop segments were recorded to tie the stalls to requests"
                severity, confidence = "warning", 0.5
        if hot:
            where = "on the loop" if scope == "event-loop thread" else "active frame"
            summary += f"; hottest {where}: {hot[0]['frame']} ({hot[0]['share']:.0%} of samples)"
        if blocker is not None:
            what, held, stalls = blocker
            summary = (
                "Inferred from other requests' spans all ending at once after stalls: " + summary[0].lower() + summary[1:]
                + f"; the loop was held by {what} in {held} of {stalls} stalls"
            )  # fmt: skip
            confidence = min(confidence, 1.0) * INFERRED_CONFIDENCE

        yield self.finding(
            severity=severity,
            confidence=confidence,
            impact_ms=max(0.0, stats.tail_excess_ms),
            summary=summary + ".",
            evidence=evidence,
            fix=_fix(hot) if blocker is None else _fix_blocking_call(blocker[0]),
            # One loop problem per service; the blocking frame is evidence, not identity, since a
            # capture without stack samples must fingerprint the same as one with them.
            subject="",
        )


def _in_traffic(analysis: Analysis, events: Iterable[_Timed]) -> list[_Timed]:
    """The events recorded while each process served analysed requests (not before, not in warm-up).

    Per process, the span runs from its first analysed arrival to its last response; events of a
    process with no analysed requests use the span of all of them; with no requests at all
    (attach mode) every event is kept.
    """
    events = list(events)
    if not analysis.requests or not events:  # (no events: the requests need not be read)
        return events
    spans: dict[int, tuple[int, int]] = {}
    for start, end, pid, _ in analysis.arrivals:
        lo, hi = spans.get(pid, (start, end))
        spans[pid] = (min(lo, start), max(hi, end))
    everywhere = (min(lo for lo, _ in spans.values()), max(hi for _, hi in spans.values()))
    out: list[_Timed] = []
    for event in events:
        lo, hi = spans.get(event.pid, everywhere)
        if lo <= event.ts_ns <= hi:
            out.append(event)
    return out


def _hot_frames(samples: Iterable[StackSample]) -> tuple[list[dict[str, object]], str]:
    """The hottest innermost frames of the active samples, on the event-loop threads if recognisable.

    Returns ([{"frame": "function (file)", "share": 0.42}, ...], scope) with at most `_HOT_FRAMES`
    entries; share is of the active samples in scope, weighted by each sample's `weight`.
    """
    samples = [s for s in samples if s.frames]
    loop_threads = {(s.pid, s.tid) for s in samples if event_loop_thread(s.frames)}  # as attach and top tell them
    active = [s for s in samples if s.active]
    scope = "event-loop thread"
    on_loop = [s for s in active if (s.pid, s.tid) in loop_threads]
    if not on_loop:
        on_loop, scope = active, "all threads"
    counts: Counter[str] = Counter()
    where: dict[str, Frame] = {}
    for sample in on_loop:
        label = _label(sample.frames[0])
        counts[label] += sample.weight
        where.setdefault(label, _app_frame(sample.frames))
    total = sum(counts.values())
    if not total:
        return [], scope
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:_HOT_FRAMES]
    # `location`: the innermost frame of the service's own code under it, for annotations and SARIF (`latprof check`)
    return [{"frame": label, "share": round(n / total, 4),
             "location": {"path": where[label].filename, "line": where[label].line or None, "function": where[label].function}}
            for label, n in ranked], scope  # fmt: skip


def _app_frame(frames: Sequence[Frame]) -> Frame:
    """The service's own frame (`stacks.own_frame`, as attach names it), or the innermost one if none is."""
    return own_frame(frames) or frames[0]


def _label(frame: Frame) -> str:
    """'function (file)': the module path for libraries and the stdlib, the last two parts otherwise."""
    path = frame.filename.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return f"{frame.function} ({path.rsplit(marker, 1)[1]})"
    stdlib = _STDLIB.search(path)
    if stdlib:
        return f"{frame.function} ({stdlib.group(1)})"
    return f"{frame.function} ({'/'.join(path.split('/')[-2:])})"


def _stalls(inferred: Sequence[Segment], total: int) -> tuple[dict[str, object], tuple[str, int, int]]:
    """The evidence of stalls inferred from traces - how many, how long, what held the loop - and
    (what held it in words, in how many of the stalls, of how many): the route of the requests whose
    own code ran across most stalls, with the layer-less span it ran in when it had one
    (`GET /export` (span `render_pdf`))."""
    stalls: dict[tuple[object, object], Segment] = {}
    for s in inferred:  # every segment of one stall carries its numbers: one per stall
        stalls.setdefault((s.attrs.get(INFERRED_BLOCKING_REQUEST), s.attrs.get(INFERRED_STALL_MS)), s)
    lengths = sorted(float(s.attrs.get(INFERRED_STALL_MS) or 0.0) for s in stalls.values())
    routes: Counter[str] = Counter(str(s.attrs.get(INFERRED_BLOCKED_BY) or "?") for s in stalls.values())
    spans: Counter[str] = Counter(str(s.attrs[INFERRED_BLOCKING_SPAN]) for s in stalls.values()
                                  if s.attrs.get(INFERRED_BLOCKING_SPAN))  # fmt: skip
    details: dict[str, object] = {
        "inferred_share_of_event_loop_segments": round(len(inferred) / total, 4) if total else 0.0,
        "stalls": len(stalls),
        "proving_stalls": max(int(s.attrs.get(INFERRED_STALLS) or 0) for s in stalls.values()),
        "stall_p50_ms": round(percentile(lengths, 50), 3),
        "stall_max_ms": round(lengths[-1], 3),
        "blocked_by": dict(routes.most_common()),
        "example_blocking_request_ids": [str(s.attrs.get(INFERRED_BLOCKING_REQUEST)) for s in list(stalls.values())[:3]],
    }
    if spans:
        details["blocking_spans"] = dict(spans.most_common())
    (route, held), span = routes.most_common(1)[0], (spans.most_common(1)[0][0] if spans else None)
    return details, (f"`{route}`" + (f" (span `{span}`)" if span else ""), held, len(stalls))


def _fix_blocking_call(blocker: str) -> str:
    return (
        f"Move the blocking call in {blocker} off the event loop - it runs there with no span open while every"
        " other request waits: `await asyncio.to_thread(...)` / `loop.run_in_executor(...)` for a blocking call, a"
        " process pool for CPU-bound work, or an async driver or client instead of a sync one (asyncpg or psycopg"
        " async, redis.asyncio, httpx.AsyncClient, the SDK's Async client); or make the handler a plain `def` so"
        " the framework runs it in its thread pool. `PYTHONASYNCIODEBUG=1` names the slow callback in development."
    )


def _fix(hot: list[dict[str, object]]) -> str:
    what = hot[0]["frame"] if hot else "blocking or CPU-heavy work"
    first = f"Move {what} off the event loop: "
    return (
        first + "`await asyncio.to_thread(...)` / `loop.run_in_executor(...)` for blocking calls, a process pool"
        " for CPU-bound work. Use async drivers and clients (asyncpg or psycopg async, httpx.AsyncClient, the"
        " SDK's Async client) and never call a sync SDK client inside an `async def` handler - make such a"
        " handler a plain `def` so the framework runs it in its thread pool."
    )
