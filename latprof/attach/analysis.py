"""An attach capture (stack samples, wait channels, /proc gauges) to a report, per report-v1's attach mode.

Sampling from outside sees no requests, so:

- **Worker threads** are the threads that serve requests: a thread seen in a serving frame
  (gunicorn's `handle_request`, a thread pool's `_WorkItem.run`, anyio's worker) or waiting
  for the next request (`latprof.collectors.attach.stacks` idle signatures of workers). When none is recognised
  (an unknown server), every thread with busy samples counts. Other threads (a pool's
  housekeeping, the master) are left out of every share.
- **Busy time** per layer is a worker's busy samples divided by the rate (thread-seconds);
  **idle** samples of workers make `collection.idle_share`.
- **Queue time** is estimated from the accept backlog (Little's law): the mean backlog over
  the capture times its length is the time connections spent waiting, on no thread; the mean
  wait per connection is the mean backlog divided by the accept rate.
- **Shares** are each layer's time over busy time plus queue time (`share_of_tail_excess`
  carries it; `p50_ms`/`p99_ms` are null, `tail_excess_ms` is the layer's seconds per second
  of capture, in ms).
- **Verdict** (`latprof.report.verdict`, for every source): a pool or a lock workers wait in for at least
  `MIN_VERDICT_SHARE` of their busy time is saturated itself, and named. Otherwise the workers
  are **saturated** when idle less than `MAX_IDLE_SHARE` of their samples, or when a backlog
  stood in at least `MIN_BACKLOG_SECONDS_SHARE` of the seconds: then `queue` (a backlog holding at
  least `MIN_VERDICT_SHARE` of busy plus queue time), or
  `app` (workers mostly running Python), or `unattributed` (the cause is not visible from
  outside). Workers waiting on the provider or on tools are doing their job: reported, never
  blamed. Not saturated: no verdict, and the summary says where busy time goes. The verdict is
  measured; the findings only name its rule.
- **Findings** come from the rules (`latprof.engine.Rule.judge_samples`, run by
  `latprof.engine.run_rules` with the config's thresholds): this module gives them what the
  samples say of a layer (`layer_findings`), of a held loop (`loop_findings`) and of a pool the
  socket census infers (`wire_pool_findings`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from latprof.analysis.inference import INFERRED_CONFIDENCE, Inference
from latprof.analysis.requests import Analysis, analyze
from latprof.attach.reconstruct import GAUGE_CUT, INFERRED_FROM_SAMPLES, RECONSTRUCTED, SERVING_FRAMES, THREAD_ID
from latprof.engine import Finding, Rule, run_rules
from latprof.events import StackSample
from latprof.attach.wire import (
    HELD_MS,
    LOOP_BLOCKED_SHARE,
    LOOP_SATURATED_SHARE,
    Backends,
    LoopState,
    WireState,
    backends,
    loop_state,
    wire_state,
)
from latprof.layers import APP, DB_POOL, EVENT_LOOP, HTTP_POOL, LAYERS, LOCK, QUEUE, RETRY, UNATTRIBUTED
from latprof.report.model import LayerRow, Report, WindowRow, overhead_of, overhead_parts
from latprof.report.verdict import decide_verdict
from latprof.collectors.attach.stacks import (
    BUSY, IDLE, LOOP_FRAMES, Classification, classify_sample, event_loop_thread, has_frame, own_frame,
)
from latprof.analysis.timeline import Timeline
from latprof.semconv import NOTE_ENGINE_METRICS

#: What an inferred pool on an asyncio server is inferred from (`evidence.inferred_from`).
SOURCE_CENSUS = "the socket census (a stable ceiling of connections to the database while requests waited)"
SOURCE_CENSUS_HTTP = "the socket census (a stable ceiling of busy connections to one HTTP endpoint while requests waited)"
#: Workers idle less than this share of their samples are all busy.
MAX_IDLE_SHARE = 0.1
#: A backlog in at least this share of the seconds is a queue in front of the workers.
MIN_BACKLOG_SECONDS_SHARE = 0.3
#: The verdict layer holds at least this share of busy plus queue time.
MIN_VERDICT_SHARE = 0.2
#: Workers whose first window begins within this many seconds of the first sample were there from the start.
STARTUP_S = 2

#: A frame of a thread pool's task: a helper thread, when not also a server's worker.
TASK_FRAME = ("concurrent/futures/thread.py", "run")  # _WorkItem.run
#: Idle signatures of request workers (other idle threads are housekeeping); a thread pool's idle
#: thread counts only when the pool serves requests (gthread).
WORKER_IDLE = frozenset({"gunicorn.sync_idle", "executor.idle", "anyio.worker_idle"})
#: A worker waiting for work it handed to other threads: its time is theirs (they are sampled too).
HANDOFF = frozenset({"future.result", "future.wait"})
#: Event loops of a server's own housekeeping (not serving requests).
HOUSEKEEPING_LOOPS = (("gunicorn/ctl/server.py", "_run_loop"),)
#: How an event loop thread waits for events (stock asyncio's selector, uvloop's native epoll).
LOOP_IDLE = frozenset({"asyncio.select", "wchan.epoll"})


@dataclass
class AttachAnalysis:
    timeline: Timeline
    rate_hz: float
    seconds: float
    workers: int
    busy_s: dict[str, float]  # thread-seconds per layer (UNATTRIBUTED for unknown waits)
    idle_s: float
    queue_s: float
    signatures: dict[str, Counter[str]]  # layer -> signature -> samples
    hot_frames: dict[str, Counter[str]]  # layer -> innermost app frame -> samples
    backlog: dict[str, float] = field(default_factory=dict)
    connections: dict[str, int] = field(default_factory=dict)
    saturated: bool = False
    backlog_seconds_share: float = 0.0
    #: per second of the capture: busy workers, their top layer, accept queue, accepted connections
    seconds_rows: list[dict[str, Any]] = field(default_factory=list)
    #: event loop threads among the workers (an asyncio server), their state, the socket census,
    #: the database's view of the target's backends (`latprof.attach.wire`)
    loop: LoopState | None = None
    wire: WireState | None = None
    backends: Backends | None = None
    #: what held the loop: the classification of its busy samples (layer, or signature when none)
    held_by: Counter[str] = field(default_factory=Counter)
    #: the requests reconstructed from worker threads' samples in order (`latprof.attach.reconstruct`),
    #: analysed as requests are; None when there were none to analyse
    requests: Analysis | None = None
    #: how they were made, for the report (`collection.reconstructed`)
    reconstructed: dict[str, Any] | None = None

    @property
    def asyncio(self) -> bool:
        """An asyncio server seen by its socket census: its layers are request time on the wire."""
        return self.loop is not None and self.wire is not None

    def _time(self, layer: str) -> float:
        if self.asyncio:
            assert self.wire is not None
            return self.wire.request_s.get(layer, 0.0)
        return self.queue_s if layer == QUEUE else self.busy_s.get(layer, 0.0)

    @property
    def total_s(self) -> float:
        if self.asyncio:
            assert self.wire is not None
            return sum(self.wire.request_s.values())
        return sum(self.busy_s.values()) + self.queue_s

    def share(self, layer: str) -> float:
        total = self.total_s
        return self._time(layer) / total if total > 0 else 0.0

    @property
    def idle_share(self) -> float | None:
        seen = sum(self.busy_s.values()) + self.idle_s
        return self.idle_s / seen if seen > 0 else None


def _serving(frames: Iterable[Any]) -> bool:
    return has_frame(frames, SERVING_FRAMES)


def _app_frame(sample: StackSample) -> str:
    """Where the service's own code was (`stacks.own_frame`), as "function (file)"; the innermost frame when none is."""
    frame = own_frame(sample.frames) or (sample.frames[0] if sample.frames else None)
    return f"{frame.function} ({frame.filename})" if frame is not None else "?"


