"""Open-loop load: Poisson arrivals at a fixed rate; a request never waits for an earlier one.

Every request is a GET of one path with a `chat_id`; `mix` sends a share of the requests to
other paths instead, drawn from a random stream of its own so that the arrivals and chat ids
stay those of the same seed without a mix.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Sequence
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
    #: Requests sent per path.
    sent_by_path: dict[str, int] = field(default_factory=dict)


def pick_path(path: str, mix: Sequence[tuple[str, float]], draw: float) -> str:
    """The path of a request whose uniform draw in [0, 1) is `draw`: `mix` (path, share) first, else `path`."""
    bound = 0.0
    for other, share in mix:
        bound += share
        if draw < bound:
            return other
    return path


def rate_at(t_s: float, rate_rps: float, steps: Sequence[tuple[float, float]]) -> float:
    """The arrival rate at second `t_s` of a load that starts at `rate_rps` and changes at each (from, rate) step."""
    for start_s, rate in steps:
        if t_s >= start_s:
            rate_rps = rate
    return rate_rps


async def _drive(
    base_url: str,
    path: str,
    rate_rps: float,
    duration_s: float,
    seed: int,
    progress: TextIO | None,
    timeout_s: float,
    mix: Sequence[tuple[str, float]],
    steps: Sequence[tuple[float, float]] = (),
) -> LoadStats:
    stats = LoadStats()
    rng = random.Random(seed)
    mix_rng = random.Random(f"{seed}:mix")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    tasks: set[asyncio.Task[None]] = set()

    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=timeout_s
    ) as client:

        async def one(target: str, chat_id: int) -> None:
            start = time.perf_counter()
            try:
                response = await client.get(target, params={"chat_id": chat_id})
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
            next_at += rng.expovariate(rate_at(next_at, rate_rps, steps))
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
            target = pick_path(path, mix, mix_rng.random()) if mix else path
            stats.sent_by_path[target] = stats.sent_by_path.get(target, 0) + 1
            task = asyncio.create_task(one(target, rng.randrange(50)))
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
    mix: Sequence[tuple[str, float]] = (),
    steps: Sequence[tuple[float, float]] = (),
) -> LoadStats:
    """Send GET `path` at Poisson arrivals of `rate_rps` for `duration_s`; wait for the stragglers.

    `mix`: (path, share) pairs; that share of the requests goes to that path instead. `steps`:
    (from second, rate) pairs that change the rate for the rest of the run (`rate_at`).
    """
    if rate_rps <= 0 or any(rate <= 0 for _, rate in steps):
        raise ValueError(f"arrival rates must be > 0: {rate_rps} then {list(steps)}")
    if sum(share for _, share in mix) > 1 or any(share < 0 for _, share in mix):
        raise ValueError(f"the shares of a load mix must be >= 0 and sum to at most 1: {list(mix)}")
    return asyncio.run(
        _drive(base_url, path, rate_rps, duration_s, seed, progress, timeout_s, mix, steps)
    )
