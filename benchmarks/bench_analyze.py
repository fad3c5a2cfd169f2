"""Benchmark `latprof analyze` against the floor of parsing the same capture with orjson alone.

    python benchmarks/bench_analyze.py [--requests 100000] [--rounds 3] [--capture PATH] [--against REV]

Generates (once) a fixed-shape capture with benchmarks/gen_capture.py: 100k requests of 10
lines each (1 request + 9 segments, 3-5 attributes per line). Each round runs, in fresh
processes and rotating their order, (a) the floor: `orjson.loads` on every line of the
file, (b) `latprof analyze CAPTURE --format json` (cohort-first: docs/performance.md) and (c)
the same with `--exact` (every segment read). The machine is noisy, so the ratios are taken
within each round and the median round is reported; peak RSS is the child's maxrss.

`--against REV` adds (d): `latprof analyze` (cohort-first) by the code of git revision REV (a
temporary worktree, imported ahead of this checkout), in the same rotation, so a change's cost is
a ratio taken side by side within each round rather than across runs on a noisy machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from revision import revision_tree

HERE = Path(__file__).resolve().parent
FLOOR = """
import sys, orjson
loads = orjson.loads
with open(sys.argv[1], "rb") as f:
    for line in f:
        loads(line)
"""


def timed(argv: list[str], root: Path | None = None) -> tuple[float, float]:
    """Run argv (importing latprof from `root` when given); return (wall seconds, peak RSS in MiB) of the child."""
    env = None if root is None else {**os.environ, "PYTHONPATH": str(root)}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, cwd=root, env=env)
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
    parser.add_argument("--against", metavar="REV", help="also time the analysis by git revision REV, side by side")
    args = parser.parse_args()
    with revision_tree(args.against or None) as against:
        run(args, against)


def run(args: argparse.Namespace, against: Path | None) -> None:
    """Generate the capture if needed, then the rounds; with `against`, the analysis by that tree too."""

    capture = (args.capture or HERE / "out" / f"bench-{args.requests}.jsonl").resolve()
    if not capture.exists():
        capture.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(HERE / "gen_capture.py"), str(capture), "--requests", str(args.requests)], check=True)
    lines = sum(1 for _ in open(capture, "rb"))
    spans = sum(1 for line in open(capture, "rb") if b'"type":"segment"' in line or b'"type":"request"' in line)
    print(f"capture: {capture} ({capture.stat().st_size / 2**20:.0f} MiB, {lines:,} lines, {spans:,} spans)")

    floor_cmd = [sys.executable, "-c", FLOOR, str(capture)]
    analyze_cmd = [sys.executable, "-m", "latprof", "analyze", str(capture), "--format", "json", "-o", os.devnull]
    commands = {"floor": floor_cmd, "analyze": analyze_cmd, "exact": [*analyze_cmd, "--exact"]}
    roots: dict[str, Path | None] = dict.fromkeys(commands)
    if against is not None:
        commands["against"], roots["against"] = analyze_cmd, against
    rows = []
    changes = []
    for i in range(args.rounds):
        names = list(commands)
        order = names[i % len(names) :] + names[: i % len(names)]
        result = {name: timed(commands[name], roots[name]) for name in order}
        floor_s = result["floor"][0]
        (analyze_s, analyze_rss), (exact_s, exact_rss) = result["analyze"], result["exact"]
        rows.append((floor_s, analyze_s, analyze_s / floor_s, analyze_rss, exact_s, exact_s / floor_s, exact_rss))
        print(
            f"round {i + 1}: orjson floor {floor_s:.2f} s | latprof analyze {analyze_s:.2f} s"
            f" ({spans / analyze_s:,.0f} spans/s, peak RSS {analyze_rss:,.0f} MiB) ratio {analyze_s / floor_s:.2f}x"
            f" | --exact {exact_s:.2f} s (peak RSS {exact_rss:,.0f} MiB) ratio {exact_s / floor_s:.2f}x"
        )
        if against is not None:
            against_s, against_rss = result["against"]
            changes.append(analyze_s / against_s)
            print(f"         {args.against}: analyze {against_s:.2f} s (peak RSS {against_rss:,.0f} MiB) | this tree / {args.against}"
                  f" {changes[-1]:.3f}")  # fmt: skip
    floor_s, analyze_s, ratio, rss, exact_s, exact_ratio, exact_rss = sorted(rows, key=lambda r: r[2])[len(rows) // 2]
    print(
        f"median round: floor {floor_s:.2f} s, analyze {analyze_s:.2f} s, ratio {ratio:.2f}x (target <= 1.5x),"
        f" {spans / analyze_s:,.0f} spans/s, peak RSS {rss:,.0f} MiB (target <= 300 MiB);"
        f" --exact {exact_s:.2f} s, ratio {exact_ratio:.2f}x, peak RSS {exact_rss:,.0f} MiB;"
        f" ratios over rounds: {', '.join(f'{r[2]:.2f}' for r in rows)} (spread {statistics.pstdev([r[2] for r in rows]):.2f}),"
        f" --exact: {', '.join(f'{r[5]:.2f}' for r in rows)}"
    )
    if changes:
        print(f"this tree against {args.against}: median {statistics.median(changes):.3f}x (rounds: {', '.join(f'{c:.3f}' for c in changes)})")


if __name__ == "__main__":
    main()
