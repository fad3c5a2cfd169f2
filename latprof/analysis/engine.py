"""A self-hosted engine's own metrics lined up with the LLM calls of the tail and of the median request.

`latprof run/attach/receive --engine-metrics URL` records the engine's gauges once a second
(collectors/scrape/): requests waiting and running, KV-cache use, preemptions, and the deltas of
its per-request histograms (queue, prefill, decode). None of it names a request, so each LLM
call of a cohort is matched by time: the gauges over the call's TTFT, the histograms of the
requests the engine finished in the scrape interval the call ended in. What comes out is an
estimate of the call's time inside the engine (queue, prefill, decode), always marked inferred.

A call belongs to an engine instance when the instance labels a model and the call asked for
it; an instance without a model label takes the calls of its host, or every call when it is
the only instance (`EngineView.matched_by` says which).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from latprof.analysis.genai import model_of
from latprof.collectors.scrape.engines import ENGINES
from latprof.analysis.requests import Analysis
from latprof.analysis.timeline import gauge_instances, time_weighted_mean
from latprof.events import Gauge
from latprof.layers import MODEL, PROVIDER
from latprof.semconv import (
    ENGINE_KIND,
    ENGINE_STAGES,
    GAUGE_ENGINE_FINISHED,
    GAUGE_ENGINE_KV_USAGE,
    GAUGE_ENGINE_PREEMPTIONS,
    GAUGE_ENGINE_RUNNING,
    GAUGE_ENGINE_WAITING,
    GEN_AI_REQUEST_MODEL,
    LLM_CALL_ID,
    NOTE_ENGINE_METRICS,
    SERVER_ADDRESS,
    SERVER_PORT,
    engine_stage_gauges as stage_gauges,
)

NS_PER_S = 1_000_000_000
#: How an engine (`latprof.engine` of its gauges) is named in a sentence: the scraper's tables' titles.
ENGINE_TITLES = {engine.name: engine.title for engine in ENGINES}
#: What the split says it was read from (evidence `inferred_from`).
INFERRED_FROM = (
    "the engine's Prometheus metrics, lined up with the LLM calls by time: its gauges during each call's time to"
    " first token, and its per-request histograms of the requests it finished in the same second as the call"
    " (the engine's metrics name no request)"
)


@dataclass(frozen=True, slots=True)
class Call:
    """One LLM call of an analysed request: its TTFT stretch and its end."""

    request: int
    start_ns: int
    first_token_ns: int
    end_ns: int
    model: str
    server: str


@dataclass
class Instance:
    """One engine instance's series (engine, endpoint, model): readings in time order by gauge name."""

    engine: str
    endpoint: str
    host: str
    model: str
    series: dict[str, list[Gauge]] = field(default_factory=dict)

    def mean_over(self, name: str, start_ns: int, end_ns: int) -> float | None:
        """The time-weighted mean of gauge `name` over [start, end) (the reading holding at start counts)."""
        readings = self.series.get(name)
        if not readings:
            return None
        times = [g.ts_ns for g in readings]
        lo = max(0, bisect.bisect_right(times, start_ns) - 1)
        hi = bisect.bisect_left(times, end_ns)
        window = readings[lo : max(hi, lo + 1)]
        if window[0].ts_ns > end_ns:
            return None  # no reading before the call ended: not known
        return time_weighted_mean(window, start_ns, max(end_ns, start_ns + 1))

    def delta_at(self, name: str, ts_ns: int) -> float | None:
        """The delta recorded by the first scrape at or after `ts_ns` (what happened in the interval it ended)."""
        readings = self.series.get(name)
        if not readings:
            return None
        i = bisect.bisect_left([g.ts_ns for g in readings], ts_ns)
        return readings[i].value if i < len(readings) else None

    def deltas_between(self, name: str, start_ns: int, end_ns: int) -> float:
        """The sum of the deltas of the scrapes that ended in (start, end + one interval]."""
        readings = self.series.get(name, [])
        times = [g.ts_ns for g in readings]
        lo = bisect.bisect_right(times, start_ns)
        hi = bisect.bisect_right(times, end_ns + NS_PER_S)
        return sum(g.value for g in readings[lo:hi])

    def peak_between(self, name: str, start_ns: int, end_ns: int) -> float | None:
        """The largest reading of gauge `name` in [start, end], or the one holding at `start` when none is in it."""
        readings = self.series.get(name)
        if not readings:
            return None
        times = [g.ts_ns for g in readings]
        lo = bisect.bisect_left(times, start_ns)
        hi = bisect.bisect_right(times, end_ns)
        inside = readings[lo:hi] or (readings[lo - 1 : lo] if lo > 0 else [])
        return max(g.value for g in inside) if inside else None

    def at_readings_of(self, name: str, other: str, start_ns: int, end_ns: int, min_other: float) -> float | None:
        """The mean of gauge `name` at the scrapes in [start, end] where gauge `other` read at least
        `min_other` (the reading of `name` holding at each such scrape); None when there is none."""
        readings, others = self.series.get(name), self.series.get(other)
        if not readings or not others:
            return None
        times, other_times = [g.ts_ns for g in readings], [g.ts_ns for g in others]
        lo, hi = bisect.bisect_left(other_times, start_ns), bisect.bisect_right(other_times, end_ns)
        values = []
        for reading in others[lo:hi]:
            at = bisect.bisect_right(times, reading.ts_ns) - 1
            if reading.value >= min_other and at >= 0:
                values.append(readings[at].value)
        return sum(values) / len(values) if values else None

    def peak(self, name: str) -> float | None:
        readings = self.series.get(name)
        return max(g.value for g in readings) if readings else None

    def has(self, name: str) -> bool:
        return bool(self.series.get(name))


