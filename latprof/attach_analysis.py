"""An attach capture (stack samples, wait channels, /proc gauges) to a report, per report-v1's attach mode.

Sampling from outside sees no requests, so:

- **Worker threads** are the threads that serve requests: a thread seen in a serving frame
  (gunicorn's `handle_request`, a thread pool's `_WorkItem.run`, anyio's worker) or waiting
  for the next request (`latprof.stacks` idle signatures of workers). When none is recognised
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
- **Verdict** (`attach_verdict`): a pool or a lock workers wait in for at least
  `MIN_VERDICT_SHARE` of their busy time is saturated itself, and named. Otherwise the workers
  are **saturated** when idle less than `MAX_IDLE_SHARE` of their samples, or when a backlog
  stood in at least `MIN_BACKLOG_SECONDS_SHARE` of the seconds: then `queue` (a backlog), or
  `app` (workers mostly running Python), or `unattributed` (the cause is not visible from
  outside). Workers waiting on the provider or on tools are doing their job: reported, never
  blamed. Not saturated: no verdict, and the summary says where busy time goes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from latprof.engine import Finding, fingerprint, parse_doc_sections
from latprof.events import StackSample
from latprof.layers import APP, DB_POOL, HTTP_POOL, LAYERS, LOCK, QUEUE, RETRY, UNATTRIBUTED
from latprof.report import LayerRow, Report, Verdict, WindowRow
from latprof.stacks import BUSY, IDLE, Classification, Frame, classify
from latprof.timeline import Timeline

#: Workers idle less than this share of their samples are all busy.
MAX_IDLE_SHARE = 0.1
#: A backlog in at least this share of the seconds is a queue in front of the workers.
MIN_BACKLOG_SECONDS_SHARE = 0.3
#: The verdict layer holds at least this share of busy plus queue time.
MIN_VERDICT_SHARE = 0.2

#: Frames of a thread that serves a request (file suffix, function): the server's workers.
SERVING_FRAMES = (
    ("gunicorn/workers/sync.py", "handle_request"),
    ("gunicorn/workers/gthread.py", "handle_request"),
    ("anyio/_backends/_asyncio.py", "run"),  # WorkerThread.run: FastAPI/Starlette sync endpoints
    ("uvicorn/protocols/http/h11_impl.py", "run_asgi"),
    ("uvicorn/protocols/http/httptools_impl.py", "run_asgi"),
    ("waitress/channel.py", "service"),
)
#: A frame of a thread pool's task: a helper thread, when not also a server's worker.
TASK_FRAME = ("concurrent/futures/thread.py", "run")  # _WorkItem.run
#: Idle signatures of request workers (other idle threads are housekeeping); a thread pool's idle
#: thread counts only when the pool serves requests (gthread).
WORKER_IDLE = frozenset({"gunicorn.sync_idle", "executor.idle", "anyio.worker_idle"})
#: A worker waiting for work it handed to other threads: its time is theirs (they are sampled too).
HANDOFF = frozenset({"future.result", "future.wait"})

#: The rule whose id and fix a finding of each layer carries.
_RULES = {
    DB_POOL: "db-pool-exhaustion",
    HTTP_POOL: "http-pool-exhaustion",
    LOCK: "lock-contention",
    QUEUE: "request-queueing",
    RETRY: "retry-backoff",
}


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

    @property
    def total_s(self) -> float:
        return sum(self.busy_s.values()) + self.queue_s

    def share(self, layer: str) -> float:
        total = self.total_s
        value = self.queue_s if layer == QUEUE else self.busy_s.get(layer, 0.0)
        return value / total if total > 0 else 0.0

    @property
    def idle_share(self) -> float | None:
        seen = sum(self.busy_s.values()) + self.idle_s
        return self.idle_s / seen if seen > 0 else None


def _has(frames: Iterable[Any], wanted: Iterable[tuple[str, str]]) -> bool:
    wanted = tuple(wanted)
    for f in frames:
        for suffix, name in wanted:
            if (f.filename == suffix or f.filename.endswith("/" + suffix)) and f.function.rsplit(".", 1)[-1] == name:
                return True
    return False


def _serving(frames: Iterable[Any]) -> bool:
    return _has(frames, SERVING_FRAMES)


def _classified(sample: StackSample) -> Classification:
    frames = [Frame(f.function, f.filename) for f in sample.frames]
    return classify(frames, wchan=sample.wchan, active=sample.active if sample.wchan is None else None)


#: Top-level packages that are libraries, not the service (besides the standard library).
LIBRARIES = frozenset({
    "sqlalchemy", "psycopg", "psycopg2", "psycopg_pool", "asyncpg", "redis", "httpx", "httpx2", "httpcore",
    "httpcore2", "h11", "anyio", "openai", "anthropic", "gunicorn", "flask", "werkzeug", "starlette", "fastapi",
    "uvicorn", "aiohttp", "tenacity", "backoff", "urllib3", "requests", "pydantic", "jinja2", "click", "latprof",
})


def _library(filename: str) -> bool:
    import sys

    top = filename.lstrip("/").split("/", 1)[0].removesuffix(".py")
    if "site-packages/" in filename or "dist-packages/" in filename:
        top = filename.split("-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    elif filename.startswith("/"):
        return "/lib/python" in filename and "-packages/" not in filename  # the standard library by path
    return top in LIBRARIES or top in sys.stdlib_module_names or top.startswith("<")


def _app_frame(sample: StackSample) -> str:
    """The innermost frame of the service's own code (not a library's), where it was."""
    for f in sample.frames:
        if not _library(f.filename):
            return f"{f.function} ({f.filename})"
    return f"{sample.frames[0].function} ({sample.frames[0].filename})" if sample.frames else "?"


def analyze_attach(timeline: Timeline) -> AttachAnalysis:
    header = next((h for h in timeline.headers if h.get("source") == "attach"), {})
    rate = float(header.get("rate_hz") or 100)
    samples = timeline.samples
    by_thread: dict[tuple[int, int], list[tuple[StackSample, Classification]]] = {}
    for s in samples:
        by_thread.setdefault((s.pid, s.tid), []).append((s, _classified(s)))
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
        if key not in workers and any(c.state == BUSY and _has(s.frames, (TASK_FRAME,)) for s, c in seen)
    }  # fmt: skip
    if not workers:  # an unknown server: every thread that worked
        workers = {key for key, seen in by_thread.items() if any(c.state == BUSY for _, c in seen)} - helpers
    busy: Counter[str] = Counter()
    idle = 0
    signatures: dict[str, Counter[str]] = {}
    hot: dict[str, Counter[str]] = {}
    second_busy: dict[int, Counter[tuple[int, int]]] = {}  # second -> worker -> busy samples
    second_seen: dict[tuple[int, int], Counter[int]] = {}  # worker -> second -> samples (busy or idle)
    second_layers: dict[int, Counter[str]] = {}
    for key in workers | helpers:
        helper = key in helpers
        for s, c in by_thread[key]:
            if not helper:
                second_seen.setdefault(key, Counter())[s.ts_ns // 1_000_000_000] += s.weight
            if c.state == IDLE:
                if not helper and c.signature in WORKER_IDLE:
                    idle += s.weight
                continue
            if c.signature in HANDOFF:  # waiting for a task another sampled thread runs
                continue
            layer = c.layer or UNATTRIBUTED
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
    for second in sorted(second_layers):  # the seconds sampled
        layers_now = second_layers.get(second, Counter())
        depth_now = queue_by_second.get(second)
        aa.seconds_rows.append({
            "second": second,
            # a worker is busy in a second when at least half of its samples then were busy
            "busy_workers": sum(1 for state in busy_in.values() if state.get(second)),
            "top_layer": layers_now.most_common(1)[0][0] if layers_now else None,
            "accept_queue": round(sum(depth_now) / len(depth_now), 2) if depth_now else None,
            "accepted": accepted_by_second.get(second),
        })  # fmt: skip
    idle_share = aa.idle_share
    aa.saturated = bool(
        (idle_share is not None and idle_share < MAX_IDLE_SHARE and sum(busy.values()) > 0)
        or aa.backlog_seconds_share >= MIN_BACKLOG_SECONDS_SHARE
    )
    return aa


def _fix(rule_id: str) -> str:
    from latprof.engine import discover_rules

    for cls in discover_rules():
        if cls.id == rule_id:
            return " ".join(parse_doc_sections(cls.__doc__ or "").get("How to fix", "").split())
    return ""


def _per_second_ms(aa: AttachAnalysis, layer: str) -> float:
    """The layer's time per second of the capture, in ms (busy worker threads in it, or waiting connections, x 1000)."""
    value = aa.queue_s if layer == QUEUE else aa.busy_s.get(layer, 0.0)
    return value / aa.seconds * 1000 if aa.seconds else 0.0


