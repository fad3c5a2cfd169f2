"""What the hooks cost a saturated service: the same uvicorn app with all hooks on and off, one run.

    python benchmarks/bench_overhead.py [--rounds 6] [--seconds 4] [--connections 16]
                                        [--http httptools] [--loop uvloop]
                                        [--server uvicorn|gunicorn|aiohttp]

Three copies of `overhead_app.py` (FastAPI, an endpoint without I/O) run side by side: one
plain, and two with latprof's hooks loaded exactly as `latprof run` loads them (recording
into a capture file): one as `latprof run` does by default (at most about 250 requests a
second recorded, a weighted random sample above that), one with `--max-rate 0` (every
request recorded). A closed-loop client keeps `--connections` keep-alive connections busy on
one server at a time, rotating between them round by round (the order shifts every round), so
that the machine's noise hits all alike. The servers are pinned to CPU 0 and the client to
CPU 1 when the machine has two CPUs or more, so the service's CPU is the bottleneck:
throughput is what the service can do, and the hooks' cost (their writer thread included)
shows in it.

`--server gunicorn` runs the same endpoint as a Flask app (`overhead_wsgi.py`) under one
gunicorn gthread worker with 4 threads (keep-alive: the client's connections stay open), and
`--server aiohttp` as an `aiohttp.web` app (`overhead_aiohttp.py`); the server's CPU is its
processes' (gunicorn's master and worker).

Per configuration, the median over its rounds of: requests per second, client-side p50 and
p99, and the server's CPU time per request (all its threads). The hooked servers' captures
are checked at the end: with every request recorded, one request root per response; with a
sample, the roots' weights must add up to the responses (within 10%), or the comparison is void.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import psutil

from latprof.collectors.hooks.launcher import hooked_environment
from latprof.semconv import DEFAULT_MAX_RATE, SAMPLE_WEIGHT

HERE = Path(__file__).resolve().parent


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    rounds: list[dict[str, float]] = field(default_factory=list)

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.proc.pid)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(server: str, port: int, http: str, loop: str, workers: int = 1) -> list[str]:
    if server == "gunicorn":
        return [
            sys.executable, "-m", "gunicorn", "overhead_wsgi:app", "--chdir", str(HERE), "-b", f"127.0.0.1:{port}",
            "-k", "gthread", "--threads", "4", "-w", str(workers), "--log-level", "warning",
        ]  # fmt: skip
    if server == "aiohttp":
        return [sys.executable, str(HERE / "overhead_aiohttp.py"), str(port)]
    return [
        sys.executable, "-m", "uvicorn", "overhead_app:app", "--app-dir", str(HERE),
        "--host", "127.0.0.1", "--port", str(port), "--http", http, "--loop", loop,
        "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip


def start_server(
    name: str, env: dict[str, str], http: str, loop: str, cpu: int | None, server: str = "uvicorn", workers: int = 1
) -> Server:
    port = free_port()
    cmd = server_command(server, port, http, loop, workers)
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None  # workers forked later inherit it
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen(cmd, env=env, cwd=HERE, start_new_session=True, preexec_fn=pin)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/profile/1", timeout=1).status_code == 200:
                return Server(name, proc, port)
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"bench_overhead: the {name} server did not start (exit code {proc.poll()})")
        time.sleep(0.1)


def cpu_s(server: Server) -> float:
    """User + system CPU seconds of the server's processes (a gunicorn master and its workers)."""
    total = 0.0
    procs = [server.ps]
    try:
        procs += server.ps.children(recursive=True)
    except psutil.Error:
        pass
    for proc in procs:
        try:
            total += sum(proc.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


async def _connection(port: int, stop_at: float, latencies: list[float], k: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = f"GET /profile/{k} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".encode()
    clock = time.perf_counter
    try:
        while clock() < stop_at:
            t0 = clock()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
                    break
            await reader.readexactly(length)
            latencies.append(clock() - t0)
    finally:
        writer.close()


async def _load(port: int, seconds: float, connections: int) -> list[float]:
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    await asyncio.gather(*(_connection(port, stop_at, latencies, k) for k in range(connections)))
    return latencies


def load(server: Server, seconds: float, connections: int, warmup_s: float) -> dict[str, float]:
    asyncio.run(_load(server.port, warmup_s, connections))
    cpu0 = cpu_s(server)
    t0 = time.perf_counter()
    latencies = asyncio.run(_load(server.port, seconds, connections))
    elapsed = time.perf_counter() - t0
    cpu = cpu_s(server) - cpu0
    latencies.sort()
    n = len(latencies)
    return {
        "rps": n / elapsed,
        "p50_ms": latencies[n // 2] * 1e3,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1e3,
        "cpu_us": cpu / n * 1e6,
        "requests": n,
    }


def stop(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(20)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


def count_roots(capture: Path) -> tuple[int, int]:
    """(request roots, the requests they stand for: the sum of their sample weights)."""
    roots = represented = 0
    with open(capture, "rb") as f:
        for line in f:
            if line.startswith(b'{"type":"request"'):
                roots += 1
                represented += int(orjson.loads(line).get("attrs", {}).get(SAMPLE_WEIGHT, 1))
    return roots, represented


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per configuration")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured load per round")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured load before each round")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--http", default="httptools", choices=["h11", "httptools"])
    parser.add_argument("--loop", default="uvloop", choices=["asyncio", "uvloop"])
    parser.add_argument("--server", default="uvicorn", choices=["uvicorn", "gunicorn", "aiohttp"])
    parser.add_argument("--hooks", default="all", help="the hooks of the hooked servers, as for `latprof run --hooks`")
    parser.add_argument(
        "--max-rate", type=float, default=DEFAULT_MAX_RATE, help="`latprof run --max-rate` of the sampled server"
    )
    args = parser.parse_args()

    two_cpus = len(os.sched_getaffinity(0)) >= 2
    server_cpu, client_cpu = (0, 1) if two_cpus else (None, None)
    if client_cpu is not None:
        os.sched_setaffinity(0, {client_cpu})
    with tempfile.TemporaryDirectory(prefix="latprof-bench-") as tmp:
        sampled_capture = Path(tmp) / "sampled.jsonl"
        all_capture = Path(tmp) / "all.jsonl"
        plain_env = {k: v for k, v in os.environ.items() if not k.startswith("LATPROF_")}
        servers = [
            start_server("hooks off", plain_env, args.http, args.loop, server_cpu, args.server),
            start_server(
                "hooks on",
                hooked_environment(sampled_capture, args.hooks, environ=plain_env, max_rate=args.max_rate),
                args.http, args.loop, server_cpu, args.server,
            ),
            start_server(
                "every request",
                hooked_environment(all_capture, args.hooks, environ=plain_env, max_rate=0),
                args.http, args.loop, server_cpu, args.server,
            ),
        ]  # fmt: skip
        try:
            for r in range(args.rounds):  # the order rotates: off, on, all / on, all, off / ...
                for k in range(len(servers)):
                    server = servers[(r + k) % len(servers)]
                    server.rounds.append(load(server, args.seconds, args.connections, args.warmup))
        finally:
            for server in servers:
                stop(server)
        sampled_roots, sampled_represented = count_roots(sampled_capture)
        all_roots, _ = count_roots(all_capture)
    off, on, every = servers
    measured_on = sum(int(r["requests"]) for r in on.rounds)
    measured_all = sum(int(r["requests"]) for r in every.rounds)

    print(
        f"python {sys.version.split()[0]}, "
        + (f"uvicorn --http {args.http} --loop {args.loop}" if args.server == "uvicorn" else args.server)
        + f", {args.connections} connections,"
        f" {args.rounds} rounds x {args.seconds:g} s per configuration (pinned: {two_cpus})"
    )
    print(f"{'':<15}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'CPU us/req':>12}")
    med = {}
    for server in servers:
        med[server.name] = {key: statistics.median(r[key] for r in server.rounds) for key in server.rounds[0]}
        m = med[server.name]
        print(f"{server.name:<15}{m['rps']:>10.0f}{m['p50_ms']:>10.2f}{m['p99_ms']:>10.2f}{m['cpu_us']:>12.1f}")
    a = med["hooks off"]
    for name, label in (("hooks on", f"hooks on (--max-rate {args.max_rate:g})"), ("every request", "hooks on (--max-rate 0)")):
        b = med[name]
        print(
            f"{label} vs off: {b['cpu_us'] - a['cpu_us']:+.1f} us CPU per request ({b['cpu_us'] / a['cpu_us'] - 1:+.1%}),"
            f" throughput {b['rps'] / a['rps'] - 1:+.1%}, p50 {b['p50_ms'] / a['p50_ms'] - 1:+.1%}"
        )
        server = on if name == "hooks on" else every
        per_round = [f"{x['rps'] / y['rps'] - 1:+.1%}" for x, y in zip(server.rounds, off.rounds)]
        print(f"  throughput change per round: {', '.join(per_round)}")
    # Warm-up requests are recorded too: the captures hold at least every measured request.
    print(
        f"capture check: sampled, {sampled_roots:,} roots standing for {sampled_represented:,} requests"
        f" for {measured_on:,} measured (plus warm-up); every request, {all_roots:,} roots for {measured_all:,} measured"
    )
    if all_roots < measured_all:
        raise SystemExit("bench_overhead: the server recording every request recorded fewer than it served")
    if sampled_represented < 0.9 * measured_on:
        raise SystemExit("bench_overhead: the sampled server's weights stand for fewer requests than it served")


if __name__ == "__main__":
    main()