@dataclass
class CohortEngine:
    """What the engine did during one cohort's LLM calls (means over the calls; None: not published)."""

    calls: int = 0
    waiting: float | None = None
    #: The mean over the calls of the most requests waiting in the scrapes from a second before the call
    #: to a second after its first token: a queue shorter than the scrape interval still shows.
    waiting_peak: float | None = None
    running: float | None = None
    #: The mean over the calls of the running batch at the scrapes (in the same windows as
    #: `waiting_peak`) in which requests waited: whether the batch was full while they queued.
    running_while_waiting: float | None = None
    kv_cache_usage: float | None = None
    kv_cache_usage_max: float | None = None
    preemptions: float = 0.0
    #: Per stage (`ENGINE_STAGES`), the mean time per request the engine finished with the calls (ms).
    stages_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"calls": self.calls}
        for key in ("waiting", "waiting_peak", "running", "running_while_waiting", "kv_cache_usage", "kv_cache_usage_max"):
            value = getattr(self, key)
            if value is not None:
                out[key] = round(value, 3)
        out["preemptions"] = round(self.preemptions, 3)
        out.update({f"{stage}_ms": round(ms, 3) for stage, ms in self.stages_ms.items()})
        return out


@dataclass
class EngineView:
    """One engine instance against the tail and the median cohorts' LLM calls."""

    instance: Instance
    tail: CohortEngine
    median: CohortEngine
    #: How calls were matched to the instance: "model", "host" or "only engine" (every call).
    matched_by: str
    peak_waiting: float | None
    peak_running: float | None
    peak_kv_cache_usage: float | None
    preemptions_total: float

    @property
    def label(self) -> str:
        """"the vLLM engine at 127.0.0.1:8000 (model m)"."""
        title = ENGINE_TITLES.get(self.instance.engine, self.instance.engine or "inference")
        return f"the {title} engine at {self.instance.endpoint}" + (f" (model {self.instance.model})" if self.instance.model else "")

    def to_dict(self) -> dict[str, Any]:
        """The report's `collection.engines[].split`: the tail's and the median's time inside the engine."""
        return {
            "engine": self.instance.engine, "endpoint": self.instance.endpoint, "model": self.instance.model or None,
            "matched_by": self.matched_by, "tail": self.tail.to_dict(), "median": self.median.to_dict(),
            "peak_waiting": self.peak_waiting, "peak_running": self.peak_running,
            "peak_kv_cache_usage": None if self.peak_kv_cache_usage is None else round(self.peak_kv_cache_usage, 4),
            "preemptions": round(self.preemptions_total, 3), "inferred": True, "inferred_from": INFERRED_FROM,
        }  # fmt: skip


