"""What the locks hook costs an uncontended lock: native vs wrapped acquire + release, side by side, one run.

    python benchmarks/bench_locks.py [--n 200000] [--trials 7]

Every lock a service creates after `latprof run` loaded the hooks is wrapped (`collectors/hooks/locks.py`),
so every `with lock:` pays a Python call even when nobody else holds the lock. This measures,
interleaved trial by trial, `with lock: pass` on a native and on a wrapped threading Lock and
RLock, a BoundedSemaphore before and after its `acquire` is patched, and `async with` on an
asyncio Lock before and after; inside a request (a request open in the context) and outside.
Median ns per acquire + release.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/recording.py

from recording import recording  # noqa: E402

from latprof.collectors.hooks import locks, runtime  # noqa: E402


def per_op(fn: Callable[[int], None], n: int) -> float:
    start = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - start) / n


def with_loop(lock: Any) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            with lock:
                pass

    return run


def async_loop(lock: Any) -> Callable[[int], None]:
    async def main(n: int) -> None:
        for _ in range(n):
            async with lock:
                pass

    return lambda n: asyncio.run(main(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()

    native = {
        "threading.Lock": threading.Lock(),
        "threading.RLock": threading.RLock(),
        "threading.BoundedSemaphore": threading.BoundedSemaphore(1),
    }
    results: dict[tuple[str, str], list[float]] = {}
    with recording():
        for trial in range(args.trials):
            for name, lock in native.items():
                results.setdefault((name, "native"), []).append(per_op(with_loop(lock), args.n))
            results.setdefault(("asyncio.Lock", "native"), []).append(per_op(async_loop(asyncio.Lock()), args.n))
            locks.install()
            try:
                wrapped = {
                    "threading.Lock": threading.Lock(),
                    "threading.RLock": threading.RLock(),
                    "threading.BoundedSemaphore": threading.BoundedSemaphore(1),
                }
                for inside in (False, True):
                    where = "wrapped, in a request" if inside else "wrapped"
                    token = runtime.begin_request("GET /bench", runtime.now_ns()) if inside else None
                    for name, lock in wrapped.items():
                        results.setdefault((name, where), []).append(per_op(with_loop(lock), args.n))
                    results.setdefault(("asyncio.Lock", where), []).append(per_op(async_loop(asyncio.Lock()), args.n))
                    if token is not None:
                        runtime.end_request(token)
            finally:
                locks.uninstall()

    print(f"python {sys.version.split()[0]}, {args.n:,} acquire+release per trial, median of {args.trials} trials (ns)")
    print(f"{'':<28}{'native':>10}{'wrapped':>10}{'in request':>12}{'added':>10}")
    for name in ("threading.Lock", "threading.RLock", "threading.BoundedSemaphore", "asyncio.Lock"):
        a = statistics.median(results[(name, "native")])
        b = statistics.median(results[(name, "wrapped")])
        c = statistics.median(results[(name, "wrapped, in a request")])
        print(f"{name:<28}{a:>10.0f}{b:>10.0f}{c:>12.0f}{c - a:>+10.0f}")


if __name__ == "__main__":
    main()
