"""What `latprof attach --inject` costs a service, and how soon it records, side by side in one run.

    python benchmarks/bench_inject.py [--rounds 6] [--seconds 4] [--connections 16] [--injections 5]

Three copies of `overhead_app.py` (FastAPI under uvicorn, an endpoint without I/O; see
bench_overhead.py) run side by side, nothing pinned: the services, the client and latprof
share every core, as on a small real host.

- `plain`: never touched;
- `run`: started by `latprof run`'s hook loader (the default `--max-rate`);
- `inject`: started plainly, then injected (`InjectSession`, all hooks, the default
  `--max-rate`) for the whole of phase 2, and detached before phase 3.

1. **Getting in** (on the idle `inject` service, `--injections` times): from the start of the
   session to the moment its hooks record (any request arriving from then on is recorded;
   target <= 2 s), and how long gdb held the process (attach to detach).
2. **While injected**: rounds rotate between the three services (the order shifts every
   round); per service the median over rounds of requests per second and client p50/p99, as
   ratios to `plain` (target: `inject` costs what `run` costs).
3. **After detach**: rounds rotate between `plain`, `inject` and `plain2` (a fourth copy,
   never touched: how far two untouched copies differ is the noise floor); the ratios
   (target: none measurable, i.e. within that floor).

Getting in is measured on the idle service and again while the client saturates it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_overhead as bo  # noqa: E402  (the same server start and closed-loop client)

from latprof.collectors.hooks.bootstrap import hook_names  # noqa: E402
from latprof.collectors.hooks.launcher import hooked_environment  # noqa: E402
from latprof.inject.session import InjectSession  # noqa: E402
from latprof.semconv import DEFAULT_MAX_RATE  # noqa: E402


def get_in(server: bo.Server, folder: Path, times: int, tag: str = "idle") -> tuple[list[float], list[float]]:
    """(seconds from session start to recording, ms held by gdb) of `times` injections of 1 s each."""
    ready, held = [], []
    for i in range(times):
        started = time.perf_counter()
        seen: list[float] = []

        def progress(message: str) -> None:
            if message.startswith("recording in"):
                seen.append(time.perf_counter() - started)

        session = InjectSession(server.proc.pid, str(folder / f"get-in-{tag}-{i}.jsonl"), duration_s=1, hooks=hook_names(),
                                max_rate=DEFAULT_MAX_RATE, on_progress=progress)  # fmt: skip
        results = session.run()
        if not seen or results[0].outcome != "recorded" or results[0].held_ms is None:
            raise SystemExit(f"bench_inject: injection {i} did not record: {results}")
        ready.append(seen[0])
        held.append(results[0].held_ms)
    return ready, held


def rounds(servers: list[bo.Server], n: int, seconds: float, connections: int) -> dict[str, dict[str, float]]:
    for server in servers:
        server.rounds.clear()
    for r in range(n):
        for k in range(len(servers)):
            server = servers[(r + k) % len(servers)]
            server.rounds.append(bo.load(server, seconds, connections, warmup_s=0.5))
    return {s.name: {key: statistics.median(x[key] for x in s.rounds) for key in ("rps", "p50_ms", "p99_ms")} for s in servers}


def table(title: str, medians: dict[str, dict[str, float]]) -> None:
    base = medians["plain"]
    print(f"\n{title}")
    print(f"{'service':<8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'req/s vs plain':>15} {'p50 vs plain':>13}")
    for name, m in medians.items():
        print(f"{name:<8} {m['rps']:>8.0f} {m['p50_ms']:>8.2f} {m['p99_ms']:>8.2f} {m['rps'] / base['rps'] - 1:>+15.1%}"
              f" {m['p50_ms'] / base['p50_ms'] - 1:>+13.1%}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--injections", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        env = dict(__import__("os").environ)
        plain = bo.start_server("plain", env, "h11", "asyncio", None)
        run = bo.start_server("run", hooked_environment(folder / "run.jsonl", max_rate=DEFAULT_MAX_RATE, environ=env),
                              "h11", "asyncio", None)  # fmt: skip
        inject = bo.start_server("inject", env, "h11", "asyncio", None)
        control = bo.start_server("plain2", env, "h11", "asyncio", None)  # never touched: the noise floor
        try:
            ready, held = get_in(inject, folder, args.injections)
            print(f"getting in ({args.injections} injections into the idle service): recording after"
                  f" {statistics.median(ready):.2f} s (max {max(ready):.2f}); gdb held it {statistics.median(held):.1f} ms"
                  f" (max {max(held):.1f})")  # fmt: skip
            loaded: list[dict[str, float]] = []
            loader = threading.Thread(target=lambda: loaded.append(bo.load(inject, args.injections * 2.5 + 3, args.connections, 0.5)))
            loader.start()
            time.sleep(1)
            ready, held = get_in(inject, folder, args.injections, "loaded")
            loader.join()
            print(f"getting in ({args.injections} injections into the service saturated by the client): recording after"
                  f" {statistics.median(ready):.2f} s (max {max(ready):.2f}); gdb held it {statistics.median(held):.1f} ms"
                  f" (max {max(held):.1f})")  # fmt: skip
            long = args.rounds * 3 * (args.seconds + 1) + 60
            session = InjectSession(inject.proc.pid, str(folder / "inject.jsonl"), duration_s=long, hooks=hook_names(),
                                    max_rate=DEFAULT_MAX_RATE)  # fmt: skip
            thread = threading.Thread(target=session.run)
            thread.start()
            while not session.recording:  # the hooks are in
                time.sleep(0.05)
            during = rounds([plain, run, inject], args.rounds, args.seconds, args.connections)
            session.stop()
            thread.join()
            (result,) = session.results
            table("while injected (median of rounds)", during)
            print(f"  inject: held {result.held_ms:.1f} ms under no load; detach: {result.detach}")
            after = rounds([plain, control, inject], args.rounds, args.seconds, args.connections)
            table("after detach (median of rounds)", after)
        finally:
            for server in (plain, run, inject, control):
                bo.stop(server)


if __name__ == "__main__":
    main()
