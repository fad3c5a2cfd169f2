"""Open-loop load: Poisson arrivals at a fixed rate; a request never waits for an earlier one."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

import httpx


@dataclass
class LoadStats:
    sent: int = 0
    done: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)


async def _drive(
    base_url: str,
    path: str,
    rate_rps: float,
    duration_s: float,
    seed: int,
    progress: TextIO | None,
    timeout_s: float,
) -> LoadStats:
    stats = LoadStats()
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    tasks: set[asyncio.Task[None]] = set()

    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=timeout_s
    ) as client:

        async def one(chat_id: int) -> None:
            start = time.perf_counter()
            try:
                response = await client.get(path, params={"chat_id": chat_id})
                if response.status_code >= 400:
                    stats.errors += 1
                    if len(stats.error_samples) < 5:
                        stats.error_samples.append(
                            f"HTTP {response.status_code}: {response.text[:200]}"
                        )
            except httpx.HTTPError as exc:
                stats.errors += 1
                if len(stats.error_samples) < 5:
                    stats.error_samples.append(f"{type(exc).__name__}: {exc}")
            else:
                stats.latencies_ms.append((time.perf_counter() - start) * 1000)
            finally:
                stats.done += 1

        def show(elapsed: float, final: bool = False) -> None:
            if progress is None:
                return
            progress.write(
                f"\rlatprof demo: {min(elapsed, duration_s):5.1f}/{duration_s:g} s  sent {stats.sent}"
                f"  done {stats.done}  errors {stats.errors}" + ("\n" if final else "")
            )
            progress.flush()

        begin = time.perf_counter()
        next_at = 0.0
        last_shown = -1.0
        while True:
            next_at += rng.expovariate(rate_rps)
            if next_at >= duration_s:
                break
            while True:
                elapsed = time.perf_counter() - begin
                if elapsed - last_shown >= 0.25:
                    show(elapsed)
                    last_shown = elapsed
                if elapsed >= next_at:
                    break
                await asyncio.sleep(min(next_at - elapsed, 0.25))
            stats.sent += 1
            task = asyncio.create_task(one(rng.randrange(50)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:  # the requests still in flight
            await asyncio.wait(set(tasks), timeout=0.25)
            show(time.perf_counter() - begin)
        show(time.perf_counter() - begin, final=True)
    return stats


def drive(
    base_url: str,
    path: str,
    rate_rps: float,
    duration_s: float,
    *,
    seed: int = 1,
    progress: TextIO | None = sys.stderr,
    timeout_s: float = 60.0,
) -> LoadStats:
    """Send GET `path` at Poisson arrivals of `rate_rps` for `duration_s`; wait for the stragglers."""
    return asyncio.run(
        _drive(base_url, path, rate_rps, duration_s, seed, progress, timeout_s)
    )