def instances(gauges: Mapping[str, Sequence[Gauge]]) -> list[Instance]:
    """Every engine instance the capture's engine gauges measure, in a stable order."""
    names = [GAUGE_ENGINE_WAITING, GAUGE_ENGINE_RUNNING, GAUGE_ENGINE_KV_USAGE, GAUGE_ENGINE_PREEMPTIONS,
             GAUGE_ENGINE_FINISHED, *(n for stage in ENGINE_STAGES for n in stage_gauges(stage))]  # fmt: skip
    found: dict[tuple[str, str, str], Instance] = {}
    for name in names:
        for series in gauge_instances(gauges.get(name, ())).values():
            attrs = series[0].attrs
            host = str(attrs.get(SERVER_ADDRESS, ""))
            key = (str(attrs.get(ENGINE_KIND, "")), f"{host}:{attrs.get(SERVER_PORT, '')}", str(attrs.get(GEN_AI_REQUEST_MODEL, "")))
            instance = found.get(key)
            if instance is None:
                instance = found[key] = Instance(key[0], key[1], host, key[2])
            instance.series.setdefault(name, []).extend(series)
    for instance in found.values():
        for readings in instance.series.values():
            readings.sort(key=lambda g: g.ts_ns)
    return [found[key] for key in sorted(found)]


def llm_calls(analysis: Analysis, indices: Sequence[int]) -> list[Call]:
    """The LLM calls of the requests at `indices` (each request once): TTFT from its provider segment,
    its end from the call's model segment (the same call id) when there is one."""
    wanted = set(indices)
    decode_end: dict[tuple[int, str], int] = {}
    for i, segment in analysis.segments(MODEL):
        call = segment.attrs.get(LLM_CALL_ID)
        if i in wanted and call:
            key = (i, str(call))
            decode_end[key] = max(decode_end.get(key, 0), segment.end_ns)
    out = []
    for i, segment in analysis.segments(PROVIDER):
        if i not in wanted or segment.end_ns <= segment.start_ns:
            continue
        call = segment.attrs.get(LLM_CALL_ID)
        end = decode_end.get((i, str(call)), segment.end_ns) if call else segment.end_ns
        out.append(Call(i, segment.start_ns, segment.end_ns, max(end, segment.end_ns), model_of(segment),
                        str(segment.attrs.get(SERVER_ADDRESS, ""))))  # fmt: skip
    return out


def _matcher(instance: Instance, every: Sequence[Instance]) -> tuple[str, Any]:
    if instance.model:
        return "model", lambda call: call.model == instance.model or (not call.model and len(every) == 1)
    if instance.host and sum(1 for other in every if other.host == instance.host) == 1:
        hosts = {instance.host, "localhost" if instance.host == "127.0.0.1" else instance.host}
        only = len(every) == 1
        return "host", lambda call: call.server in hosts or (only and not call.server)
    return "only engine", lambda call: len(every) == 1


