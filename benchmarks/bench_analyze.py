"""Benchmark `latprof analyze` against the floor of parsing the same capture with orjson alone.

    python benchmarks/bench_analyze.py [--requests 100000] [--rounds 3] [--capture PATH]

Generates (once) a fixed-shape capture with benchmarks/gen_capture.py: 100k requests of 10
lines each (1 request + 9 segments, 3-5 attributes per line). Each round runs, in fresh
processes and rotating their order, (a) the floor: `orjson.loads` on every line of the
file, (b) `latprof analyze CAPTURE --format json` (cohort-first: docs/performance.md) and (c)
the same with `--exact` (every segment read). The machine is noisy, so the ratios are taken
within each round and the median round is reported; peak RSS is the child's maxrss.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLOOR = """
import sys, orjson
loads = orjson.loads
with open(sys.argv[1], "rb") as f:
    for line in f:
        loads(line)
"""


def timed(argv: list[str]) -> tuple[float, float]:
    """Run argv; return (wall seconds, peak RSS in MiB) of the child."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed with exit code {proc.returncode}")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--capture", type=Path, help="existing capture to use instead of generating one")
    args = parser.parse_args()

    capture = args.capture or HERE / "out" / f"bench-{args.requests}.jsonl"
    if not capture.exists():
        capture.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(HERE / "gen_capture.py"), str(capture), "--requests", str(args.requests)], check=True)
    lines = sum(1 for _ in open(capture, "rb"))
    spans = sum(1 for line in open(capture, "rb") if b'"type":"segment"' in line or b'"type":"request"' in line)
    print(f"capture: {capture} ({capture.stat().st_size / 2**20:.0f} MiB, {lines:,} lines, {spans:,} spans)")

    floor_cmd = [sys.executable, "-c", FLOOR, str(capture)]
    analyze_cmd = [sys.executable, "-m", "latprof", "analyze", str(capture), "--format", "json", "-o", os.devnull]
    commands = {"floor": floor_cmd, "analyze": analyze_cmd, "exact": [*analyze_cmd, "--exact"]}
    rows = []
    for i in range(args.rounds):
        names = list(commands)
        order = names[i % 3 :] + names[: i % 3]
        result = {name: timed(commands[name]) for name in order}
        floor_s = result["floor"][0]
        (analyze_s, analyze_rss), (exact_s, exact_rss) = result["analyze"], result["exact"]
        rows.append((floor_s, analyze_s, analyze_s / floor_s, analyze_rss, exact_s, exact_s / floor_s, exact_rss))
        print(
            f"round {i + 1}: orjson floor {floor_s:.2f} s | latprof analyze {analyze_s:.2f} s"
            f" ({spans / analyze_s:,.0f} spans/s, peak RSS {analyze_rss:,.0f} MiB) ratio {analyze_s / floor_s:.2f}x"
            f" | --exact {exact_s:.2f} s (peak RSS {exact_rss:,.0f} MiB) ratio {exact_s / floor_s:.2f}x"
        )
    floor_s, analyze_s, ratio, rss, exact_s, exact_ratio, exact_rss = sorted(rows, key=lambda r: r[2])[len(rows) // 2]
    print(
        f"median round: floor {floor_s:.2f} s, analyze {analyze_s:.2f} s, ratio {ratio:.2f}x (target <= 1.5x),"
        f" {spans / analyze_s:,.0f} spans/s, peak RSS {rss:,.0f} MiB (target <= 300 MiB);"
        f" --exact {exact_s:.2f} s, ratio {exact_ratio:.2f}x, peak RSS {exact_rss:,.0f} MiB;"
        f" ratios over rounds: {', '.join(f'{r[2]:.2f}' for r in rows)} (spread {statistics.pstdev([r[2] for r in rows]):.2f}),"
        f" --exact: {', '.join(f'{r[5]:.2f}' for r in rows)}"
    )


if __name__ == "__main__":
    main()
