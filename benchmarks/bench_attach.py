"""What `latprof attach` costs a saturated service, and how soon it reports, side by side in one run.

    python benchmarks/bench_attach.py [--rounds 6] [--seconds 5] [--rate 100] [--connections 16] [--shared]
                                      [--sampler latprof|py-spy]

One gunicorn service (`overhead_wsgi.py`: Flask, one gthread worker with 4 threads, pinned to
CPU 0) is saturated by a closed-loop client (`bench_overhead.py`'s, on CPU 1) round after
round, alternately alone and while `latprof attach --pid MASTER --rate R` samples it (master
and worker, the default; the sampler is not pinned: it runs where the scheduler puts it). Per configuration, the median over its rounds of requests per
second and client-side p50; for the attached rounds also the CPU the sampler used (latprof
and its py-spy processes, all children counted) as a share of one core, and how long after
the end of `--duration` the report was printed (target <= 2 s). Targets: throughput and p50
within 2%.

`--interleave SLOT` (with `--shared`) runs one sampler for the whole benchmark and stops and
continues it (SIGSTOP/SIGCONT to latprof and its py-spy processes) every SLOT seconds while the
client loads the service without a break: adjacent slots with and without sampling are
compared pair by pair, so the drift of a noisy machine (minutes of other load) cancels out
(`--rounds` pairs; throughput change: the median over pairs, with its interquartile range).

`--shared` is the small real host instead: nothing pinned, one gthread worker per CPU, so
the service, its client and the sampler share every core and the sampler's CPU is taken
from the service (target: throughput within 5%). `--sampler py-spy` runs `py-spy record
--subprocesses` alone at the same rate instead of latprof: the floor of sampling the stacks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_overhead as bo  # noqa: E402  (the same server start and closed-loop client)


def tree_cpu_s(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def unpinned() -> None:
    """The sampler runs where the scheduler puts it (as beside a real service), not on the client's CPU only."""
    os.sched_setaffinity(0, range(os.cpu_count() or 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--sampler", choices=["latprof", "py-spy"], default="latprof",
                        help="what samples the service: latprof attach, or py-spy record alone (its floor)")
    parser.add_argument("--nice", type=int, default=0, help="run the sampler under nice -n N")
    parser.add_argument("--shared", action="store_true", help="pin nothing: one worker per CPU, all sharing every core")
    parser.add_argument("--interleave", type=float, default=0.0, metavar="SLOT",
                        help="one sampler, stopped and continued every SLOT seconds; compare adjacent slots")
    parser.add_argument("--fresh", action="store_true",
                        help="with --interleave: a new `latprof attach --duration SLOT` for each slot with sampling")
    args = parser.parse_args()

    cpus = len(os.sched_getaffinity(0))
    two_cpus = cpus >= 2 and not args.shared
    server_cpu, client_cpu = (0, 1) if two_cpus else (None, None)
    if client_cpu is not None:
        os.sched_setaffinity(0, {client_cpu})
    env = {k: v for k, v in os.environ.items() if not k.startswith("LATPROF_")}
    server = bo.start_server("service", env, "", "", server_cpu, "gunicorn", workers=cpus if args.shared else 1)
    if args.interleave:
        try:
            interleaved(server, args, cpus)
        finally:
            bo.stop(server)
        return
    plain: list[dict[str, float]] = []
    attached: list[dict[str, float]] = []
    sampler_cpu: list[float] = []
    report_delay: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="latprof-bench-") as tmp:
            for r in range(args.rounds):
                for with_attach in ((False, True) if r % 2 == 0 else (True, False)):
                    if not with_attach:
                        plain.append(bo.load(server, args.seconds, args.connections, args.warmup))
                        continue
                    duration = int(args.seconds + args.warmup + 2)
                    started = time.monotonic()
                    if args.sampler == "py-spy":  # py-spy alone, as a user would run it on the same processes
                        command = [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(server.proc.pid),
                                   "--subprocesses", "--duration", str(duration), "--rate", str(args.rate), "--idle",
                                   "--nonblocking", "--format", "raw", "--output", str(Path(tmp) / f"py-spy-{r}.txt")]
                    else:
                        command = [sys.executable, "-m", "latprof", "attach", "--pid", str(server.proc.pid), "--duration",
                                   str(duration), "--rate", str(args.rate), "--format", "json", "--out",
                                   str(Path(tmp) / f"attach-{r}.jsonl")]
                    if args.nice:
                        command = ["nice", "-n", str(args.nice), *command]
                    attach = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=unpinned)
                    watcher = psutil.Process(attach.pid)
                    time.sleep(1.0)  # attached and sampling
                    cpu0, t0 = tree_cpu_s(watcher), time.monotonic()
                    attached.append(bo.load(server, args.seconds, args.connections, args.warmup))
                    cpu1, t1 = tree_cpu_s(watcher), time.monotonic()
                    sampler_cpu.append((cpu1 - cpu0) / (t1 - t0) * 100)
                    attach.communicate(timeout=duration + 60)
                    report_delay.append(time.monotonic() - (started + duration))
                    if attach.returncode != 0:
                        raise SystemExit(f"bench_attach: {args.sampler} failed (exit {attach.returncode})")
    finally:
        bo.stop(server)
    a = {k: statistics.median(x[k] for x in plain) for k in ("rps", "p50_ms")}
    b = {k: statistics.median(x[k] for x in attached) for k in ("rps", "p50_ms")}
    print(f"python {sys.version.split()[0]}, gunicorn gthread, {args.connections} connections, {args.rounds} rounds x"
          f" {args.seconds:g} s per configuration, {args.sampler} at {args.rate} Hz"
          f" ({'shared: nothing pinned, ' + str(cpus) + ' workers' if args.shared else 'pinned: ' + str(two_cpus)})")
    print(f"alone:    {a['rps']:.0f} req/s, p50 {a['p50_ms']:.2f} ms")
    print(f"attached: {b['rps']:.0f} req/s, p50 {b['p50_ms']:.2f} ms")
    print(f"change: throughput {b['rps'] / a['rps'] - 1:+.1%}, p50 {b['p50_ms'] / a['p50_ms'] - 1:+.1%} (target within {'5' if args.shared else '2'}%)")
    pairs = ", ".join(f"{x['rps'] / y['rps'] - 1:+.1%}" for x, y in zip(attached, plain))
    print(f"  per round pair: {pairs}")
    cpu = statistics.median(sampler_cpu)
    print(f"sampler CPU: {cpu:.1f}% of one core, {cpu / cpus:.1f}% of the machine's {cpus} ({'latprof and its py-spy' if args.sampler == 'latprof' else 'py-spy'}, median)")
    if args.sampler == "latprof":
        print(f"report printed {statistics.median(report_delay):.2f} s after the end of --duration (median; max"
              f" {max(report_delay):.2f} s; target <= 2 s)")