def attach_findings(aa: AttachAnalysis) -> list[Finding]:
    """Attach mode's findings: impact_ms is the layer's time per second of the capture."""
    findings = []
    for layer in (*_RULES, APP):
        share = aa.share(layer)
        if share < MIN_VERDICT_SHARE and (layer == QUEUE or busy_share(aa, layer) < MIN_VERDICT_SHARE):
            continue
        rule_id = _RULES.get(layer, "cpu-bound")
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
        what = {
            DB_POOL: "waiting to check a database connection out of a pool",
            HTTP_POOL: "waiting for a free connection of an HTTP client pool",
            LOCK: "blocked on locks",
            QUEUE: "queued in the accept backlog before any worker took them",
            RETRY: "sleeping in retry backoff",
            APP: "running the service's own Python code on the CPU",
        }[layer]
        summary = f"{share:.0%} of busy worker time plus queue time was spent {what}"
        if layer == QUEUE and "mean_backlog_wait_ms" in aa.backlog:
            summary += f" (mean accept queue {aa.backlog['mean_accept_queue']:g}, about {aa.backlog['mean_backlog_wait_ms']:g} ms per connection)"
        top = aa.hot_frames.get(layer)
        if top and layer != QUEUE:
            summary += f"; mostly at {top.most_common(1)[0][0]}"
        fix = _fix(rule_id) if layer != APP else (
            "Find the hot code in the evidence's frames and make it cheaper, move CPU-heavy work off the request"
            " path (a task queue, a process pool), or add worker processes: threads share one GIL."
        )
        findings.append(Finding(
            rule_id, layer, "critical" if share >= 0.5 else "warning", round(min(1.0, share * 2), 3),
            round(_per_second_ms(aa, layer), 1), summary + ".", evidence, fix, fingerprint(rule_id, layer, "attach"),
        ))  # fmt: skip
    findings.sort(key=lambda f: -f.impact_ms)
    return findings


