"""Hand-built attach timelines: the stack samples of a gunicorn sync server's workers, per second.

Not a test module: `from attach.sampled import ...` (tests/ is on sys.path, see tests/conftest.py).
"""

from __future__ import annotations

from typing import Any, Sequence

from latprof.analysis.timeline import Timeline
from latprof.attach.analysis import AttachAnalysis, analyze_attach
from latprof.events import Frame, Gauge, StackSample

ORIGIN_NS = 1_764_000_000 * 1_000_000_000
RATE_HZ = 100
PID = 10
#: A sync worker serving a request: gunicorn's `handle_request` under the view.
SERVING = Frame("handle_request", "/venv/lib/python3.12/site-packages/gunicorn/workers/sync.py", 0)
#: The service's own view that burns the CPU, and one that waits for a lock (futex) or a socket.
CPU = Frame("render", "/srv/app/reports.py", 12)
LOCKED = Frame("locked", "/srv/app/counters.py", 30)
#: An async handler's blocking call, on an asyncio event loop's thread.
BLOCKING = Frame("block", "/srv/app/async_app.py", 7)
LOOP = Frame("BaseEventLoop.run_forever", "/usr/lib/python3.12/asyncio/base_events.py", 0)
#: (frame, wait channel) of each kind of sample: running Python, waiting for a lock, waiting on a socket.
KINDS = {"cpu": (CPU, None), "lock": (LOCKED, "futex_wait_queue"), "socket": (CPU, "sk_wait_data")}
#: The same on an event loop's thread: a blocking sleep in a handler, the loop waiting for events.
LOOP_KINDS = {"sleep": (BLOCKING, "hrtimer_nanosleep"), "free": (Frame("select", "/usr/lib/python3.12/selectors.py"), "do_epoll_wait")}


def sampled(mix: dict[str, float], *, workers: int = 2, seconds: int = 3, loop_busy_share: float | None = None,
            backlog: Sequence[float] = (), accept_rate: float = 20.0,
            census: tuple[float, ...] | None = None, db: tuple[int, float] | None = None) -> Timeline:  # fmt: skip
    """An attach capture's timeline: `workers` sync workers sampled at `RATE_HZ` for `seconds`,
    each second split between the kinds of `mix` (kind -> share of its samples; `KINDS`), or
    with `loop_busy_share`, one asyncio event loop thread (`LOOP_KINDS`) whose busy share each
    second is that (the gauge `latprof attach` writes). `backlog`: the listening socket's accept
    queue read in each second (as /proc shows it), with `accept_rate` connections accepted a second.
    `census`: (requests in flight, of them at an outbound HTTP endpoint[, of those with its
    answer sitting unread]) each second, as the socket census of an asyncio server reads them
    (`latprof.attach.wire`). `db`: with it, (connections kept open to PostgreSQL, of them
    with a statement in flight) each second."""
    samples: list[StackSample] = []
    gauges: dict[str, list[Gauge]] = {}
    if backlog:
        gauges["accept.queue_depth"] = [Gauge("accept.queue_depth", depth, ORIGIN_NS + s * 1_000_000_000, PID, {})
                                         for s, depth in enumerate(backlog)]  # fmt: skip
        gauges["accept.rate"] = [Gauge("accept.rate", accept_rate, ORIGIN_NS + s * 1_000_000_000, PID, {})
                                 for s in range(len(backlog))]  # fmt: skip
    kinds, stack = KINDS, (SERVING,)
    if loop_busy_share is not None:
        kinds, stack, workers = LOOP_KINDS, (LOOP,), 1
        gauges["event_loop.busy_share"] = [Gauge("event_loop.busy_share", loop_busy_share, ORIGIN_NS + s * 1_000_000_000, PID + 1,
                                                 {"latprof.readings": RATE_HZ}) for s in range(seconds)]  # fmt: skip
    if census is not None:
        in_flight, outbound, unread = (*census, 0.0)[:3]
        at = [ORIGIN_NS + s * 1_000_000_000 for s in range(seconds)]
        endpoint = {"server.address": "127.0.0.1", "server.port": 8443}
        gauges["census.inbound.in_flight"] = [Gauge("census.inbound.in_flight", in_flight, t, PID, {}) for t in at]
        gauges["census.inbound.in_flight_age_ms"] = [Gauge("census.inbound.in_flight_age_ms", 400.0, t, PID, {}) for t in at]
        gauges["census.outbound.established"] = [Gauge("census.outbound.established", outbound, t, PID, endpoint) for t in at]
        gauges["census.outbound.pending"] = [Gauge("census.outbound.pending", outbound, t, PID, endpoint) for t in at]
        gauges["census.outbound.unread"] = [Gauge("census.outbound.unread", unread, t, PID, endpoint) for t in at]
        if db is not None:
            pg = {"server.address": "127.0.0.1", "server.port": 5432, "latprof.endpoint.kind": "postgresql"}
            gauges["census.outbound.established"] += [Gauge("census.outbound.established", db[0], t, PID, pg) for t in at]
            gauges["census.outbound.pending"] += [Gauge("census.outbound.pending", db[1], t, PID, pg) for t in at]
    for worker in range(workers):
        tid = PID + 1 + worker
        for second in range(seconds):
            at = 0
            for kind, share in mix.items():
                frame, wchan = kinds[kind]
                for _ in range(round(share * RATE_HZ)):
                    ts = ORIGIN_NS + second * 1_000_000_000 + at * (1_000_000_000 // RATE_HZ)
                    samples.append(StackSample(ts, PID + 1 + worker, tid, "MainThread", (frame, *stack),
                                               active=wchan is None, wchan=wchan))  # fmt: skip
                    at += 1
    samples.sort(key=lambda s: s.ts_ns)
    return Timeline(
        source_kind="attach", inputs=["<test>"], requests=[], samples=samples, gauges=gauges,
        headers=[{"type": "header", "source": "attach", "rate_hz": RATE_HZ, "target_pid": PID, "collectors": ["py-spy"]}],
    )  # fmt: skip


def analysed(mix: dict[str, float], **kw: Any) -> AttachAnalysis:
    """`sampled(mix)` analysed (`latprof.attach.analysis.analyze_attach`)."""
    return analyze_attach(sampled(mix, **kw))


def ids(findings: Sequence[object]) -> list[str]:
    return [str(getattr(f, "rule")) for f in findings]