def cohort_engine(instance: Instance, calls: Sequence[Call]) -> CohortEngine:
    """What `instance` did during `calls` (means over the calls)."""
    out = CohortEngine(calls=len(calls))
    if not calls:
        return out

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known else None

    out.waiting = mean([instance.mean_over(GAUGE_ENGINE_WAITING, c.start_ns, c.first_token_ns) for c in calls])
    out.waiting_peak = mean([instance.peak_between(GAUGE_ENGINE_WAITING, c.start_ns - NS_PER_S, c.first_token_ns + NS_PER_S)
                             for c in calls])  # fmt: skip
    out.running = mean([instance.mean_over(GAUGE_ENGINE_RUNNING, c.start_ns, c.end_ns) for c in calls])
    out.running_while_waiting = mean([instance.at_readings_of(GAUGE_ENGINE_RUNNING, GAUGE_ENGINE_WAITING, c.start_ns - NS_PER_S,
                                                              c.first_token_ns + NS_PER_S, 1)
                                      for c in calls])  # fmt: skip
    kv = [instance.mean_over(GAUGE_ENGINE_KV_USAGE, c.start_ns, c.end_ns) for c in calls]
    out.kv_cache_usage = mean(kv)
    known_kv = [v for v in kv if v is not None]
    out.kv_cache_usage_max = max(known_kv) if known_kv else None
    if instance.has(GAUGE_ENGINE_PREEMPTIONS):
        out.preemptions = sum(instance.deltas_between(GAUGE_ENGINE_PREEMPTIONS, c.start_ns, c.end_ns) for c in calls) / len(calls)
    for stage in ENGINE_STAGES:
        total_name, count_name = stage_gauges(stage)
        if not instance.has(total_name):
            continue
        per_call = []
        for c in calls:
            total, count = instance.delta_at(total_name, c.end_ns), instance.delta_at(count_name, c.end_ns)
            if total is not None and count:
                per_call.append(total / count)
        if per_call:
            out.stages_ms[stage] = sum(per_call) / len(per_call)
    return out


def engine_views(analysis: Analysis) -> list[EngineView]:
    """Each engine instance the capture measured, against the tail and median cohorts' LLM calls it served."""
    found = instances(analysis.timeline.gauges)
    if not found:
        return []
    tail = llm_calls(analysis, analysis.distinct("tail"))
    median = llm_calls(analysis, analysis.distinct("median"))
    out = []
    for instance in found:
        matched_by, matches = _matcher(instance, found)
        preemptions = sum(g.value for g in instance.series.get(GAUGE_ENGINE_PREEMPTIONS, ()))
        out.append(EngineView(
            instance=instance,
            tail=cohort_engine(instance, [c for c in tail if matches(c)]),
            median=cohort_engine(instance, [c for c in median if matches(c)]),
            matched_by=matched_by,
            peak_waiting=instance.peak(GAUGE_ENGINE_WAITING),
            peak_running=instance.peak(GAUGE_ENGINE_RUNNING),
            peak_kv_cache_usage=instance.peak(GAUGE_ENGINE_KV_USAGE),
            preemptions_total=preemptions,
        ))  # fmt: skip
    return out


def collection_engines(analysis: Analysis) -> list[dict[str, Any]]:
    """The report's `collection.engines`: per scraped endpoint, what scraping saw (the capture's
    `engine_metrics` records) and, per engine instance measured, the tail's and the median's time
    inside it (`EngineView.to_dict`, inferred)."""
    out: list[dict[str, Any]] = []
    views = engine_views(analysis)
    for record in analysis.timeline.quality:
        if record.kind == NOTE_ENGINE_METRICS:
            seen = dict(record.attrs)
            seen["split"] = [v.to_dict() for v in views if v.instance.endpoint == seen.get("endpoint")]
            out.append(seen)
    scraped = {str(entry.get("endpoint")) for entry in out}
    for view in views:  # gauges without a record (a capture cut short): still shown
        if view.instance.endpoint not in scraped:
            out.append({"endpoint": view.instance.endpoint, "engine": view.instance.engine, "split": [view.to_dict()]})
            scraped.add(view.instance.endpoint)
    return out


#: The engine stages before the first token: where the provider layer's time goes inside the engine.
TTFT_STAGES = ("queue", "prefill")


