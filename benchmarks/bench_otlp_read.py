"""Benchmark the OTLP JSON reader against the floor of parsing the same file with orjson alone.

    python benchmarks/bench_otlp_read.py [--spans 1000000] [--rounds 5] [--file PATH]

Generates (once, cached in the temp directory) Collector `file` exporter lines with
benchmarks/gen_otlp.py: 1M spans, 512 a line. Each round runs, in fresh processes and
alternating their order, (a) the floor: `orjson.loads` on every line of the file and nothing
else, and (b) `read_otlp_json(FILE)`. Each child times its own work (interpreter start and
imports excluded) and the parent reads its peak RSS. The machine is noisy, so the ratio is
taken within each round and the median round is reported.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLOOR = """
import os, sys, time, orjson
loads = orjson.loads
start = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    for line in f:
        loads(line)
print(time.perf_counter() - start, flush=True)
os._exit(0)
"""
READER = """
import os, sys, time
from latprof.collectors.otlp_json import read_otlp_json
start = time.perf_counter()
read = read_otlp_json(sys.argv[1])
print(time.perf_counter() - start, len(read.spans), len(read.warnings), flush=True)
os._exit(0)  # skip freeing a million spans at exit: not part of reading
"""


def timed(code: str, path: Path) -> tuple[float, list[str], float]:
    """Run `code` on `path` in a fresh interpreter; return (its own seconds, its other output, its peak RSS in MiB)."""
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    output = proc.stdout.read().split()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.stdout.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"benchmark child failed with exit code {os.waitstatus_to_exitcode(status)}")
    return float(output[0]), output[1:], usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--file", type=Path, help="an existing OTLP JSON lines file to use instead of generating one")
    args = parser.parse_args()

    path = args.file or Path(tempfile.gettempdir()) / "latprof-bench-otlp" / f"spans-{args.spans}.json"
    if not path.exists():
        sys.path.insert(0, str(HERE))
        from gen_otlp import generate

        path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        partial = path.with_suffix(".partial")
        generate(partial, spans=args.spans)
        partial.replace(path)
        print(f"generated {path} in {time.perf_counter() - started:.1f} s")
    lines = sum(1 for _ in open(path, "rb"))
    print(f"file: {path} ({path.stat().st_size / 2**20:.0f} MiB, {lines:,} lines)")

    rows = []
    spans = 0
    for i in range(args.rounds):
        order = ["floor", "reader"] if i % 2 == 0 else ["reader", "floor"]
        result = {}
        for name in order:
            result[name] = timed(FLOOR if name == "floor" else READER, path)
        floor_s, _, _ = result["floor"]
        reader_s, out, reader_rss = result["reader"]
        spans = int(out[0])
        rows.append((floor_s, reader_s, reader_s / floor_s, reader_rss))
        print(
            f"round {i + 1}: orjson floor {floor_s:.2f} s | read_otlp_json {reader_s:.2f} s"
            f" ({spans / reader_s:,.0f} spans/s, {out[1]} warnings) | ratio {reader_s / floor_s:.2f}x"
        )
    floor_s, reader_s, ratio, rss = sorted(rows, key=lambda r: r[2])[len(rows) // 2]
    # The largest peak of any child this process waited for: the reader's (the floor keeps one line).
    children_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        f"median round: floor {floor_s:.2f} s, reader {reader_s:.2f} s, ratio {ratio:.2f}x (aim <= 1.3x),"
        f" {spans / reader_s:,.0f} spans/s, {spans / floor_s:,.0f} spans/s parsed by orjson alone;"
        f" ratios over rounds: {', '.join(f'{r[2]:.2f}' for r in rows)}"
        f" (spread {statistics.pstdev([r[2] for r in rows]):.2f})"
    )
    print(f"reader peak RSS: {rss:,.0f} MiB this round, {children_rss:,.0f} MiB max over all children (RUSAGE_CHILDREN)")


if __name__ == "__main__":
    main()