def analyze_attach(timeline: Timeline) -> AttachAnalysis:
    header = next((h for h in timeline.headers if h.get("source") == "attach"), {})
    rate = float(header.get("rate_hz") or 100)
    samples = timeline.samples
    by_thread: dict[tuple[int, int], list[tuple[StackSample, Classification]]] = {}
    for s in samples:
        by_thread.setdefault((s.pid, s.tid), []).append((s, classify_sample(s)))
    # The server's workers: seen serving a request, or idle the way a server's worker waits.
    workers = {
        key for key, seen in by_thread.items()
        if any((c.state == BUSY and _serving(s.frames)) or c.signature in ("gunicorn.sync_idle", "anyio.worker_idle")
               for s, c in seen)
    }  # fmt: skip
    # Helpers: threads of a pool the workers hand tasks to (a fan-out); their busy time counts,
    # their idle time does not.
    helpers = {
        key for key, seen in by_thread.items()
        if key not in workers and any(c.state == BUSY and has_frame(s.frames, (TASK_FRAME,)) for s, c in seen)
    }  # fmt: skip
    # Event loop threads serve requests too (an asyncio server), busy or not; what runs on them holds the loop.
    loops = {
        key for key, seen in by_thread.items()
        if any(event_loop_thread(s.frames) for s, _ in seen) and not any(has_frame(s.frames, HOUSEKEEPING_LOOPS) for s, _ in seen)
    }  # fmt: skip
    workers |= loops
    if not workers:  # an unknown server: every thread that worked
        workers = {key for key, seen in by_thread.items() if any(c.state == BUSY for _, c in seen)} - helpers
    busy: Counter[str] = Counter()
    idle = 0
    signatures: dict[str, Counter[str]] = {}
    hot: dict[str, Counter[str]] = {}
    second_busy: dict[int, Counter[tuple[int, int]]] = {}  # second -> worker -> busy samples
    second_seen: dict[tuple[int, int], Counter[int]] = {}  # worker -> second -> samples (busy or idle)
    second_layers: dict[int, Counter[str]] = {}
    held_by: Counter[str] = Counter()
    for key in workers | helpers:
        helper = key in helpers
        loop = key in loops
        for s, c in by_thread[key]:
            if not helper:
                second_seen.setdefault(key, Counter())[s.ts_ns // 1_000_000_000] += s.weight
            if c.state == IDLE:
                if not helper and (c.signature in WORKER_IDLE or (loop and c.signature in LOOP_IDLE)):
                    idle += s.weight
                continue
            if c.signature in HANDOFF:  # waiting for a task another sampled thread runs
                continue
            layer = c.layer or UNATTRIBUTED
            if loop:  # whatever runs on the loop's thread holds the loop: every other request waits
                held_by[c.layer or c.signature] += s.weight
                layer = EVENT_LOOP
            busy[layer] += s.weight
            signatures.setdefault(layer, Counter())[c.signature] += s.weight
            hot.setdefault(layer, Counter())[_app_frame(s)] += s.weight
            second = s.ts_ns // 1_000_000_000
            second_layers.setdefault(second, Counter())[layer] += s.weight
            if not helper:
                second_busy.setdefault(second, Counter())[key] += s.weight
    starts = [s.ts_ns for s in samples]
    seconds = max(1.0, (max(starts) - min(starts)) / 1e9 + 1.0) if starts else 0.0

    depth = [g.value for g in timeline.gauges.get("accept.queue_depth", ())]
    accepted = [g.value for g in timeline.gauges.get("accept.rate", ())]
    mean_backlog = sum(depth) / len(depth) if depth else 0.0
    queue_s = mean_backlog * seconds
    backlog: dict[str, float] = {}
    if depth:
        backlog = {"mean_accept_queue": round(mean_backlog, 3), "peak_accept_queue": max(depth)}
        rate_accept = sum(accepted) / len(accepted) if accepted else 0.0
        backlog["accept_rate_per_s"] = round(rate_accept, 2)
        if rate_accept > 0:
            backlog["mean_backlog_wait_ms"] = round(mean_backlog / rate_accept * 1000, 1)
    backlog_seconds = {g.ts_ns // 1_000_000_000 for g in timeline.gauges.get("accept.queue_depth", ()) if g.value > 0}
    all_seconds = {g.ts_ns // 1_000_000_000 for g in timeline.gauges.get("accept.queue_depth", ())}
    connections: dict[str, int] = {}
    for g in timeline.gauges.get("connections.established", ()):
        where = f"{g.attrs.get('server.address')}:{g.attrs.get('server.port')}"
        connections[where] = max(connections.get(where, 0), int(g.value))

    aa = AttachAnalysis(
        timeline, rate, seconds, len(workers), {k: v / rate for k, v in busy.items()}, idle / rate, queue_s,
        signatures, hot, backlog, connections,
    )  # fmt: skip
    aa.backlog_seconds_share = len(backlog_seconds) / len(all_seconds) if all_seconds else 0.0
    aa.held_by = held_by
    if loops:
        aa.loop = loop_state(timeline, len(loops), seconds)
        # a threaded server beside the loop (sync endpoints in worker threads) keeps the stack-based view
        threaded = any(c.state == BUSY for key in workers - loops for _, c in by_thread[key])
        aa.wire = None if threaded else wire_state(timeline, aa.loop)
    aa.backends = backends(timeline)
    queue_by_second: dict[int, list[float]] = {}
    for g in timeline.gauges.get("accept.queue_depth", ()):
        queue_by_second.setdefault(g.ts_ns // 1_000_000_000, []).append(g.value)
    accepted_by_second: dict[int, float] = {}
    for g in timeline.gauges.get("accept.rate", ()):
        second = g.ts_ns // 1_000_000_000
        accepted_by_second[second] = accepted_by_second.get(second, 0.0) + g.value
    # A process's windows are about 1.2 s apart: a second in which a worker's process began no
    # window is covered by its previous window, whose state carries over.
    busy_in: dict[tuple[int, int], dict[int, bool]] = {}
    final = max(second_layers, default=0)
    for key, seen in second_seen.items():
        state: dict[int, bool] = {}
        last: bool | None = None
        last_second = 0
        for second in range(min(seen), final + 1):
            if seen.get(second):
                last, last_second = second_busy.get(second, Counter())[key] >= seen[second] / 2, second
            if last is not None and second - last_second <= 1:  # a window covers about the next second too
                state[second] = last
        busy_in[key] = state
    # py-spy starts one recorder per process, so on a loaded machine a worker's first window can
    # begin a second after the others': until every worker there at the start has been sampled,
    # the number of busy workers is unknown (None), not a count of those seen so far.
    firsts = [min(seen) for seen in second_seen.values() if seen]
    counted_from = max((f for f in firsts if f <= min(firsts) + STARTUP_S), default=0) if firsts else 0
    for second in sorted(second_layers):  # the seconds sampled
        layers_now = second_layers.get(second, Counter())
        depth_now = queue_by_second.get(second)
        aa.seconds_rows.append({
            "second": second,
            # a worker is busy in a second when at least half of its samples then were busy
            "busy_workers": sum(1 for state in busy_in.values() if state.get(second)) if second >= counted_from else None,
            "top_layer": layers_now.most_common(1)[0][0] if layers_now else None,
            "accept_queue": round(sum(depth_now) / len(depth_now), 2) if depth_now else None,
            "accepted": accepted_by_second.get(second),
        })  # fmt: skip
    idle_share = aa.idle_share
    aa.saturated = bool(
        (idle_share is not None and idle_share < MAX_IDLE_SHARE and sum(busy.values()) > 0)
        or aa.backlog_seconds_share >= MIN_BACKLOG_SECONDS_SHARE
    )
    _reconstructed(aa, {key: _idle_share(by_thread[key]) for key in workers - loops})
    return aa


#: A worker thread seen idle less than this share of its samples may have served requests back
#: to back, which its samples cannot tell apart: its reconstructed requests are left out.
MIN_THREAD_IDLE_SHARE = 0.05


def _idle_share(seen: list[tuple[StackSample, Classification]]) -> float:
    idle = sum(s.weight for s, c in seen if c.state == IDLE and c.signature in WORKER_IDLE)
    total = sum(s.weight for s, c in seen if c.state == BUSY or c.signature in WORKER_IDLE)
    return idle / total if total else 0.0


#: The slowest reconstructed requests must spend their time differently from the median ones by
#: at least this much (total variation distance between the two cohorts' layer mixes) for their
#: tail to be believed: two requests a thread served back to back, with no sample between them,
#: are one run, twice as long as either and with the same mix as the median's.
MIN_TAIL_MIX_DISTANCE = 0.3


def _mix(analysis: Analysis, mean: str) -> dict[str, float]:
    """Each layer's share of the requests' time: of all of them (`mean_ms`), of the median cohort
    (`median_mean_ms`) or of the tail (`tail_mean_ms`), from the analysis's layer statistics."""
    means = {name: getattr(stats, mean) for name, stats in analysis.layers.items() if getattr(stats, mean) > 0}
    whole = sum(means.values())
    return {layer: ms / whole for layer, ms in means.items()} if whole > 0 else {}


def _reconstructed(aa: AttachAnalysis, idle_by_thread: dict[tuple[int, int], float]) -> None:
    """Analyse the requests reconstructed from the threaded workers' samples, as requests are
    (no warm-up: the service ran before the attach); those of a thread never seen idle are left
    out. Their tail is believed (`aa.requests` set, for the rules and the verdict) only when its
    layer mix differs from the median's (`MIN_TAIL_MIX_DISTANCE`)."""
    made = [rt for rt in aa.timeline.requests if RECONSTRUCTED in rt.request.attrs]
    if not made:
        return
    kept, left_out = [], set()
    for rt in made:
        key = (rt.request.pid, int(rt.request.attrs.get(THREAD_ID, 0)))
        if idle_by_thread.get(key, 0.0) >= MIN_THREAD_IDLE_SHARE:
            kept.append(rt)
        else:
            left_out.add(key)
    rates = sorted(float(rt.request.attrs[RECONSTRUCTED]) for rt in made)
    cut = sum(int(g.value) for g in aa.timeline.gauges.get(GAUGE_CUT, ()))
    evidence: dict[str, Any] = {
        "requests": len(kept),
        "rate_hz": rates[len(rates) // 2],
        "cut_by_a_recording": cut,
        "threads_left_out": len(left_out),
        "from": INFERRED_FROM_SAMPLES,
    }
    aa.reconstructed = evidence
    if not kept:
        return
    sub = Timeline(aa.timeline.source_kind, aa.timeline.inputs, kept, headers=aa.timeline.headers)
    analysis = analyze(sub, warmup_s=0.0)
    evidence["layers"] = {k: round(v, 4) for k, v in sorted(_mix(analysis, "mean_ms").items(), key=lambda kv: -kv[1])}
    if analysis.latency is not None:
        evidence["latency_ms"] = analysis.latency.to_dict()
    if not analysis.has_tail:
        evidence["tail"] = "none"
        aa.requests = analysis
        return
    tail, median = _mix(analysis, "tail_mean_ms"), _mix(analysis, "median_mean_ms")
    distance = 0.5 * sum(abs(tail.get(k, 0.0) - median.get(k, 0.0)) for k in set(tail) | set(median))
    evidence["tail_mix_distance"] = round(distance, 3)
    if distance < MIN_TAIL_MIX_DISTANCE:
        evidence["tail"] = "like the median (perhaps requests served back to back): not judged"
        return
    evidence["tail"] = "judged"
    aa.requests = analysis


def judge(aa: AttachAnalysis, rules: Sequence[Rule]) -> list[Finding]:
    """The rules on an attach capture: on its samples, then on the requests reconstructed from
    them (`judge_samples`, then `check`); a request rule's finding is kept when no sample rule
    of the same id found one, marked inferred and believed `INFERRED_CONFIDENCE` as much."""
    found = run_rules(aa, rules)
    if aa.requests is None or aa.reconstructed is None:
        return found
    seen = {f.rule for f in found}
    inference = Inference(INFERRED_FROM_SAMPLES, {"sampled_at_hz": aa.reconstructed["rate_hz"]})
    for f in run_rules(aa.requests, rules):
        if f.rule in seen or f.crashed:
            continue
        found.append(dataclasses.replace(f, confidence=round(f.confidence * INFERRED_CONFIDENCE, 3),
                                         evidence={**f.evidence, **inference.evidence()}))  # fmt: skip
    found.sort(key=lambda f: (-f.impact_ms, f.rule, f.fingerprint))
    return found


def fix_of(rule: Rule) -> str:
    """A rule's "How to fix" section on one line: the fix of its attach findings."""
    return " ".join(type(rule).docs().get("How to fix", "").split())


def _per_second_ms(aa: AttachAnalysis, layer: str) -> float:
    """The layer's time per second of the capture, in ms (busy worker threads in it, or waiting connections, x 1000)."""
    return aa._time(layer) / aa.seconds * 1000 if aa.seconds else 0.0


#: What workers were doing in each layer the stack samples of a threaded server name in a finding.
_DOING = {
    DB_POOL: "waiting to check a database connection out of a pool",
    HTTP_POOL: "waiting for a free connection of an HTTP client pool",
    LOCK: "blocked on locks",
    QUEUE: "queued in the accept backlog before any worker took them",
    RETRY: "sleeping in retry backoff",
    APP: "running the service's own Python code on the CPU",
}


def layer_findings(rule: Rule, aa: AttachAnalysis, layer: str, *, min_share: float) -> list[Finding]:
    """A threaded server's workers spending at least `min_share` of their busy time in `layer`
    (or of busy plus queue time; for `queue`, only that): `rule`'s finding, whose impact_ms is
    the layer's time per second of the capture. An asyncio server's layers are request time on
    the wire: its findings are the loop's (`loop_findings`) and the census's (`wire_pool_findings`)."""
    if aa.asyncio:
        return []
    share = aa.share(layer)
    if share < min_share and (layer == QUEUE or busy_share(aa, layer) < min_share):
        return []
    evidence: dict[str, Any] = {
        "share_of_busy_and_queue_time": round(share, 4),
        "workers": aa.workers,
        "idle_share": None if aa.idle_share is None else round(aa.idle_share, 4),
    }
    if layer != QUEUE:
        evidence.update({
            "share_of_busy_time": round(busy_share(aa, layer), 4),
            "samples": round(aa.busy_s.get(layer, 0.0) * aa.rate_hz),
            "signatures": dict(aa.signatures.get(layer, Counter()).most_common(5)),
            "hot_frames": dict(aa.hot_frames.get(layer, Counter()).most_common(3)),
            "source": "stack samples",
        })  # fmt: skip
    if layer == QUEUE:
        evidence.update(aa.backlog)
        evidence["seconds_with_backlog_share"] = round(aa.backlog_seconds_share, 3)
    if layer in (DB_POOL, HTTP_POOL) and aa.connections:
        evidence["connections_established_peak"] = dict(aa.connections)
    summary = f"{share:.0%} of busy worker time plus queue time was spent {_DOING[layer]}"
    app_s = aa.busy_s.get(APP, 0.0) if layer == APP else 0.0
    gil_share = aa.signatures[APP]["wchan.gil"] / aa.rate_hz / app_s if app_s > 0 else 0.0
    if gil_share > 0:
        evidence["gil_wait_share"] = round(gil_share, 4)
        summary += (f", {gil_share:.0%} of it threads waiting for the GIL while another ran"
                    " (the GIL lets one thread at a time run Python: more threads do not add CPU)")  # fmt: skip
    if layer == QUEUE and "mean_backlog_wait_ms" in aa.backlog:
        summary += f" (mean accept queue {aa.backlog['mean_accept_queue']:g}, about {aa.backlog['mean_backlog_wait_ms']:g} ms per connection)"
    top = aa.hot_frames.get(layer)
    if top and layer != QUEUE:
        summary += f"; mostly at {top.most_common(1)[0][0]}"
    return [rule.finding(
        severity="critical" if share >= 0.5 else "warning", confidence=round(min(1.0, share * 2), 3),
        impact_ms=round(_per_second_ms(aa, layer), 1), summary=summary + ".", evidence=evidence, fix=fix_of(rule),
        subject="attach", layer=layer,
    )]  # fmt: skip


def loop_held(aa: AttachAnalysis, *, min_busy_share: float = LOOP_SATURATED_SHARE,
              min_blocked_share: float = LOOP_BLOCKED_SHARE) -> bool:  # fmt: skip
    """An event loop among the workers held at least `min_busy_share` of the time, or blocked
    in long intervals adding up to `min_blocked_share` of it (`LoopState.held` at the defaults)."""
    return aa.loop is not None and aa.loop.held_at(min_busy_share, min_blocked_share)


#: A held loop made requests slow when they spent at least this share of their time on the
#: wire behind it (answers unread while it was busy, or waiting in the process while it was
#: held). Low on purpose: a loop blocked 300 ms now and then costs little of all request time,
#: and all of it lands on the requests in flight then, the tail.
LOOP_MIN_REQUEST_SHARE = 0.05


def loop_delayed_requests(aa: AttachAnalysis) -> bool:
    """Whether a held loop kept requests waiting. On an asyncio server seen by its socket census,
    only when the loop's part of request time holds `LOOP_MIN_REQUEST_SHARE`: a loop thread
    seldom in its epoll wait while the requests in flight all wait at outbound endpoints, their
    answers read at once (the thread in native code, or runnable while the machine's CPUs are
    busy elsewhere: both read as running), did not make them slow, and naming it would send
    people to the wrong layer. Without a census the samples are all there is: held is enough."""
    return not aa.asyncio or aa.share(EVENT_LOOP) >= LOOP_MIN_REQUEST_SHARE


def loop_statement(aa: AttachAnalysis) -> tuple[str, dict[str, Any], float]:
    """What the samples say of a held loop: (summary, evidence, confidence)."""
    loop = aa.loop
    assert loop is not None
    evidence: dict[str, Any] = {
        **loop.evidence(),
        "held_by": dict(aa.held_by.most_common(5)),
        "signatures": dict(aa.signatures.get(EVENT_LOOP, Counter()).most_common(5)),
        "hot_frames": dict(aa.hot_frames.get(EVENT_LOOP, Counter()).most_common(3)),
        "samples": round(aa.busy_s.get(EVENT_LOOP, 0.0) * aa.rate_hz),
        "source": "wait channels and stack samples of the loop thread",
    }
    if aa.wire is not None:
        evidence["requests_in_flight_mean"] = round(aa.wire.in_flight_mean, 2)
    busy = loop.busy_share or 0.0
    summary = f"The event loop was held {busy:.0%} of the time"
    if loop.blocked_ms:
        summary += (f", {len(loop.blocked_ms)} times for 100 ms or more without a pause for events"
                    f" (longest {max(loop.blocked_ms):.0f} ms)")  # fmt: skip
    top = aa.hot_frames.get(EVENT_LOOP)
    if top:
        what = aa.held_by.most_common(1)[0][0] if aa.held_by else ""
        where = top.most_common(1)[0][0]
        if what in (APP, "running") and where.endswith(_LOOP_FILES):  # no Python frame above the loop's own
            what = "native"
        summary += f", mostly at {where}" + (f" ({_held_words(what)})" if what else "")
    share = aa.share(EVENT_LOOP) if aa.asyncio else busy
    evidence["share_of_request_time"] = round(share, 4)
    confidence = min(1.0, max(busy, loop.blocked_share * 5))
    if loop_delayed_requests(aa):
        summary += "; every other request on the loop waited meanwhile."
    else:  # measured on the loop's thread, but the requests were not waiting for it: no cause of their latency
        confidence = min(confidence, share / LOOP_MIN_REQUEST_SHARE)
        summary += (f"; yet the requests in flight spent only {share:.0%} of their time waiting for it (the rest"
                    " at outbound endpoints or in the backlog), so it did not make them slow.")  # fmt: skip
    return summary, evidence, round(confidence, 3)


def loop_findings(rule: Rule, aa: AttachAnalysis, *, min_busy_share: float, min_blocked_share: float) -> list[Finding]:
    """A held event loop (`loop_held` at these thresholds): its busy share, blocked intervals and the stacks that held it."""
    if aa.loop is None or not loop_held(aa, min_busy_share=min_busy_share, min_blocked_share=min_blocked_share):
        return []
    summary, evidence, confidence = loop_statement(aa)
    busy = aa.loop.busy_share or 0.0
    severity = ("critical" if busy >= 0.5 else "warning") if loop_delayed_requests(aa) else "info"
    return [rule.finding(
        severity=severity, confidence=confidence, impact_ms=round(busy * 1000, 1),
        summary=summary, evidence=evidence, fix=fix_of(rule), subject="attach", layer=EVENT_LOOP,
    )]  # fmt: skip


#: The files of the loop's own frames (`stacks.LOOP_FRAMES`), as a hot frame ends: "run (asyncio/runners.py)".
_LOOP_FILES = tuple(f"{file})" for file, _ in LOOP_FRAMES)


def _held_words(what: str) -> str:
    return {
        APP: "running Python on the CPU", "running": "running Python on the CPU",
        "native": "running native code under the loop, uvloop's or a C extension's, or waiting for a CPU",
        "wchan.sleep": "a blocking sleep", "wchan.socket": "blocking socket I/O",
        LOCK: "a blocking lock", "db.query": "a blocking database call", "waiting": "a blocking call",
    }.get(what, what)  # fmt: skip


def wire_pool_inferred(aa: AttachAnalysis) -> bool:
    """Requests of an asyncio service waiting beyond a stable ceiling of DB connections
    (`WireState.pool_inferred`), the loop not held."""
    return aa.wire is not None and aa.wire.pool_inferred and not (aa.loop is not None and aa.loop.held)


def wire_pool_statement(aa: AttachAnalysis) -> tuple[str, dict[str, Any], float]:
    """What the census (and pg_stat_activity) say of an inferred pool: (summary, evidence, confidence)."""
    wire, pg = aa.wire, aa.backends
    assert wire is not None
    db = ", ".join(f"{e.address}:{e.port}" for e in wire.db_endpoints())
    elsewhere = wire.outstanding_mean()
    summary = (
        f"{wire.in_flight_mean:.0f} requests were in flight on average but the service kept a stable ceiling of"
        f" {wire.db_ceiling} connections to {db} ({wire.db_ceiling_share:.0%} of the seconds at it), {elsewhere:.1f}"
        f" were awaiting other endpoints and {wire.at_db_mean():.1f} the database: about {wire.waiting_mean:.0f} waited inside the process on nothing the wire shows, most likely for"
        " one of those connections"
    )  # fmt: skip
    evidence = Inference(SOURCE_CENSUS, {**wire.evidence(), "share_of_request_time": round(aa.share(DB_POOL), 4)}).evidence()
    confidence = 0.5
    if pg is not None and pg.readings:
        evidence["pg_stat_activity"] = pg.evidence()
        if pg.held_share >= 0.5:
            confidence = 0.8
            top_state = pg.states.most_common(1)[0][0]
            summary += (
                f"; pg_stat_activity shows those connections {top_state} {pg.states[top_state] / pg.readings:.0%} of the"
                f" time (median {pg.evidence()['idle_age_ms_p50']:g} ms since their last statement): they are held across"
                " something else, often the LLM call, while other requests wait for them"
            )  # fmt: skip
        else:
            summary += f"; pg_stat_activity shows them busy ({pg.held_share:.0%} of readings idle for {HELD_MS:g} ms or more)"
    else:
        summary += " (inferred from the sockets; `--db DSN` reads the connections' state in pg_stat_activity)"
    return summary + ".", evidence, confidence


def wire_http_limit_inferred(aa: AttachAnalysis) -> bool:
    """Requests of an asyncio service waiting behind a stable, busy ceiling of connections to one
    HTTP endpoint (`WireState.http_limited`), none at the database, the loop not held."""
    return aa.wire is not None and aa.wire.http_limited is not None and not (aa.loop is not None and aa.loop.held)


#: The confidence of an HTTP connection limit inferred from the wire: under 0.5, since a limit
#: of the service's own around those calls (a semaphore) looks the same from outside.
HTTP_LIMIT_CONFIDENCE = 0.4


def wire_http_limit_statement(aa: AttachAnalysis) -> tuple[str, dict[str, Any], float]:
    """What the census says of an inferred HTTP connection limit: (summary, evidence, confidence)."""
    wire = aa.wire
    assert wire is not None and wire.http_limited is not None
    endpoint = wire.endpoints[wire.http_limited]
    ceiling = endpoint.ceiling
    busy = wire.mean({s: endpoint.busy(s) for s in wire.seconds})
    summary = (
        f"{wire.in_flight_mean:.0f} requests were in flight on average but the service never had more than"
        f" {ceiling:g} connections to {wire.http_limited}, {busy:.1f} of them busy on average, and none of the"
        f" requests were at the database: about {wire.waiting_mean:.0f} waited inside the process, most likely for a"
        f" connection of the HTTP client's pool (its limit), or for a limit of the service's own around those calls"
        f" (a semaphore looks the same from outside; `latprof run` tells them apart)"
    )  # fmt: skip
    evidence = Inference(SOURCE_CENSUS_HTTP, {
        **wire.evidence(), "http_endpoint": wire.http_limited, "http_connections_ceiling": ceiling,
        "http_connections_busy_mean": round(busy, 2), "share_of_request_time": round(aa.share(HTTP_POOL), 4),
    }).evidence()  # fmt: skip
    return summary + ".", evidence, HTTP_LIMIT_CONFIDENCE


def wire_pool_findings(rule: Rule, aa: AttachAnalysis, layer: str = DB_POOL) -> list[Finding]:
    """Requests of an asyncio service waiting beyond a stable ceiling of connections (census):
    to the database (`db.pool`, `wire_pool_inferred`, with the database's view of those
    connections when `--db` was given) or to one HTTP endpoint (`http.pool`, `wire_http_limit_inferred`)."""
    if layer == HTTP_POOL:
        if not wire_http_limit_inferred(aa):
            return []
        summary, evidence, confidence = wire_http_limit_statement(aa)
    else:
        if not wire_pool_inferred(aa):
            return []
        summary, evidence, confidence = wire_pool_statement(aa)
    return [rule.finding(
        severity="critical" if aa.share(layer) >= 0.5 else "warning", confidence=confidence,
        impact_ms=round(_per_second_ms(aa, layer), 1), summary=summary, evidence=evidence, fix=fix_of(rule),
        subject="attach", layer=layer,
    )]  # fmt: skip


#: Layers in which busy workers wait for something the service itself limits: when one of them
#: takes a large share of busy time, it is why requests queue (the backlog is its consequence).
WAITING = (DB_POOL, HTTP_POOL, LOCK, RETRY)


def busy_share(aa: AttachAnalysis, layer: str) -> float:
    busy = sum(aa.busy_s.values())
    return aa.busy_s.get(layer, 0.0) / busy if busy > 0 else 0.0


def build_attach_report(aa: AttachAnalysis, findings: Sequence[Finding]) -> Report:
    timeline = aa.timeline
    starts = [s.ts_ns for s in timeline.samples]
    pids = sorted({s.pid for s in timeline.samples})
    header = next((h for h in timeline.headers if h.get("source") == "attach"), {})
    layers = [
        LayerRow(layer, None, None, None, round(_per_second_ms(aa, layer), 3), round(aa.share(layer), 4))
        for layer in LAYERS if aa.share(layer) > 0
    ]  # fmt: skip
    layers.sort(key=lambda r: -r.share_of_tail_excess)
    covered = aa.total_s - aa._time(UNATTRIBUTED)
    extra: dict[str, Any] = {}
    if aa.loop is not None:
        extra["event_loop"] = {**aa.loop.evidence(), "held_by": dict(aa.held_by.most_common(5))}
    if aa.wire is not None:
        extra["census"] = aa.wire.evidence()
    if aa.backends is not None:
        extra["db_backends"] = aa.backends.evidence()
    if aa.reconstructed is not None:
        extra["reconstructed"] = aa.reconstructed
    engines = [dict(q.attrs) for q in timeline.quality if q.kind == NOTE_ENGINE_METRICS]
    if engines:  # what `--engine-metrics` scraping saw (no requests to line the engine up with)
        extra["engines"] = engines

    def second_extra(row: dict[str, Any]) -> dict[str, Any]:
        more = {"workers": aa.workers, "busy_workers": row["busy_workers"], "top_layer": row["top_layer"],
                "accept_queue": row["accept_queue"]}  # fmt: skip
        if aa.loop is not None:
            more["loop_busy_share"] = aa.loop.busy_by_second.get(row["second"])
        if aa.wire is not None:
            more["requests_in_flight"] = aa.wire.in_flight.get(row["second"])
        return more

    return Report(
        source={"kind": "attach", "method": "sample", "inputs": list(timeline.inputs), "pid": header.get("target_pid"),
                "pids": pids},
        window={
            "start_unix_s": min(starts) / 1e9 if starts else None,
            "end_unix_s": max(starts) / 1e9 + 1 if starts else None,
            "requests": None,
        },
        latency_ms=None,
        layers=layers,
        verdict=decide_verdict(aa, findings),
        findings=list(findings),
        p99_over_time=[
            WindowRow(float(row["second"]), None if row["accepted"] is None else int(row["accepted"]), None, second_extra(row))
            for row in aa.seconds_rows
        ],  # fmt: skip
        window_s=1.0,
        collection={
            "collectors": timeline.collectors,
            "coverage": round(covered / aa.total_s, 4) if aa.total_s else None,
            "idle_share": None if aa.idle_share is None else round(aa.idle_share, 4),
            "warmup_requests_skipped": 0,
            "samples": sum(s.weight for s in timeline.samples),
            "workers": aa.workers,
            "overhead": overhead_of(timeline),
            "warnings": [q.message for q in timeline.quality if q.kind == "warning"],
            **extra,
        },
        overhead_parts=overhead_parts(timeline),
    )


def diagnose_attach(timeline: Timeline, rules: Sequence[Rule] | None = None) -> Report:
    """The report of an attach capture's timeline, judged by `rules` (default: every rule at its defaults)."""
    from latprof.pipeline import default_rules

    aa = analyze_attach(timeline)
    return build_attach_report(aa, judge(aa, default_rules() if rules is None else rules))
