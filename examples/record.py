"""Record the example captures: each is `latprof demo --scenario NAME`, kept and gzip'ed.

    python examples/record.py                 # every example, into examples/
    python examples/record.py --out-dir /tmp/x queueing healthy
    python examples/record.py --seconds 30    # longer load (default 20 s, as `latprof demo`)

Each capture is what `latprof run` recorded from the bundled demo service (FastAPI under
uvicorn, SQLAlchemy on a SQLite file, the official openai client) while the bundled provider
answered and open-loop load ran: real hooks, real timings, so a new recording differs from
the committed one in its numbers but not in its verdict. The verdict of each is checked here
before the file is written, and again by tests/test_examples.py.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

from latprof.demo.run import run_demo
from latprof.demo.scenarios import get_scenario

HERE = Path(__file__).resolve().parent

#: example file stem -> demo scenario
EXAMPLES = {
    "pool_held_across_llm": "pool-held-across-llm",
    "queueing": "threadpool-queueing",
    "provider_floor": "provider-floor",
    "provider_spikes": "provider-spikes",
    "long_decode": "long-outputs",
    "event_loop_blocked": "blocking-call",
    "healthy": "healthy",
}


def record(name: str, out_dir: Path, seconds: float) -> Path:
    scenario = get_scenario(EXAMPLES[name])
    raw = out_dir / f"{name}.jsonl"
    result = run_demo(scenario.name, capture=raw, duration_s=seconds, progress=sys.stderr)
    verdict = result.report.verdict
    if verdict.layer != scenario.expected_layer:
        raise SystemExit(
            f"record: {name}: verdict {verdict.layer!r}, expected {scenario.expected_layer!r}; not written ({verdict.summary})"
        )
    target = out_dir / f"{name}.jsonl.gz"
    # mtime 0: the gzip header does not change with the day of recording.
    target.write_bytes(gzip.compress(raw.read_bytes(), compresslevel=9, mtime=0))
    raw.unlink()
    print(f"{target}: {result.load.sent} requests, verdict {verdict.layer} ({verdict.summary})")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="examples to record (default all): " + ", ".join(EXAMPLES))
    parser.add_argument("--out-dir", type=Path, default=HERE)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in EXAMPLES]
    if unknown:
        parser.error(f"unknown example(s): {', '.join(unknown)}; known: {', '.join(EXAMPLES)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(EXAMPLES):
        record(name, args.out_dir, args.seconds)


if __name__ == "__main__":
    main()