#: Layers in which busy workers wait for something the service itself limits: when one of them
#: takes a large share of busy time, it is why requests queue (the backlog is its consequence).
WAITING = (DB_POOL, HTTP_POOL, LOCK, RETRY)


def busy_share(aa: AttachAnalysis, layer: str) -> float:
    busy = sum(aa.busy_s.values())
    return aa.busy_s.get(layer, 0.0) / busy if busy > 0 else 0.0


def attach_verdict(aa: AttachAnalysis, findings: list[Finding]) -> Verdict:
    """report-v1 attach mode: the layer that saturates the service, or null, or unattributed.

    A waiting layer (`WAITING`) holding at least `MIN_VERDICT_SHARE` of busy worker time is
    the verdict whether or not every worker was busy: the pool or lock behind it is what is
    saturated (and a backlog in front of workers waiting for it is its doing). Otherwise, when
    the workers are saturated: `queue` when a backlog stood, else `app` when workers mostly ran
    Python, else `unattributed` (the cause is not visible); not saturated: null.
    """
    ranked = sorted(((aa.share(layer), layer) for layer in LAYERS if aa.share(layer) > 0), reverse=True)
    where = ", ".join(f"{layer} {share:.0%}" for share, layer in ranked[:3]) or "nothing was sampled"
    waiting = max(((busy_share(aa, layer), layer) for layer in WAITING), default=(0.0, ""))
    layer = None
    if waiting[0] >= MIN_VERDICT_SHARE:  # workers queue for a pool or a lock: that resource is saturated
        layer = waiting[1]
    elif not aa.saturated:
        return Verdict(None, None, None, 1.0 if ranked else 0.0,
                       f"Not saturated: workers were idle {aa.idle_share or 0:.0%} of the time and no backlog stood;"
                       f" busy time went to {where}.", "no_tail")  # fmt: skip
    elif aa.backlog_seconds_share >= MIN_BACKLOG_SECONDS_SHARE and aa.share(QUEUE) > 0:
        layer = QUEUE
    elif busy_share(aa, APP) >= 0.5:
        layer = APP
    elif aa.busy_s and max(aa.busy_s, key=lambda k: aa.busy_s[k]) != UNATTRIBUTED:
        top = max(aa.busy_s, key=lambda k: aa.busy_s[k])
        return Verdict(None, None, None, 0.5,
                       f"Every worker was busy, mostly in {top} ({busy_share(aa, top):.0%} of busy time), with no backlog"
                       f" and no pool or lock wait: the service is at its capacity doing its job; add workers, or make"
                       f" the handlers async so a worker is not tied up while it waits. Busy time: {where}.",
                       "no_tail")  # fmt: skip
    if layer is None:
        return Verdict(UNATTRIBUTED, None, round(aa.share(UNATTRIBUTED), 4), 0.0,
                       f"Saturated, but the cause is not visible from outside (busy time: {where}); run the service"
                       " under `latprof run` so in-process hooks time each request.", "unattributed")  # fmt: skip
    finding = next((f for f in findings if f.layer == layer), None)
    summary = f"Saturated: {layer} holds {aa.share(layer):.0%} of busy worker time plus queue time"
    if finding is not None:
        summary = finding.summary.rstrip(".")
    if layer != QUEUE and aa.share(QUEUE) > 0.05:
        summary += f"; requests also queued in the accept backlog meanwhile ({aa.share(QUEUE):.0%}), behind the workers it held"
    confidence = busy_share(aa, layer) if layer in (*WAITING, APP) else aa.share(layer)
    return Verdict(layer, finding.rule if finding else None, round(aa.share(layer), 4), round(confidence, 3), summary + ".", "layer")


