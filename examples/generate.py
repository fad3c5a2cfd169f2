#!/usr/bin/env python3
"""Generate the example captures in this directory from small discrete-event simulations.

    python examples/generate.py [--out-dir examples] [SCENARIO ...]

Each scenario simulates about 60 s of an LLM-backed API service and writes what latprof's
in-process hooks would have recorded as `<out-dir>/<scenario>.jsonl.gz`: Poisson arrivals
(with bursts where the scenario asks for them), a fixed number of workers with a FIFO queue
in front of them (or one asyncio event loop), a database connection pool with FIFO waiters,
a query, a streamed LLM call whose time to first token is

    floor_ms + ms_per_1k_input_tokens * input_tokens / 1000 + provider-side queueing

followed by decode (output tokens x ms per output token), and some of the app's own CPU time.
The tail of each capture is produced by the simulated mechanism, not placed by hand; the
layer that owns it is listed in README.md.

Output is byte-identical across runs: seeded `random.Random`s, a fixed epoch, fixed header
fields and gzip mtime 0. These captures are simulated; `latprof run` will record real ones.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import orjson

from latprof import layers, semconv
from latprof.capture.format import encode, make_header
from latprof.events import Gauge, QualityRecord, Request, Segment

EPOCH_NS = 1_764_000_000 * 10**9  # every capture starts at this wall-clock instant
PID = 4242
MS = 1_000_000  # ns per ms
POOL_NAME = "postgresql://127.0.0.1:5432/test"
MODEL = "gpt-4o-mini"


# --- scenarios -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    name: str
    weight: float  # share of the Poisson arrivals
    input_tokens: tuple[int, int] = (300, 2000)  # log-uniform range
    output_tokens: tuple[int, int] = (60, 220)  # uniform range
    block_ms: tuple[float, float] | None = None  # no LLM call: a blocking CPU call instead
    batch: tuple[int, int] | None = None  # arrives in batches of this size (not Poisson) ...
    batch_every_s: float = 0.0  # ... with exponential gaps of this mean


@dataclass(frozen=True)
class Scenario:
    name: str
    expect: str  # the layer that must own the tail, or "none"
    what: str  # one line for the README
    seed: int
    rate: float  # mean Poisson arrivals per second (outside bursts)
    routes: tuple[Route, ...] = (Route("POST /chat", 1.0),)
    workers: int | None = 64  # None: an asyncio service, every request on one event loop
    pool_max: int = 20
    hold_across_llm: bool = False  # one checkout held from the first query to after the LLM call
    burst_every_s: float = 0.0  # every this many seconds ...
    burst_len_s: float = 0.0  # ... for this long ...
    burst_factor: float = 1.0  # ... the arrival rate is multiplied by this
    ttft_floor_ms: float = 350.0
    ttft_ms_per_1k_input: float = 25.0
    provider_queue_ms: float = 40.0  # mean of the exponential provider-side queueing
    spike_p: float = 0.0  # probability of a provider-side queueing spike ...
    spike_ms: float = 0.0  # ... whose size is lognormal with this median
    ms_per_output_token: float = 6.0
    query_ms: float = 6.0  # median query time (lognormal)
    duration_s: float = 60.0


SCENARIOS = (
    Scenario(
        "pool_held_across_llm", layers.DB_POOL, "5 connections, 40 worker threads; each request "
        "holds its connection across the LLM call, so checkouts wait seconds when traffic bunches",
        seed=11, rate=8.5, burst_every_s=12, burst_len_s=2.5, burst_factor=2.0, workers=40,
        pool_max=5, hold_across_llm=True, ttft_floor_ms=180, provider_queue_ms=30,
        ms_per_output_token=3.0, routes=(Route("POST /chat", 1.0, (200, 1500), (20, 90)),)),
    Scenario(
        "queueing", layers.QUEUE, "4 workers; every 10 s a 2 s burst at 3x the base rate "
        "backs up the accept queue", seed=23, rate=7.0, workers=4, pool_max=20,
        burst_every_s=10, burst_len_s=2, burst_factor=3.0, ttft_floor_ms=180,
        provider_queue_ms=20, ms_per_output_token=3.0,
        routes=(Route("POST /classify", 0.7, (150, 800), (5, 30)),
                Route("POST /chat", 0.3, (300, 1500), (20, 60)))),
    Scenario(
        "provider_floor", layers.PROVIDER, "plenty of workers and connections; TTFT floor 700 ms "
        "+ 40 ms per 1k input tokens, occasional provider-side queueing spikes", seed=33,
        rate=15.0, workers=64, pool_max=20, ttft_floor_ms=700, ttft_ms_per_1k_input=40,
        provider_queue_ms=120, spike_p=0.03, spike_ms=2500, ms_per_output_token=4.0,
        routes=(Route("POST /chat", 0.6, (200, 4000), (30, 120)),
                Route("POST /summarize", 0.4, (2000, 12000), (60, 150)))),
    Scenario(
        "healthy", "none", "everything comfortable; modest variance", seed=44, rate=12.0,
        workers=32, pool_max=20, routes=(Route("POST /chat", 1.0, (200, 3000), (100, 180)),)),
    Scenario(
        "event_loop_blocked", layers.EVENT_LOOP, "asyncio service; batches of 2-4 /export requests "
        "each run a 300-700 ms blocking call on the event loop, stalling every request in flight",
        seed=55, rate=10.0, workers=None, pool_max=20,
        routes=(Route("POST /chat", 1.0, (200, 3000), (80, 200)),
                Route("GET /export", 0.0, block_ms=(300, 700), batch=(2, 4), batch_every_s=12))),
    Scenario(
        "long_decode", layers.MODEL, "plenty of capacity; 3% of requests generate 2000-4000 "
        "output tokens", seed=66, rate=12.0, workers=64, pool_max=20, ms_per_output_token=5.0,
        routes=(Route("POST /chat", 0.97, (200, 3000), (80, 250)),
                Route("POST /report", 0.03, (500, 3000), (2000, 4000)))),
)


# --- a minimal process-based discrete-event kernel ------------------------------------------


class Sim:
    """Processes are generators that yield either a delay in ns (sleep) or a Resource (wait
    for one unit of it, FIFO). Ties are resolved in scheduling order, so runs are repeatable."""

    def __init__(self) -> None:
        self.now = 0
        self._heap: list[tuple[int, int, Iterator[Any]]] = []
        self._seq = 0

    def schedule(self, t: int, proc: Iterator[Any]) -> None:
        heapq.heappush(self._heap, (t, self._seq, proc))
        self._seq += 1

    def run(self) -> None:
        while self._heap:
            self.now, _, proc = heapq.heappop(self._heap)
            try:
                cmd = next(proc)
            except StopIteration:
                continue
            if isinstance(cmd, Resource):
                cmd.request(proc)
            else:
                self.schedule(self.now + max(0, int(cmd)), proc)


class Resource:
    """`capacity` identical units (workers, connections, the event loop) with FIFO waiters."""

    def __init__(self, sim: Sim, capacity: int) -> None:
        self.sim, self.capacity, self.in_use = sim, capacity, 0
        self.waiters: deque[Iterator[Any]] = deque()

    def request(self, proc: Iterator[Any]) -> None:
        if self.in_use < self.capacity:
            self.in_use += 1
            self.sim.schedule(self.sim.now, proc)
        else:
            self.waiters.append(proc)

    def release(self) -> None:
        if self.waiters:  # hand the unit straight to the first waiter
            self.sim.schedule(self.sim.now, self.waiters.popleft())
        else:
            self.in_use -= 1


# --- the simulated service ------------------------------------------------------------------


@dataclass
class Req:
    request_id: str
    route: Route
    start: int
    cpu_ns: int = 0


@dataclass
class Service:
    sc: Scenario
    sim: Sim = field(default_factory=Sim)
    events: list[Any] = field(default_factory=list)
    in_flight: int = 0
    arrivals_done: bool = False
    opened: int = 0  # connections the pool has opened so far
    cpu_spans: list[tuple[int, int]] = field(default_factory=list)  # (start, end) of app CPU, for the gauge

    def __post_init__(self) -> None:
        self.rng = random.Random(self.sc.seed)  # drives the simulation
        self.ids = random.Random(self.sc.seed + 1_000_003)  # only draws ids
        self.workers = Resource(self.sim, self.sc.workers) if self.sc.workers else None
        self.loop = None if self.sc.workers else Resource(self.sim, 1)
        self.pool = Resource(self.sim, self.sc.pool_max)

    # helpers
    def ms(self, median: float, sigma: float = 0.35) -> int:
        return int(median * MS * math.exp(self.rng.gauss(0.0, sigma)))

    def hex(self, bits: int) -> str:
        return f"{self.ids.getrandbits(bits):0{bits // 4}x}"

    def done(self) -> bool:
        return self.arrivals_done and self.in_flight == 0

    def segment(self, req: Req, layer: str | None, name: str, start: int, attrs: dict[str, Any]) -> None:
        """Emit a segment that ends now (hooks write a segment when it ends)."""
        self.events.append(Segment(req.request_id, self.hex(64), None, name, layer,
                                   EPOCH_NS + start, EPOCH_NS + self.sim.now, PID, attrs))

    def gauge(self, name: str, value: float, attrs: dict[str, Any] | None = None) -> None:
        self.events.append(Gauge(name, float(value), EPOCH_NS + self.sim.now, PID, attrs or {}))

    # processes
    def arrivals(self) -> Iterator[Any]:
        """Poisson arrivals at a time-varying rate (bursts), by thinning."""
        sc, end = self.sc, int(self.sc.duration_s * 1e9)
        poisson = [r for r in sc.routes if r.batch is None]
        peak = sc.rate * max(1.0, sc.burst_factor)
        while True:
            yield self.rng.expovariate(peak) * 1e9
            if self.sim.now >= end:
                break
            t = self.sim.now / 1e9
            in_burst = sc.burst_every_s and (t % sc.burst_every_s) >= sc.burst_every_s - sc.burst_len_s
            if self.rng.random() < (peak if in_burst else sc.rate) / peak:
                route = self.rng.choices(poisson, [r.weight for r in poisson])[0]
                self.sim.schedule(self.sim.now, self.handle(route))
        self.arrivals_done = True

    def batches(self, route: Route) -> Iterator[Any]:
        """A client firing `route` several times at once (a dashboard refresh)."""
        end = int(self.sc.duration_s * 1e9)
        while True:
            yield self.rng.expovariate(1.0 / route.batch_every_s) * 1e9
            if self.sim.now >= end:
                return
            for _ in range(self.rng.randint(*route.batch)):
                self.sim.schedule(self.sim.now + self.rng.randint(0, 30 * MS), self.handle(route))

    def sampler(self) -> Iterator[Any]:
        """Gauges once a second: pool, accept queue, process CPU."""
        pool = {semconv.DB_POOL_NAME: POOL_NAME}
        while not self.done():
            yield 1_000 * MS
            self.gauge(semconv.GAUGE_POOL_SIZE, self.opened, pool)
            self.gauge(semconv.GAUGE_POOL_MAX, self.pool.capacity, pool)
            self.gauge(semconv.GAUGE_POOL_IN_USE, self.pool.in_use, pool)
            self.gauge(semconv.GAUGE_POOL_WAITERS, len(self.pool.waiters), pool)
            if self.workers:
                self.gauge(semconv.GAUGE_ACCEPT_QUEUE, len(self.workers.waiters))
            since = self.sim.now - 1_000 * MS  # CPU busy time within the last second
            busy = sum(max(0, min(end, self.sim.now) - max(start, since)) for start, end in self.cpu_spans)
            self.cpu_spans = [(start, end) for start, end in self.cpu_spans if end > self.sim.now]
            self.gauge(semconv.GAUGE_CPU_PERCENT, round(busy / (10 * MS), 1))

    def loop_probe(self) -> Iterator[Any]:
        """asyncio only: a callback scheduled every 250 ms; its lateness is the loop lag."""
        while not self.done():
            yield 250 * MS
            t = self.sim.now
            yield self.loop
            self.loop.release()
            self.gauge(semconv.GAUGE_LOOP_LAG_MS, round((self.sim.now - t) / MS, 3))

    # the request and its steps
    def cpu(self, req: Req, ns: int) -> Iterator[Any]:
        """Run `ns` of the service's own code; an asyncio service first needs the event loop."""
        if self.loop is not None:
            ready = self.sim.now
            yield self.loop
            if self.sim.now > ready:
                self.segment(req, layers.EVENT_LOOP, "event loop delay", ready, {})
        self.cpu_spans.append((self.sim.now, self.sim.now + ns))
        yield ns
        req.cpu_ns += int(ns * self.rng.uniform(0.9, 1.0))  # thread CPU clock: a bit under wall
        if self.loop is not None:
            self.loop.release()

    def checkout(self, req: Req) -> Iterator[Any]:
        """Every checkout is timed (as the SQLAlchemy hook does), contended or not."""
        start = self.sim.now
        yield self.pool
        if self.pool.in_use > self.opened:  # no idle connection: the checkout opens one
            self.opened += 1
            yield self.ms(25)
        yield self.rng.randint(30_000, 120_000)  # the pool's own bookkeeping
        self.segment(req, layers.DB_POOL, "sqlalchemy checkout", start, {semconv.DB_POOL_NAME: POOL_NAME})
        return self.sim.now

    def checkin(self, req: Req, held_since: int) -> Iterator[Any]:
        yield from self.cpu(req, self.rng.randint(20_000, 60_000))
        self.pool.release()
        self.segment(req, None, semconv.SEGMENT_CONNECTION_HOLD, held_since, {semconv.DB_POOL_NAME: POOL_NAME})

    def query(self, req: Req, summary: str, median_ms: float) -> Iterator[Any]:
        start = self.sim.now
        yield self.ms(median_ms, 0.4)
        self.segment(req, layers.DB_QUERY, summary, start,
                     {semconv.DB_SYSTEM_NAME: "postgresql", semconv.DB_QUERY_SUMMARY: summary})

    def llm_call(self, req: Req) -> Iterator[Any]:
        sc, rng, route = self.sc, self.rng, req.route
        lo, hi = route.input_tokens
        input_tokens = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        output_tokens = rng.randint(*route.output_tokens)
        ttft_ms = (sc.ttft_floor_ms + sc.ttft_ms_per_1k_input * input_tokens / 1000
                   + rng.expovariate(1.0 / sc.provider_queue_ms))
        if rng.random() < sc.spike_p:
            ttft_ms += sc.spike_ms * math.exp(rng.gauss(0.0, 0.4))
        common = {semconv.LLM_CALL_ID: self.hex(64), semconv.GEN_AI_OPERATION_NAME: "chat",
                  semconv.GEN_AI_PROVIDER_NAME: "openai", semconv.GEN_AI_REQUEST_MODEL: MODEL}
        start = self.sim.now
        yield ttft_ms * MS
        self.segment(req, layers.PROVIDER, f"chat {MODEL}", start,
                     {**common, semconv.GEN_AI_INPUT_TOKENS: input_tokens, semconv.TTFT_KNOWN: True})
        start = self.sim.now
        yield output_tokens * sc.ms_per_output_token * MS * rng.uniform(0.9, 1.15)
        self.segment(req, layers.MODEL, f"chat {MODEL} stream", start,
                     {**common, semconv.GEN_AI_OUTPUT_TOKENS: output_tokens, semconv.TTFT_KNOWN: True})

    def handle(self, route: Route) -> Iterator[Any]:
        """One request: worker, parse, checkout, SELECT, (checkin), LLM call, INSERT, respond."""
        sc, sim = self.sc, self.sim
        req = Req(self.hex(128), route, sim.now)
        self.in_flight += 1
        if self.workers is not None:
            yield self.workers
            if sim.now > req.start:
                self.segment(req, layers.QUEUE, "accept backlog", req.start, {semconv.QUEUE_SOURCE: "backlog"})
        yield from self.cpu(req, self.ms(3))  # parse, auth, routing
        held_since = yield from self.checkout(req)
        yield from self.query(req, "SELECT conversations", sc.query_ms)
        if route.block_ms is not None:  # /export: render the result synchronously
            yield from self.cpu(req, int(self.rng.uniform(*route.block_ms) * MS))
        else:
            if not sc.hold_across_llm:
                yield from self.checkin(req, held_since)
            yield from self.cpu(req, self.ms(2))  # build the prompt
            yield from self.llm_call(req)
            yield from self.cpu(req, self.ms(1))  # parse the completion
            if not sc.hold_across_llm:
                held_since = yield from self.checkout(req)
            yield from self.query(req, "INSERT messages", sc.query_ms * 0.7)
        yield from self.checkin(req, held_since)
        yield from self.cpu(req, self.ms(1.5))  # serialize the response
        if self.workers is not None:
            self.workers.release()
        self.events.append(Request(req.request_id, route.name, EPOCH_NS + req.start, EPOCH_NS + sim.now,
                                   PID, req.cpu_ns, 200))
        self.in_flight -= 1


