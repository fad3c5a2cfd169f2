"""The soak: the demo service under steady load with latprof in it or sampling it, beside the same without.

Minutes of load on the service with latprof's hooks in it (`run`) or `latprof attach` sampling
it (`attach`), side by side with the same service without latprof.

    python benchmarks/soak.py [--seconds 600] [--modes run,attach] [--interleave requests|blocks]
                              [--rate N] [--block S] [--warmup 10] [--dsn URL] [--keep DIR]

Per mode, two identical copies of the demo service (`latprof.demo.service:app`: FastAPI,
SQLAlchemy on PostgreSQL, the openai client streaming from the demo provider, which runs in a
process of its own with fixed latencies: 30 ms to the first token, then 8 tokens 2 ms apart)
run on the same cores as everything else (nothing pinned): the *observed* one under `latprof
run --no-report` with every hook (`run`), or plain with `latprof attach --pid` sampling it for
the whole soak (`attach`: py-spy at 100 Hz, the sampler's CPU on the same cores); the *plain*
one without latprof. `--modes control` runs two plain copies: what this machine's noise alone
makes of the comparison.

The load is open loop, GET /chat-released with Poisson arrivals, after a warm-up of each
service (`--warmup` seconds of `latprof.demo.load.drive` at 40 a second, the observed one first):

- `--interleave requests` (the default): both services under load for the whole `--seconds`,
  from one stream of arrivals at 2 x `--rate` (default 20 each: 40 a second in all, as the
  injection soak) sent to the two in turn - ABAB... request by request - so that whatever
  else the machine does at any moment hits both alike. The observed service's extra CPU is on
  the cores the plain one uses too, so a little of latprof's cost (its share of a busy
  machine's CPU, not the time it adds to the request's own path) shows on both sides.
- `--interleave blocks`: one service at a time, blocks of `--block` seconds (default 3) at
  `--rate` (default 40), ABBA ABBA..., pair i with the same seed (the very same arrivals and
  chat ids) for both. No cross-talk, but a burst of other work lands on one side's block.

The figures (per mode), and the targets (exit code 1 when one is missed, 2 when a service
would not start):

- RSS of the observed service after its warm-up and at the end (target: growth <= 10 MB);
  the plain one's beside it;
- requests and errors on each side (target: none failed on either, warm-up included);
- p50 and p99 of the client-side latencies of all of a side's requests in the soak, pooled
  (nearest rank), and the ratio observed / plain (target: <= 1.05 each, one-sided); beside
  it the median and range of the same ratio per window of `--block` seconds (requests; default
  10) or per block pair, and the plain p50 as a multiple of the provider's fixed wait (46 ms):
  far above 1, the machine was busy and the ratios are mostly its noise;
- CPU per request of each service (its process, all threads: latprof's writer too), and for
  `attach` the sampler's CPU (latprof attach and its py-spy processes) as a share of a core;
- the capture: for `run`, the request roots of /chat-released it holds and the requests they
  stand for (their sample weights summed) against the requests the observed service
  answered, warm-up included (target: equal; at these rates none is sampled out), and its
  `dropped`/`error` quality records (target: none); for `attach`, its samples and the longest
  time of the soak without one (target: <= 1 s: py-spy's restart between its five-second
  windows, 0.2-0.6 s, and nothing more), and the attach report it printed;
- the observed service's log: no traceback, no line from latprof (target: none); latprof's
  exit code (`run`: the service's, as the plain one's on the same SIGTERM; `attach`: 0).

The tests (`tests/reliability/test_soak_side_by_side.py`) run the same with
`LATPROF_SOAK_SECONDS` (default 60).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from latprof.demo.load import LoadStats, drive
from latprof.demo.provider import Provider, ProviderConfig
from latprof.demo.run import normalize_dsn
from latprof.semconv import DEFAULT_MAX_RATE, NOTE_OVERHEAD, SAMPLE_WEIGHT

PATH = "/chat-released"
PROVIDER = ProviderConfig(ttft_ms=30.0, tpot_ms=2.0, output_tokens=8)
PG_DSN = os.environ.get("LATPROF_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
MODES = ("run", "attach")
#: Not a soak: both services plain, to see what this machine's noise alone makes of the comparison.
CONTROL = "control"
INTERLEAVE = ("requests", "blocks")
#: With interleaved requests, the soak's load is sent in calls of about this many seconds (RSS read between them).
CHUNK_S = 30.0
#: The targets (docs/reliability.md).
RSS_GROWTH_MB = 10.0
LATENCY_RATIO = 1.05
WARMUP_S = 10.0
WARMUP_RATE = 40.0
#: What the provider alone makes every request wait: the first token, then the others and the finish chunk.
FLOOR_MS = PROVIDER.ttft_ms + PROVIDER.output_tokens * PROVIDER.tpot_ms
#: attach: py-spy records five-second windows back to back; between two it starts again (0.2 s idle,
#: up to 0.6 s seen on a busy machine). Longer than this without a sample is a hole in the capture.
MAX_SAMPLE_GAP_S = 1.0
#: The lines latprof itself writes to the observed service's output (`latprof run --no-report`'s last line).
OWN_LINES = ("latprof: capture written to ",)


class SoakError(RuntimeError):
    """A service, the provider or latprof would not start or stop."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    """One copy of the demo service; `proc` is `latprof run` for the observed service of `run`."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    pid: int = 0  # the server's own process (under `latprof run`: its child)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_mb(self) -> float:
        return float(psutil.Process(self.pid).memory_info().rss) / 2**20

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server's process (all its threads: latprof's writer too)."""
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)


def start_service(name: str, dsn: str, provider_url: str, workdir: Path, capture: Path | None,
                  max_rate: float = DEFAULT_MAX_RATE) -> Service:  # fmt: skip
    """The demo service on a free port, its output into `workdir/NAME.log`; under `latprof run
    --no-report --out capture` (every hook) when `capture` is given. Waits until /health answers."""
    port = free_port()
    server = [sys.executable, "-m", "uvicorn", "latprof.demo.service:app", "--host", "127.0.0.1", "--port", str(port),
              "--log-level", "warning", "--no-access-log"]  # fmt: skip
    if capture is not None:
        server = [sys.executable, "-m", "latprof", "run", "--no-report", "--out", str(capture),
                  "--max-rate", f"{max_rate:g}", "--", *server]  # fmt: skip
    env = {**os.environ, "LATPROF_DEMO_DSN": normalize_dsn(dsn), "LATPROF_DEMO_POOL_SIZE": "10",
           "LATPROF_DEMO_PROVIDER_URL": provider_url}  # fmt: skip
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(server, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
    service = Service(name, proc, port, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{service.base}/health", timeout=1).read()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                stop_service(service)
                raise SoakError(f"the {name} service did not start: {log.read_text(errors='replace')[-2000:]}") from None
            time.sleep(0.1)
    if capture is None:
        service.pid = proc.pid
    else:
        (child,) = psutil.Process(proc.pid).children()  # `latprof run` starts the server, which forks nothing
        service.pid = child.pid
    return service


def stop_service(service: Service) -> int | None:
    """SIGTERM to the process we started (`latprof run` passes it on); its exit code."""
    if service.proc.poll() is None:
        service.proc.send_signal(signal.SIGTERM)
        try:
            service.proc.wait(60)
        except subprocess.TimeoutExpired:
            service.proc.kill()
            service.proc.wait()
    return service.proc.returncode


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (0 < q <= 100) of `values`."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100)
    return ordered[int(rank) - 1]


@dataclass
class Side:
    """The soak blocks of one service, pooled."""

    blocks: list[LoadStats] = field(default_factory=list)
    #: CPU seconds the service used in its blocks
    cpu_s: float = 0.0

    @property
    def latencies(self) -> list[float]:
        return [ms for b in self.blocks for ms in b.latencies_ms]

    @property
    def done(self) -> int:
        return sum(b.done for b in self.blocks)

    @property
    def errors(self) -> int:
        return sum(b.errors for b in self.blocks)

    @property
    def error_samples(self) -> list[str]:
        return [s for b in self.blocks for s in b.error_samples][:5]

    def p(self, q: float) -> float:
        return percentile(self.latencies, q)

    @property
    def cpu_ms_per_request(self) -> float:
        return self.cpu_s * 1000 / max(1, self.done)


@dataclass
class SoakResult:
    mode: str
    seconds: float
    rate: float
    block_s: float
    interleave: str = "requests"
    observed: Side = field(default_factory=Side)
    plain: Side = field(default_factory=Side)
    #: requests the observed service answered outside the soak blocks (warm-up), and their errors
    other_done: int = 0
    other_errors: int = 0
    rss_warm_mb: float = 0.0
    rss_end_mb: float = 0.0
    rss_max_mb: float = 0.0
    plain_rss_warm_mb: float = 0.0
    plain_rss_end_mb: float = 0.0
    observed_log: str = ""
    #: the exit code of `latprof run` (the service's) or of `latprof attach`, and the plain service's (SIGTERM)
    latprof_exit: int | None = None
    plain_exit: int | None = None
    #: attach: the CPU seconds latprof and its py-spy processes used from the first block to the last
    sampler_cpu_s: float = 0.0
    wall_s: float = 0.0
    latprof_stderr: str = ""
    #: run: request roots of the loaded route in the capture, their weights summed, other roots by route,
    #: quality records by kind
    roots: int = 0
    hooks_loaded: list[str] = field(default_factory=list)
    other_roots: dict[str, int] = field(default_factory=dict)
    represented: int = 0
    quality: dict[str, int] = field(default_factory=dict)
    #: run: the attrs of the observed service's latest `overhead` record (what latprof reports it cost)
    overhead: dict[str, Any] = field(default_factory=dict)
    #: attach: samples in the capture, and the longest time of the soak without one (between the starts of
    #: two one-second windows of samples, or from the soak's start or to its end)
    samples: int = 0
    longest_gap_s: float = 0.0
    #: attach: the report it printed (JSON), when it printed one
    attach_report: dict[str, Any] | None = None

    def ratio(self, q: float) -> float:
        return self.observed.p(q) / self.plain.p(q)

    def pair_ratios(self, q: float) -> list[float]:
        return [percentile(o.latencies_ms, q) / percentile(p.latencies_ms, q)
                for o, p in zip(self.observed.blocks, self.plain.blocks)]  # fmt: skip

    @property
    def expected_exit(self) -> int | None:
        """What latprof must exit with: `attach` 0; `run` what the plain service did on the same SIGTERM
        (`latprof run` says 128+N for a signal N)."""
        if self.mode == "attach" or self.plain_exit is None:
            return 0
        if self.mode == CONTROL:
            return self.plain_exit
        return 128 - self.plain_exit if self.plain_exit < 0 else self.plain_exit

    @property
    def log_problems(self) -> list[str]:
        """Lines of the observed service's output that are a traceback or come from latprof."""
        return [line for line in self.observed_log.splitlines()
                if ("Traceback" in line or "latprof" in line.lower()) and not line.startswith(OWN_LINES)]  # fmt: skip

    def failures(self) -> list[str]:
        """The targets missed (empty: all held)."""
        missed = []
        growth = self.rss_end_mb - self.rss_warm_mb
        if growth > RSS_GROWTH_MB:
            missed.append(f"RSS grew {growth:.1f} MB after the warm-up (target <= {RSS_GROWTH_MB:g} MB)")
        if self.observed.errors or self.plain.errors or self.other_errors:
            missed.append(f"errors: observed {self.observed.errors} (+{self.other_errors} in the warm-up), plain "
                          f"{self.plain.errors}: {self.observed.error_samples + self.plain.error_samples}")  # fmt: skip
        for q in (50, 99):
            if self.ratio(q) > LATENCY_RATIO:
                missed.append(f"p{q} {self.observed.p(q):.2f} ms against {self.plain.p(q):.2f} ms without latprof:"
                              f" x{self.ratio(q):.3f} (target <= x{LATENCY_RATIO:g})")  # fmt: skip
        if self.log_problems:
            missed.append(f"the service's log: {self.log_problems[:5]}")
        if self.latprof_exit != self.expected_exit:
            missed.append(f"latprof {self.mode} exited with {self.latprof_exit}: {self.latprof_stderr[-2000:]}")
        if self.mode == "run":
            answered = self.observed.done + self.other_done
            if self.roots != answered or self.represented != answered:
                missed.append(f"the capture holds {self.roots} request roots standing for {self.represented}; the"
                              f" service answered {answered}")  # fmt: skip
            if self.quality.get("dropped") or self.quality.get("error"):
                missed.append(f"the capture's quality records: {self.quality}")
        elif self.mode == "attach":
            kind = (self.attach_report or {}).get("source", {}).get("kind")
            if kind != "attach":
                missed.append(f"latprof attach printed no attach report (source.kind {kind!r})")
            if not self.samples or self.longest_gap_s > MAX_SAMPLE_GAP_S:
                missed.append(f"the capture holds {self.samples} samples; the longest time without one"
                              f" {self.longest_gap_s:.1f} s (target <= {MAX_SAMPLE_GAP_S:g} s)")  # fmt: skip
        return missed

    def lines(self) -> list[str]:
        o, p = self.observed, self.plain
        how = ("both at once, arrivals alternating" if self.interleave == "requests"
               else f"{len(o.blocks)} block pairs, one service at a time")  # fmt: skip
        out = [f"soak, latprof {self.mode}: {self.seconds:g} s, {self.rate:g} requests/s to each service ({how});"
               f" windows of {self.block_s:g} s"]  # fmt: skip
        out.append(f"  RSS of the observed service: {self.rss_warm_mb:.1f} MB warmed up -> {self.rss_end_mb:.1f} MB at the"
                   f" end ({self.rss_end_mb - self.rss_warm_mb:+.1f} MB, highest {self.rss_max_mb:.1f});"
                   f" plain: {self.plain_rss_warm_mb:.1f} -> {self.plain_rss_end_mb:.1f} MB"
                   f" ({self.plain_rss_end_mb - self.plain_rss_warm_mb:+.1f} MB)")  # fmt: skip
        out.append(f"  the plain service's p50 is {p.p(50) / FLOOR_MS:.2f}x the provider's fixed wait ({FLOOR_MS:g} ms)")
        out.append(f"  requests: observed {o.done} ({o.errors} errors), plain {p.done} ({p.errors} errors);"
                   f" warm-up {self.other_done} ({self.other_errors} errors)")  # fmt: skip
        for q in (50, 99):
            pairs = self.pair_ratios(q)
            out.append(f"  p{q}: observed {o.p(q):.2f} ms, plain {p.p(q):.2f} ms: x{self.ratio(q):.3f} pooled;"
                       f" per window median x{statistics.median(pairs):.3f} (min {min(pairs):.3f}, max {max(pairs):.3f})")  # fmt: skip
        out.append(f"  CPU per request: observed {o.cpu_ms_per_request:.2f} ms, plain {p.cpu_ms_per_request:.2f} ms"
                   f" ({o.cpu_ms_per_request / max(p.cpu_ms_per_request, 1e-9) - 1:+.1%})"
                   + (f"; the sampler (latprof attach and py-spy) {self.sampler_cpu_s / max(self.wall_s, 1e-9):.1%}"
                      f" of a core" if self.mode == "attach" else ""))  # fmt: skip
        if self.mode == "run" and self.overhead.get("requests"):
            # What latprof says it cost, per request its hooks saw (warm-up included), against the
            # CPU per request measured side by side above (the writer's thread included in both).
            cost = self.overhead
            reported_ms = (float(cost.get("writer_cpu_ms", 0)) + float(cost.get("hook_ms", 0))) / int(cost["requests"])
            measured_ms = o.cpu_ms_per_request - p.cpu_ms_per_request
            out.append(f"  latprof's own cost as it reports it: {reported_ms * 1000:.1f} us CPU per request (writer"
                       f" {float(cost.get('writer_cpu_ms', 0)) * 1000 / int(cost['requests']):.1f}); measured side by side"
                       f" {measured_ms * 1000:+.1f} us" + (f": reported / measured {reported_ms / measured_ms:.2f}" if measured_ms > 0 else ""))
        if self.mode == "run":
            out.append(f"  capture: {self.roots} request roots standing for {self.represented} requests; the service"
                       f" answered {o.done + self.other_done} on {PATH} (other roots: {self.other_roots}); quality records"
                       f" {self.quality}")  # fmt: skip
        elif self.mode == "attach":
            out.append(f"  capture: {self.samples} samples; the longest time without one: {self.longest_gap_s:.1f} s")
        out.append(f"  log: {len(self.log_problems)} lines from latprof or a traceback; latprof exited with"
                   f" {self.latprof_exit}")  # fmt: skip
        missed = self.failures()
        out.append("  targets: " + ("all held" if not missed else "MISSED: " + "; ".join(missed)))
        return out


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its descendants (latprof attach and its py-spy processes)."""
    root = psutil.Process(pid)
    times = root.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system  # the py-spy runs that ended
    for proc in root.children(recursive=True):
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


async def _alternate(bases: tuple[str, str], rate: float, duration_s: float, window_s: float, seed: int,
                     timeout_s: float) -> tuple[list[LoadStats], list[LoadStats]]:  # fmt: skip
    stats: tuple[list[LoadStats], list[LoadStats]] = ([], [])
    windows = max(1, math.ceil(duration_s / window_s))
    for side in stats:
        side.extend(LoadStats() for _ in range(windows))
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    tasks: set[asyncio.Task[None]] = set()
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as first, \
            httpx.AsyncClient(limits=limits, timeout=timeout_s) as second:  # fmt: skip
        clients = (first, second)

        async def one(k: int, window: LoadStats, chat_id: int) -> None:
            start = time.perf_counter()
            try:
                response = await clients[k].get(f"{bases[k]}{PATH}", params={"chat_id": chat_id})
                if response.status_code >= 400:
                    window.errors += 1
                    if len(window.error_samples) < 5:
                        window.error_samples.append(f"HTTP {response.status_code}: {response.text[:200]}")
            except httpx.HTTPError as exc:
                window.errors += 1
                if len(window.error_samples) < 5:
                    window.error_samples.append(f"{type(exc).__name__}: {exc}")
            else:
                window.latencies_ms.append((time.perf_counter() - start) * 1000)
            finally:
                window.done += 1

        begin = time.perf_counter()
        next_at = 0.0
        n = 0
        while True:
            next_at += rng.expovariate(2 * rate)
            if next_at >= duration_s:
                break
            delay = next_at - (time.perf_counter() - begin)
            if delay > 0:
                await asyncio.sleep(delay)
            k = n % 2  # arrival n goes to service n % 2: ABAB... request by request
            window = stats[k][min(windows - 1, int(next_at // window_s))]
            window.sent += 1
            task = asyncio.create_task(one(k, window, rng.randrange(50)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        while tasks:  # the requests still in flight
            await asyncio.wait(set(tasks))
    return stats


def drive_alternating(bases: tuple[str, str], rate: float, duration_s: float, *, window_s: float = 10.0, seed: int = 1,
                      timeout_s: float = 60.0) -> tuple[list[LoadStats], list[LoadStats]]:  # fmt: skip
    """GET /chat-released on two services for `duration_s`: one stream of Poisson arrivals at 2 x `rate`
    (the same for a seed), sent to the two in turn, so each gets `rate` a second at the same
    time as the other; the outcome of each service, per window of `window_s` seconds of arrivals."""
    return asyncio.run(_alternate(bases, rate, duration_s, window_s, seed, timeout_s))


def read_run_capture(capture: Path, result: SoakResult) -> None:
    with open(capture, "rb") as f:
        for line in f:
            if line.startswith(b'{"type":"request"'):
                record = orjson.loads(line)
                if record.get("route") != f"GET {PATH}":  # the start's /health
                    route = str(record.get("route"))
                    result.other_roots[route] = result.other_roots.get(route, 0) + 1
                    continue
                result.roots += 1
                result.represented += int(record.get("attrs", {}).get(SAMPLE_WEIGHT, 1))
            elif line.startswith(b'{"type":"quality"'):
                record = orjson.loads(line)
                kind = str(record.get("kind"))
                result.quality[kind] = result.quality.get(kind, 0) + 1
                if kind == "hooks_loaded":
                    result.hooks_loaded = list(record.get("attrs", {}).get("collectors", []))
                elif kind == NOTE_OVERHEAD:
                    result.overhead = dict(record.get("attrs") or {})


def read_attach_capture(capture: Path, result: SoakResult, begin_ns: int, end_ns: int) -> None:
    """The samples, and the longest stretch of [begin, end) without a one-second window of them."""
    starts: set[int] = set()
    with open(capture, "rb") as f:
        for line in f:
            if line.startswith(b'{"type":"stack"'):
                record = orjson.loads(line)
                result.samples += int(record.get("weight", 1))
                starts.add(int(record["ts_ns"]))
    inside = sorted(t for t in starts if begin_ns - 1_000_000_000 < t < end_ns)
    edges = [begin_ns - 1_000_000_000, *inside, end_ns]  # a window that began up to 1 s before covers the start
    result.longest_gap_s = max(b - a for a, b in zip(edges, edges[1:])) / 1e9 - (1.0 if inside else 0.0)


def _sampled(result: SoakResult, observed: Service, progress: bool, where: str) -> None:
    result.rss_max_mb = max(result.rss_max_mb, observed.rss_mb())
    if progress:
        print(f"\r  {result.mode}: {where}, RSS {result.rss_max_mb:.1f} MB", end="", file=sys.stderr, flush=True)


def soak(mode: str, seconds: float, workdir: Path, *, rate: float = 20.0, interleave: str = "requests",
         block_s: float = 10.0, dsn: str = PG_DSN, warmup_s: float = WARMUP_S, progress: bool = False) -> SoakResult:  # fmt: skip
    """One soak of `mode` ("run", "attach", or CONTROL) for about `seconds`; files in `workdir`.

    `interleave` "requests": both services under load at once, the arrivals alternating between
    them (`drive_alternating`), compared per window of `block_s` seconds too; "blocks": one service at
    a time, blocks of `block_s` seconds, ABBA ABBA..."""
    if mode not in (*MODES, CONTROL):
        raise ValueError(f"mode {mode!r}: one of {MODES + (CONTROL,)}")
    if interleave not in INTERLEAVE:
        raise ValueError(f"interleave {interleave!r}: one of {INTERLEAVE}")
    result = SoakResult(mode, seconds, rate, block_s, interleave)
    capture = workdir / f"{mode}.jsonl"
    capture.unlink(missing_ok=True)  # `latprof run` appends
    with Provider(PROVIDER, subprocess=True) as provider:
        observed = start_service(f"{mode}-observed", dsn, provider.url, workdir, capture if mode == "run" else None)
        attach: subprocess.Popen[bytes] | None = None
        try:
            plain = start_service(f"{mode}-plain", dsn, provider.url, workdir, None)
            try:
                for service in (observed, plain):  # pools, imports, caches
                    warm = drive(service.base, PATH, WARMUP_RATE, warmup_s, seed=0, progress=None)
                    if service is observed:
                        result.other_done, result.other_errors = warm.done, warm.errors
                result.rss_warm_mb = result.rss_max_mb = observed.rss_mb()
                result.plain_rss_warm_mb = plain.rss_mb()
                if mode == "attach":  # its output into files: a pipe nobody reads for 10 minutes would fill and block it
                    with open(workdir / "attach.json", "wb") as out, open(workdir / "attach.err", "wb") as err:
                        attach = subprocess.Popen(
                            [sys.executable, "-m", "latprof", "attach", "--pid", str(observed.pid), "--duration",
                             f"{seconds * 2 + 120:g}", "--format", "json", "--out", str(capture)],
                            cwd=workdir, stdout=out, stderr=err,
                        )  # fmt: skip
                    time.sleep(2.0)  # py-spy attached and sampling
                    if attach.poll() is not None:
                        raise SoakError(f"latprof attach exited with {attach.returncode}: "
                                        f"{(workdir / 'attach.err').read_text(errors='replace')[-2000:]}")  # fmt: skip
                    sampler_cpu0 = tree_cpu_s(attach.pid)
                begin_ns = time.time_ns()
                sides = ((observed, result.observed), (plain, result.plain))
                if interleave == "blocks":
                    for i in range(max(1, round(seconds / (2 * block_s)))):
                        for service, side in sides if i % 2 == 0 else sides[::-1]:  # ABBA ABBA...
                            cpu0 = service.cpu_s()
                            side.blocks.append(drive(service.base, PATH, rate, block_s, seed=1000 + i, progress=None))
                            side.cpu_s += service.cpu_s() - cpu0
                        _sampled(result, observed, progress, f"{2 * (i + 1) * block_s:g}/{seconds:g} s")
                else:
                    chunks = max(1, math.ceil(seconds / CHUNK_S))
                    for i in range(chunks):
                        cpu_before = [service.cpu_s() for service, _ in sides]
                        outcome = drive_alternating((observed.base, plain.base), rate, seconds / chunks,
                                                    window_s=block_s, seed=1000 + i)  # fmt: skip
                        for (service, side), windows, before in zip(sides, outcome, cpu_before):
                            side.blocks += windows
                            side.cpu_s += service.cpu_s() - before
                        _sampled(result, observed, progress, f"{(i + 1) * seconds / chunks:g}/{seconds:g} s")
                end_ns = time.time_ns()
                result.wall_s = (end_ns - begin_ns) / 1e9
                if attach is not None:
                    result.sampler_cpu_s = tree_cpu_s(attach.pid) - sampler_cpu0
                if progress:
                    print(file=sys.stderr)
                result.rss_end_mb = observed.rss_mb()
                result.plain_rss_end_mb = plain.rss_mb()
                if attach is not None:
                    attach.send_signal(signal.SIGINT)  # ends the session: the capture is closed, the report printed
                    result.latprof_exit = attach.wait(300)
                    result.latprof_stderr = (workdir / "attach.err").read_text(errors="replace")
                    attach = None
                    read_attach_capture(capture, result, begin_ns, end_ns)
                    try:
                        result.attach_report = orjson.loads((workdir / "attach.json").read_bytes())
                    except orjson.JSONDecodeError:
                        pass
            finally:
                result.plain_exit = stop_service(plain)
        finally:
            if attach is not None and attach.poll() is None:
                attach.kill()
                attach.wait()
            code = stop_service(observed)
    if mode != "attach":
        result.latprof_exit = code
    if mode == "run":
        read_run_capture(capture, result)
    result.observed_log = observed.log.read_text(errors="replace")
    if mode == "run":  # latprof run writes no stderr of its own into the log but its last line
        result.latprof_stderr = result.observed_log[-2000:]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=600.0, help="the soak's load per mode (default 600)")
    parser.add_argument("--modes", default="run,attach", help="run, attach, or both (comma-separated); control:"
                        " both services plain (what the machine's noise alone gives)")  # fmt: skip
    parser.add_argument("--rate", type=float, help="requests a second to each service while it is loaded (Poisson;"
                        " default 20 with --interleave requests, 40 with blocks)")  # fmt: skip
    parser.add_argument("--interleave", choices=INTERLEAVE, default="requests", help="requests: both services at"
                        " once, the arrivals alternating between them; blocks: one at a time, ABBA blocks")  # fmt: skip
    parser.add_argument("--block", type=float, help="seconds of a window compared (requests; default 10) or of a"
                        " block (blocks; default 3)")  # fmt: skip
    parser.add_argument("--warmup", type=float, default=WARMUP_S, help="seconds of load on each service first")
    parser.add_argument("--dsn", default=PG_DSN, help="the PostgreSQL the services read (default $LATPROF_TEST_PG or"
                        " postgresql://postgres@127.0.0.1:5432/test)")  # fmt: skip
    parser.add_argument("--keep", type=Path, help="keep the captures and logs in this folder")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - {*MODES, CONTROL})
    if unknown or not modes:
        parser.error(f"--modes: one or more of {', '.join(MODES + (CONTROL,))}")
    missed = False
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix="latprof-soak-") as tmp:
            workdir = args.keep or Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            try:
                block_s = args.block or (10.0 if args.interleave == "requests" else 3.0)
                rate = args.rate or (20.0 if args.interleave == "requests" else 40.0)
                result = soak(mode, args.seconds, workdir, rate=rate, interleave=args.interleave, block_s=block_s, dsn=args.dsn,
                              warmup_s=args.warmup, progress=True)  # fmt: skip
            except SoakError as exc:
                print(f"soak: {exc}", file=sys.stderr)
                sys.exit(2)
        print("\n".join(result.lines()), flush=True)
        missed = missed or bool(result.failures())
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
