"""Benchmark analysing OTLP JSON traces against the floor of parsing the same file with orjson alone.

    python benchmarks/bench_otlp.py [--spans 1000000] [--rounds 5] [--file PATH] [--against REV]

Generates (once, cached in the temp directory) Collector `file` exporter lines with
benchmarks/gen_otlp.py: 1M spans, 10 a trace, 3-5 attributes each, 512 spans a line. Each
round runs, in fresh processes and rotating their order, (a) the floor: `orjson.loads` on every
line of the file and nothing else, (b) `read_otlp_json(FILE)` alone, and (c) what `latprof
analyze FILE --format json` does: read, map spans to layers, infer, analyse, run the rules and
render the report. Each child times its own work (interpreter start and imports excluded) and
the parent reads its peak RSS. The machine is noisy, so the ratios are taken within each
round and the median round is reported.

`--against REV` adds (d): the same analysis by the code of git revision REV (a temporary
worktree, imported ahead of this checkout), in the same rotation, so a change's cost is a ratio
taken side by side within each round rather than across runs on a noisy machine.
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

from revision import revision_tree

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
from latprof.collectors.traces.otlp_json import read_otlp_json
start = time.perf_counter()
read = read_otlp_json(sys.argv[1])
print(time.perf_counter() - start, len(read.spans), len(read.warnings), flush=True)
os._exit(0)  # skip freeing a million spans at exit: not part of reading
"""

ANALYZE = """
import io, os, sys, time
from latprof.pipeline import run_diagnosis
from latprof.report.renderers import REPORT
start = time.perf_counter()
diagnosis = run_diagnosis([sys.argv[1]])
REPORT.render("json", diagnosis.report, io.StringIO())
print(time.perf_counter() - start, diagnosis.report.window["requests"], diagnosis.report.verdict.status, flush=True)
os._exit(0)
"""


def timed(code: str, path: Path, root: Path = HERE.parent) -> tuple[float, list[str], float]:
    """Run `code` on `path` in a fresh interpreter importing latprof from `root`; return (its own
    seconds, its other output, its peak RSS in MiB)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, cwd=root, env=env)
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
    parser.add_argument("--against", metavar="REV", help="also time the analysis by git revision REV, side by side")
    args = parser.parse_args()
    with revision_tree(args.against or None) as against:
        run(args, against)


def run(args: argparse.Namespace, against: Path | None) -> None:
    """Generate the file if needed, then the rounds; with `against`, the analysis by that tree too."""

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

    codes = {"floor": FLOOR, "reader": READER, "analyze": ANALYZE}
    roots = {name: HERE.parent for name in codes}
    if against is not None:
        codes["against"], roots["against"] = ANALYZE, against
    rows = []
    changes = []
    spans = 0
    for i in range(args.rounds):
        order = list(codes)[i % len(codes):] + list(codes)[: i % len(codes)]
        result = {name: timed(codes[name], path, roots[name]) for name in order}
        floor_s, _, _ = result["floor"]
        reader_s, out, reader_rss = result["reader"]
        analyze_s, verdict, analyze_rss = result["analyze"]
        spans = int(out[0])
        rows.append((floor_s, reader_s, analyze_s, analyze_s / floor_s, reader_rss, analyze_rss))
        print(
            f"round {i + 1}: orjson floor {floor_s:.2f} s | read_otlp_json {reader_s:.2f} s ({reader_s / floor_s:.2f}x)"
            f" | analyze {analyze_s:.2f} s ({spans / analyze_s:,.0f} spans/s, {verdict[0]} requests, verdict {verdict[1]},"
            f" peak RSS {analyze_rss:,.0f} MiB) | ratio {analyze_s / floor_s:.2f}x"
        )
        if against is not None:
            against_s, against_verdict, against_rss = result["against"]
            changes.append(analyze_s / against_s)
            print(
                f"         {args.against}: analyze {against_s:.2f} s ({against_verdict[0]} requests, verdict"
                f" {against_verdict[1]}, peak RSS {against_rss:,.0f} MiB) | this tree / {args.against} {changes[-1]:.3f}"
            )
    floor_s, reader_s, analyze_s, ratio, reader_rss, analyze_rss = sorted(rows, key=lambda r: r[3])[len(rows) // 2]
    print(
        f"median round: floor {floor_s:.2f} s, reader {reader_s:.2f} s ({reader_s / floor_s:.2f}x, peak RSS"
        f" {reader_rss:,.0f} MiB), analyze {analyze_s:.2f} s, ratio {ratio:.2f}x (target <= 2x),"
        f" {spans / analyze_s:,.0f} spans/s, peak RSS {analyze_rss:,.0f} MiB (target <= 300 MiB);"
        f" ratios over rounds: {', '.join(f'{r[3]:.2f}' for r in rows)} (spread {statistics.pstdev([r[3] for r in rows]):.2f})"
    )
    if changes:
        print(
            f"this tree against {args.against}: median {statistics.median(changes):.3f}x"
            f" (rounds: {', '.join(f'{c:.3f}' for c in changes)})"
        )


if __name__ == "__main__":
    main()