def _signal_tree(proc: psutil.Process, sig: int) -> None:
    for p in [proc, *proc.children(recursive=True)]:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


class _Stamps(list):  # type: ignore[type-arg]
    """What `bench_overhead._connection` appends to: the time each answer completed, not its latency."""

    def append(self, _latency: float) -> None:
        super().append(time.perf_counter())


def interleaved(server: bo.Server, args: argparse.Namespace, cpus: int) -> None:
    """`--interleave`: one sampler and one client (its connections kept open, so the workers
    share them the same way throughout) for the whole run; the sampler stopped and continued
    slot by slot; requests completed per slot, less its first quarter second."""
    import asyncio
    import signal
    import threading

    slot = args.interleave
    total = args.rounds * 2 * slot + 6.0
    duration = int(total + args.warmup + 10)
    stamps = _Stamps()

    async def client() -> None:
        stop_at = time.perf_counter() + total
        await asyncio.gather(*(bo._connection(server.port, stop_at, stamps, k) for k in range(args.connections)))

    with tempfile.TemporaryDirectory(prefix="latprof-bench-") as tmp:
        command = [sys.executable, "-m", "latprof", "attach", "--pid", str(server.proc.pid), "--duration", str(duration),
                   "--rate", str(args.rate), "--format", "json", "--out", str(Path(tmp) / "attach.jsonl")]
        if args.sampler == "py-spy":
            command = [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(server.proc.pid),
                       "--subprocesses", "--duration", str(duration), "--rate", str(args.rate), "--idle", "--nonblocking",
                       "--format", "raw", "--output", str(Path(tmp) / "py-spy.txt")]
        loader = threading.Thread(target=lambda: asyncio.run(client()), daemon=True)
        slots: list[tuple[bool, float, float]] = []
        on_cpu = []
        if args.fresh:  # a whole attach per slot: its start, its sampling and its report, as a user runs it
            total += args.rounds * 2 * 2.0  # an attach outlasts its --duration by its start and report
            loader.start()
            time.sleep(3.0)
            for r in range(args.rounds):
                for sampling in ((True, False) if r % 2 == 0 else (False, True)):
                    t0 = time.perf_counter()
                    if sampling:
                        fresh = command[:command.index("--duration") + 1] + [f"{slot:g}"] + command[command.index("--duration") + 2:]
                        run = subprocess.Popen(fresh, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=unpinned)
                        watcher = psutil.Process(run.pid)
                        cpu = 0.0
                        while run.poll() is None:
                            cpu = max(cpu, tree_cpu_s(watcher))
                            time.sleep(0.1)
                        on_cpu.append(cpu / (time.perf_counter() - t0) * 100)
                        slot_s = time.perf_counter() - t0
                    else:
                        time.sleep(slot_s if slots else slot + 1.5)
                    slots.append((sampling, t0 + 0.25, time.perf_counter()))
            loader.join(total + 30)
        else:
            sampler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=unpinned)
            watcher = psutil.Process(sampler.pid)
            loader.start()
            time.sleep(3.0)  # attached and sampling, the client warm
            try:
                for r in range(args.rounds):
                    for sampling in ((True, False) if r % 2 == 0 else (False, True)):
                        _signal_tree(watcher, signal.SIGCONT if sampling else signal.SIGSTOP)
                        cpu0, t0 = tree_cpu_s(watcher), time.perf_counter()
                        time.sleep(slot)
                        slots.append((sampling, t0 + 0.25, time.perf_counter()))
                        if sampling:
                            on_cpu.append((tree_cpu_s(watcher) - cpu0) / (time.perf_counter() - t0) * 100)
            finally:
                _signal_tree(watcher, signal.SIGCONT)
                sampler.terminate()
                sampler.wait(60)
                loader.join(total + 30)
    done = sorted(stamps)

    def rps(start: float, end: float) -> float:
        import bisect

        return (bisect.bisect_left(done, end) - bisect.bisect_left(done, start)) / (end - start)

    ratios = []
    for (a_on, a0, a1), (_, b0, b1) in zip(slots[0::2], slots[1::2]):
        on, off = (rps(a0, a1), rps(b0, b1)) if a_on else (rps(b0, b1), rps(a0, a1))
        ratios.append(on / off - 1)
        print(f"  pair {len(ratios)}: {ratios[-1]:+.1%} ({off:.0f} -> {on:.0f} req/s)", file=sys.stderr, flush=True)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    cpu = statistics.median(on_cpu)
    print(f"python {sys.version.split()[0]}, gunicorn gthread, {cpus} workers sharing every core, {args.connections}"
          f" connections kept open; {args.sampler} at {args.rate} Hz, "
          f"{'a new attach of' if args.fresh else 'stopped and continued every'} {slot:g} s,"
          f" {args.rounds} pairs")
    print(f"throughput while sampling vs not, adjacent slots: median {statistics.median(ratios):+.1%}"
          f" (interquartile {q[0]:+.1%} .. {q[2]:+.1%}; target within 5%)")
    off = statistics.median(rps(b0, b1) for sampling, b0, b1 in slots if not sampling)
    print(f"  without sampling: {off:.0f} req/s (median slot; the kernel hands the kept-open connections to the"
          f" workers once: a run far below the machine's usual rate had one worker take most of them)")
    print(f"sampler CPU while sampling: {cpu:.1f}% of one core, {cpu / cpus:.1f}% of the machine's {cpus} (median)")


if __name__ == "__main__":
    main()