def build_attach_report(aa: AttachAnalysis, findings: list[Finding]) -> Report:
    timeline = aa.timeline
    starts = [s.ts_ns for s in timeline.samples]
    pids = sorted({s.pid for s in timeline.samples})
    header = next((h for h in timeline.headers if h.get("source") == "attach"), {})
    layers = [
        LayerRow(layer, None, None, None, round(_per_second_ms(aa, layer), 3), round(aa.share(layer), 4))
        for layer in LAYERS if aa.share(layer) > 0
    ]  # fmt: skip
    layers.sort(key=lambda r: -r.share_of_tail_excess)
    covered = sum(v for k, v in aa.busy_s.items() if k != UNATTRIBUTED) + aa.queue_s
    return Report(
        source={"kind": "attach", "inputs": list(timeline.inputs), "pid": header.get("target_pid"), "pids": pids},
        window={
            "start_unix_s": min(starts) / 1e9 if starts else None,
            "end_unix_s": max(starts) / 1e9 + 1 if starts else None,
            "requests": None,
        },
        latency_ms=None,
        layers=layers,
        verdict=attach_verdict(aa, findings),
        findings=findings,
        p99_over_time=[
            WindowRow(float(row["second"]), None if row["accepted"] is None else int(row["accepted"]), None,
                      {"workers": aa.workers, "busy_workers": row["busy_workers"], "top_layer": row["top_layer"],
                       "accept_queue": row["accept_queue"]})
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
            "overhead": {"cpu_percent": None, "added_ms_per_request": None},
            "warnings": [q.message for q in timeline.quality if q.kind == "warning"],
        },
    )


def diagnose_attach(timeline: Timeline) -> Report:
    aa = analyze_attach(timeline)
    return build_attach_report(aa, attach_findings(aa))
