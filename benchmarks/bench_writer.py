"""Benchmark what the capture writer costs the observed service's thread per event.

    python benchmarks/bench_writer.py [--events 200000] [--rounds 5]

`CaptureWriter.emit()` runs on the service's own threads, so its cost is what a hook adds
per event; the encoding and the write happen in the writer's thread. Side by side in one
run: a no-op Python call and a bare `deque.append` (the floor of any buffered emit), then
`emit()` with room in the buffer, and `emit()` when the buffer is full (a counted drop).
The flush cost per event (writer thread) is measured too.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
from pathlib import Path

from latprof.capture.writer import CaptureWriter
from latprof.events import Segment


def per_call_ns(fn, event, n: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(n):
        fn(event)
    return (time.perf_counter_ns() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n = args.events
    event = Segment("0c5c7fd0a6a3a4506513270e269e0d37", "1818e811892f902b", None, "SELECT conversations", "db.query",
                    1_764_000_000_000_000_000, 1_764_000_000_003_000_000, 4242,
                    {"db.system.name": "postgresql", "db.query.summary": "SELECT conversations", "server.port": 5432})
    rows = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            rows["no-op call"].append(per_call_ns(lambda e: None, event, n))
            rows["deque.append"].append(per_call_ns(collections.deque(maxlen=None).append, event, n))
            writer = CaptureWriter(Path(tmp) / f"w{r}.jsonl", flush_interval_s=3600, max_buffered_events=n + 1)
            rows["emit(), buffer has room"].append(per_call_ns(writer.emit, event, n))
            start = time.perf_counter_ns()
            writer.flush()
            rows["flush, per event (writer thread)"].append((time.perf_counter_ns() - start) / n)
            full = CaptureWriter(Path(tmp) / f"f{r}.jsonl", flush_interval_s=3600, max_buffered_events=1)
            full.emit(event)
            rows["emit(), buffer full (drop)"].append(per_call_ns(full.emit, event, n))
            writer.close()
            full.close()
    floor = statistics.median(rows["deque.append"])
    print(f"{n:,} events x {args.rounds} rounds, median ns per event:")
    for name, values in rows.items():
        median = statistics.median(values)
        print(f"  {name:<36} {median:8.0f} ns   ({median / floor:.1f}x deque.append)")


if __name__ == "__main__":
    main()