def queue_share(view: EngineView) -> float | None:
    """The share of the tail's extra time before the first token inside the engine (queue and prefill,
    tail calls' mean minus the median calls') that is the engine's queue; None when the engine does
    not time its queue or nothing before the first token took longer in the tail."""
    tail, median = view.tail.stages_ms, view.median.stages_ms
    if "queue" not in tail or not view.tail.calls:
        return None
    excess = {stage: tail[stage] - median.get(stage, 0.0) for stage in TTFT_STAGES if stage in tail}
    total = sum(max(0.0, e) for e in excess.values())
    return max(0.0, excess["queue"]) / total if total > 0 else None


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """When an engine's queue is judged to own the provider's tail (rule engine-queueing's thresholds)."""

    min_waiting_requests: float = 1.0
    min_queue_share: float = 0.5
    flat_running_share_of_peak: float = 0.8
    kv_cache_full: float = 0.9


DEFAULT_LIMITS = QueueLimits()


@dataclass(frozen=True, slots=True)
class QueueJudgement:
    """An engine whose queue owns part of the provider layer's tail: how much, and why it queued."""

    impact_ms: float
    queue_share: float | None
    at_cap: bool
    kv_full: bool
    preempted: bool


def judge_queue(view: EngineView, provider_excess_ms: float, limits: QueueLimits = DEFAULT_LIMITS) -> QueueJudgement | None:
    """Whether the engine's queue explains the tail's extra time to first token, and how much of it.

    Requests waited in its queue around the tail's calls (`min_waiting_requests`); where the engine
    times its stages, its queue is most (`min_queue_share`) of the tail's extra time before the first
    token inside it; and the engine was full - its running batch at its cap, its KV cache full, or
    requests preempted - not merely slow to admit. The impact is the provider layer's tail excess
    times that share (the engine's own per-second histograms dilute the excess itself)."""
    tail, median = view.tail, view.median
    if not tail.calls or tail.waiting_peak is None or tail.waiting_peak < limits.min_waiting_requests:
        return None
    share = queue_share(view)
    if "queue" in tail.stages_ms:
        if share is None or share < limits.min_queue_share:
            return None  # the engine queued, but the tail's extra time inside it went to prefill
    elif median.waiting_peak is not None and tail.waiting_peak <= median.waiting_peak:
        return None  # no stage timings, and the queue was no longer for the tail than for the median request
    # The batch was full while requests waited (at the scrapes that saw them waiting; else over the calls):
    # at a scrape a second apart, the mean over a call mostly reads the batch before or after its queue.
    running = tail.running_while_waiting if tail.running_while_waiting is not None else tail.running
    at_cap = (running is not None and view.peak_running is not None and view.peak_running > 0
              and running >= limits.flat_running_share_of_peak * view.peak_running)  # fmt: skip
    kv_full = tail.kv_cache_usage_max is not None and tail.kv_cache_usage_max >= limits.kv_cache_full
    preempted = view.preemptions_total > 0
    if not (at_cap or kv_full or preempted):
        return None  # requests waited while the batch had room: something else held them (e.g. a rate limit)
    return QueueJudgement(provider_excess_ms * (share if share is not None else 1.0), share, at_cap, kv_full, preempted)


def engine_queue_ms(analysis: Analysis, model: str | None = None) -> float:
    """The part of the provider layer's tail excess engines' queues own (`judge_queue`, default
    limits), over the engines serving `model` (every engine when None): what rule provider-floor
    leaves to rule engine-queueing."""
    stats = analysis.layers.get(PROVIDER)
    if stats is None or stats.tail_excess_ms <= 0:
        return 0.0
    total = 0.0
    for view in engine_views(analysis):
        if model is not None and view.instance.model and view.instance.model != model:
            continue
        judged = judge_queue(view, stats.tail_excess_ms)
        if judged is not None:
            total += judged.impact_ms
    return min(total, stats.tail_excess_ms)