def simulate(sc: Scenario) -> list[Any]:
    svc = Service(sc)
    collectors = ["asgi", "sqlalchemy", "openai"] + (["asyncio"] if svc.loop else [])
    svc.events.append(QualityRecord(semconv.NOTE_HOOKS_LOADED, EPOCH_NS, PID, ", ".join(collectors),
                                    attrs={"collectors": collectors}))
    svc.sim.schedule(0, svc.arrivals())
    for route in sc.routes:
        if route.batch is not None:
            svc.sim.schedule(0, svc.batches(route))
    svc.sim.schedule(0, svc.sampler())
    if svc.loop is not None:
        svc.sim.schedule(0, svc.loop_probe())
    svc.sim.run()
    return svc.events


def write_capture(sc: Scenario, path: Path) -> tuple[int, int]:
    events = simulate(sc)
    header = make_header("run", generator=f"examples/generate.py {sc.name}", simulated=True)
    header.update(pid=PID, ppid=4200, host="example-host", python="3.12.8", latprof="0.1.0",
                  wall_ns=EPOCH_NS, monotonic_ns=86_400 * 10**9)
    lines = [orjson.dumps(header)] + [orjson.dumps(encode(e)) for e in events]
    data = gzip.compress(b"\n".join(lines) + b"\n", compresslevel=9, mtime=0)
    path.write_bytes(data)
    return sum(isinstance(e, Request) for e in events), len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help="scenarios to generate (default: all): " + ", ".join(s.name for s in SCENARIOS))
    args = parser.parse_args()
    unknown = set(args.scenarios) - {s.name for s in SCENARIOS}
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for sc in SCENARIOS:
        if args.scenarios and sc.name not in args.scenarios:
            continue
        path = args.out_dir / f"{sc.name}.jsonl.gz"
        n, size = write_capture(sc, path)
        print(f"{path}: {n} requests, {size / 1024:.0f} KiB, expected verdict: {sc.expect}")


if __name__ == "__main__":
    main()
