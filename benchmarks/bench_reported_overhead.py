"""Does the cost latprof reports for itself agree with the cost measured side by side? One run.

    python benchmarks/bench_reported_overhead.py [--rounds 6] [--seconds 3] [--connections 16]
                                                 [--server uvicorn|gunicorn|aiohttp]
                                                 [--max-rates 250,0]

The service of `bench_overhead.py` (`overhead_app.py` under uvicorn, or `--server gunicorn` /
`aiohttp`) runs plain and once per `--max-rates` entry with the hooks loaded as `latprof run`
loads them, recording into a capture. A closed-loop client loads one server at a time, the
order rotating round by round, all servers pinned to CPU 0 and the client to CPU 1 (on two
CPUs or more), so each configuration runs under the same load and the same noise.

Measured side by side: the server's CPU per request (all its processes and threads), hooked
minus plain, the medians over rounds. Reported: the hooked server's own `overhead` records
(the latest of each process, written every 2 s at most while it records;
`latprof.collectors.hooks.runtime.cost`): its writer thread's CPU plus the estimated time in
the hooks' own code (the recording functions and the stretches of hook code around them),
divided by the requests it served until that record
(warm-up included, as its hooks counted them). The ratio reported / measured says how much of
the real cost latprof's own figure catches; `added_ms_per_request` (per request served, recorded
or not) is comparable with the measured CPU per request less the writer's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import Server, _load, cpu_s, start_server, stop  # noqa: E402

from latprof.collectors.hooks.launcher import hooked_environment  # noqa: E402
from latprof.collectors.hooks.runtime import OVERHEAD_REPORT_INTERVAL_S  # noqa: E402
from latprof.semconv import NOTE_OVERHEAD, OVERHEAD_SOURCE, OVERHEAD_SOURCE_HOOKS  # noqa: E402


def load(server: Server, seconds: float, connections: int, warmup_s: float) -> tuple[dict[str, float], int]:
    """One round: (the measured part's rates, every request served in the round, warm-up included)."""
    warm = asyncio.run(_load(server.port, warmup_s, connections))
    cpu0 = cpu_s(server)
    t0 = time.perf_counter()
    latencies = asyncio.run(_load(server.port, seconds, connections))
    elapsed = time.perf_counter() - t0
    cpu = cpu_s(server) - cpu0
    n = len(latencies)
    return {"rps": n / elapsed, "cpu_us": cpu / n * 1e6}, n + len(warm)


def reported(capture: Path) -> dict[int, dict[str, object]]:
    """The last `overhead` record of the hooks, by process."""
    last: dict[int, dict[str, object]] = {}
    with open(capture, "rb") as f:
        for line in f:
            if b'"overhead"' in line:
                event = orjson.loads(line)
                attrs = event.get("attrs") or {}
                if event.get("kind") == NOTE_OVERHEAD and attrs.get(OVERHEAD_SOURCE) == OVERHEAD_SOURCE_HOOKS:
                    last[int(event["pid"])] = attrs
    return last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per configuration")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured load per round")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured load before each round")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--server", default="uvicorn", choices=["uvicorn", "gunicorn", "aiohttp"])
    parser.add_argument("--hooks", default="all", help="the hooks of the hooked servers, as for `latprof run --hooks`")
    parser.add_argument("--max-rates", default="250,0", help="`latprof run --max-rate` of each hooked server")
    args = parser.parse_args()
    rates = [float(r) for r in args.max_rates.split(",") if r.strip()]

    two_cpus = len(os.sched_getaffinity(0)) >= 2
    server_cpu, client_cpu = (0, 1) if two_cpus else (None, None)
    if client_cpu is not None:
        os.sched_setaffinity(0, {client_cpu})
    with tempfile.TemporaryDirectory(prefix="latprof-bench-") as tmp:
        plain_env = {k: v for k, v in os.environ.items() if not k.startswith("LATPROF_")}
        captures = [Path(tmp) / f"rate-{i}.jsonl" for i in range(len(rates))]
        servers = [start_server("plain", plain_env, "httptools", "uvloop", server_cpu, args.server)]
        for rate, capture in zip(rates, captures):
            env = hooked_environment(capture, args.hooks, environ=plain_env, max_rate=rate)
            servers.append(start_server(f"--max-rate {rate:g}", env, "httptools", "uvloop", server_cpu, args.server))
        served = {server.name: 0 for server in servers}
        try:
            for r in range(args.rounds):  # the order rotates round by round
                for k in range(len(servers)):
                    server = servers[(r + k) % len(servers)]
                    rates_of_round, n = load(server, args.seconds, args.connections, args.warmup)
                    server.rounds.append(rates_of_round)
                    served[server.name] += n
            # uvicorn re-raises SIGTERM after its shutdown, past atexit: the servers' latest periodic
            # `overhead` record is what the capture keeps, so let one be written after the load.
            time.sleep(OVERHEAD_REPORT_INTERVAL_S + 1)
        finally:
            for server in servers:
                stop(server)
        records = [reported(capture) for capture in captures]

    print(f"python {sys.version.split()[0]}, {args.server}, {args.connections} connections, {args.rounds} rounds x"
          f" {args.seconds:g} s per configuration (pinned: {two_cpus}); noisy if other work shares the machine")  # fmt: skip
    med = {s.name: {key: statistics.median(r[key] for r in s.rounds) for key in s.rounds[0]} for s in servers}
    plain = med["plain"]
    print(f"plain: {plain['rps']:.0f} req/s, {plain['cpu_us']:.1f} us CPU per request")
    for server, by_pid in zip(servers[1:], records):
        m = med[server.name]
        measured_us = m["cpu_us"] - plain["cpu_us"]
        if not by_pid:
            print(f"{server.name}: no overhead record in the capture")
            continue
        def total(key: str) -> float:
            return sum(float(a[key]) for a in by_pid.values())  # type: ignore[arg-type]

        writer_ms, hook_ms, cpu_percent = (total(k) for k in ("writer_cpu_ms", "hook_ms", "cpu_percent"))
        recorded, counted = int(total("recorded_requests")), int(total("requests"))
        n = served[server.name]
        # Per request the hooks counted until their latest record (uvicorn exits on a re-raised
        # SIGTERM, past atexit: the load of the last seconds before the pause may be in none).
        reported_us = (writer_ms + hook_ms) * 1000 / max(counted, 1)
        print(f"{server.name}: {m['rps']:.0f} req/s, {m['cpu_us']:.1f} us CPU per request; {n:,} requests served"
              f" ({counted:,} counted by the hooks), {recorded:,} recorded")  # fmt: skip
        print(f"  measured side by side: +{measured_us:.2f} us CPU per request ({measured_us / plain['cpu_us']:+.1%}),"
              f" {measured_us * m['rps'] / 1e4:.2f}% of a core while loaded")  # fmt: skip
        print(f"  reported by latprof:   +{reported_us:.2f} us CPU per request served (writer {writer_ms * 1000 / max(counted, 1):.2f},"
              f" hook code {hook_ms * 1000 / max(counted, 1):.2f}); cpu_percent {cpu_percent:.3g}% of a core over the process's life")  # fmt: skip
        if measured_us > 0:
            print(f"  reported / measured: {reported_us / measured_us:.2f}")
        added = [float(a["added_ms_per_request"]) for a in by_pid.values() if a.get("added_ms_per_request") is not None]  # type: ignore[arg-type]
        if added:
            print(f"  added_ms_per_request reported: {added[-1] * 1000:.2f} us per request ({recorded / n:.0%} of requests recorded)")


if __name__ == "__main__":
    main()
