"""Benchmark what recording one segment costs a service: latprof's hook runtime next to an OpenTelemetry SDK span.

    python benchmarks/bench_hook_cost.py [--segments 20000] [--trials 7] [--per-request 10]

Side by side in one run, each trial running every variant once (the order reversed every
other trial, because the machine is noisy), on the same loop of requests with
`--per-request` segments each and two attributes per segment:

- baseline: an empty context manager (`contextlib.nullcontext`), the attribute dict built;
- latprof `segment()`: `runtime.segment(name, layer, attrs)` as a `with` block, inside
  `begin_request`/`end_request`, recording into a real `CaptureWriter` on a temp file with
  the defaults `latprof run` uses (collectors/hooks/bootstrap.py);
- latprof `record()`: `now_ns()` before and after, then `runtime.record(...)`, the path the
  SQLAlchemy and OpenAI hooks take;
- OpenTelemetry: `tracer.start_as_current_span(name, attributes=attrs)` under a root span, a
  `TracerProvider` with a `BatchSpanProcessor` and an exporter that drops everything. Its
  queue is sized to hold a whole trial, so no span is dropped (both sides keep everything).

Two costs per segment: the wall time of the loop on the calling thread (what the service's
thread feels), and the process CPU time (`time.process_time`) from the start of the loop to
the end of a drain (`writer.flush()`, `provider.force_flush()`), which counts the writer's
encoding and the span processor's exporting in their background threads. A request root
(`begin_request` + `end_request`, a root span) is timed in its own loop of as many requests
as there are segments, and subtracted from the segment loops. "Over baseline" subtracts the
empty context manager of the same trial: what recording adds. Ratios are taken per trial
and reported as their median with the min-max over trials.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from latprof.capture.writer import CaptureWriter
from latprof.collectors.hooks import runtime
from latprof.layers import DB_QUERY
from latprof.semconv import DB_QUERY_SUMMARY, DB_SYSTEM_NAME

ROUTE = "POST /chat"
NAME = "SELECT conversations"
BASELINE = "empty context manager"
OTEL = "OpenTelemetry SDK span"

#: One trial of one variant: (requests, segments per request) -> (calling-thread wall ns, process CPU ns).
Run = Callable[[int, int], tuple[int, int]]


class NullSpanExporter(SpanExporter):
    """Drops every span; counts them, so the benchmark can check none was lost on the way."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[object]) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def baseline(requests: int, per_request: int) -> tuple[int, int]:
    nothing = contextlib.nullcontext
    cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(requests):
        with nothing():
            for _ in range(per_request):
                with nothing({DB_SYSTEM_NAME: "postgresql", DB_QUERY_SUMMARY: NAME}):
                    pass
    wall = time.perf_counter_ns() - wall0
    return wall, time.process_time_ns() - cpu0


def _recording(tmp: Path, loop: Callable[[int, int], None]) -> Run:
    """Run `loop` with recording on into a fresh writer, as `latprof run` starts it; drain before stopping the clock."""

    def run(requests: int, per_request: int) -> tuple[int, int]:
        writer = CaptureWriter(tmp / "capture.jsonl", source="run", max_buffered_events=max(100_000, 2 * requests * (per_request + 1)))
        runtime.start(writer)
        try:
            loop(1, 1)  # the writer's thread starts on the first event: not part of the measure
            writer.flush()
            gc.collect()
            cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
            loop(requests, per_request)
            wall = time.perf_counter_ns() - wall0
            writer.flush()
            cpu = time.process_time_ns() - cpu0
        finally:
            runtime.stop()
            writer.close()
        with open(tmp / "capture.jsonl", "rb") as f:  # (quality records: the writer's and the hooks' own, not events)
            lines = sum(1 for line in f if not line.startswith(b'{"type":"quality"'))
        (tmp / "capture.jsonl").unlink()
        expected = 1 + 2 + requests * (per_request + 1)  # header, warm-up request and segment, the loop
        if writer.dropped or writer.errors or lines != expected:
            raise SystemExit(
                f"capture has {lines} of {expected} lines ({writer.dropped} dropped, {writer.errors} errors): the comparison is void"
            )
        return wall, cpu

    return run


def latprof_segment_loop(requests: int, per_request: int) -> None:
    begin, end, segment, now = runtime.begin_request, runtime.end_request, runtime.segment, runtime.now_ns
    for _ in range(requests):
        token = begin(ROUTE, now())
        for _ in range(per_request):
            with segment(NAME, DB_QUERY, {DB_SYSTEM_NAME: "postgresql", DB_QUERY_SUMMARY: NAME}):
                pass
        end(token)


def latprof_record_loop(requests: int, per_request: int) -> None:
    begin, end, record, now = runtime.begin_request, runtime.end_request, runtime.record, runtime.now_ns
    for _ in range(requests):
        token = begin(ROUTE, now())
        for _ in range(per_request):
            start = now()
            record(NAME, DB_QUERY, start, now(), {DB_SYSTEM_NAME: "postgresql", DB_QUERY_SUMMARY: NAME})
        end(token)


def otel(requests: int, per_request: int) -> tuple[int, int]:
    exporter = NullSpanExporter()
    spans = requests * (per_request + 1) + 2
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=max(2048, spans)))
    span = provider.get_tracer("bench_hook_cost").start_as_current_span
    try:
        with span(ROUTE):
            with span(NAME):
                pass
        provider.force_flush()
        gc.collect()
        cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
        for _ in range(requests):
            with span(ROUTE):
                for _ in range(per_request):
                    with span(NAME, attributes={DB_SYSTEM_NAME: "postgresql", DB_QUERY_SUMMARY: NAME}):
                        pass
        wall = time.perf_counter_ns() - wall0
        provider.force_flush()
        cpu = time.process_time_ns() - cpu0
    finally:
        provider.shutdown()
    if exporter.exported != spans:
        raise SystemExit(f"OpenTelemetry exported {exporter.exported} of {spans} spans: the comparison is void")
    return wall, cpu


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=20_000, help="segments per variant per trial")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--per-request", type=int, default=10, help="segments per request")
    args = parser.parse_args()
    per_request = args.per_request
    requests = max(1, args.segments // per_request)
    n_segments = requests * per_request
    roots = n_segments  # the root loops run as many requests as there are segments, for the same precision

    print(
        f"CPython {platform.python_version()} on {platform.machine()}, opentelemetry-sdk {importlib.metadata.version('opentelemetry-sdk')},"
        f" latprof {importlib.metadata.version('latprof')}, orjson {importlib.metadata.version('orjson')}"
    )
    print(f"{n_segments:,} segments ({requests:,} requests of {per_request}) and {roots:,} bare request roots per variant, {args.trials} trials")

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        systems: dict[str, Run] = {
            BASELINE: baseline,
            "latprof segment()": _recording(tmp, latprof_segment_loop),
            "latprof record()": _recording(tmp, latprof_record_loop),
            OTEL: otel,
        }
        # record() opens and closes its requests as segment() does: one root loop serves both
        root_of = {name: "latprof segment()" if name == "latprof record()" else name for name in systems}
        jobs = [(name, "segments") for name in systems] + [(name, "roots") for name in systems if root_of[name] == name]
        # per trial: {(name, kind): (wall ns, cpu ns)} with kind "segments" per segment, "roots" per root
        trials: list[dict[tuple[str, str], tuple[float, float]]] = []
        for trial in range(args.trials + 1):  # trial 0 warms up every path and is discarded
            order = jobs if trial % 2 else list(reversed(jobs))
            raw = {}
            for name, kind in order:
                raw[name, kind] = systems[name](requests, per_request) if kind == "segments" else systems[name](roots, 0)
            if trial == 0:
                continue
            result: dict[tuple[str, str], tuple[float, float]] = {}
            for name in systems:
                root_wall, root_cpu = (v / roots for v in raw[root_of[name], "roots"])
                wall, cpu = raw[name, "segments"]
                result[name, "roots"] = (root_wall, root_cpu)
                result[name, "segments"] = ((wall - requests * root_wall) / n_segments, (cpu - requests * root_cpu) / n_segments)
            trials.append(result)

    def med(name: str, kind: str, i: int) -> float:
        return statistics.median(t[name, kind][i] for t in trials)

    def over(name: str, kind: str, i: int) -> float:
        return statistics.median(t[name, kind][i] - t[BASELINE, kind][i] for t in trials)

    columns = ("per segment", "over baseline")
    print()
    print(f"{'ns, median of trials':<28}{'calling thread wall':^30}{'process CPU, drained':^30}")
    print(f"{'':<28}" + "".join(f"{c:>15}" for c in columns * 2))
    for kind, names in (("segments", list(systems)), ("roots", [n for n in systems if root_of[n] == n])):
        if kind == "roots":
            print("request root (begin + end):")
        for name in names:
            label = name if kind == "segments" else f"  {name}"
            print(f"{label:<28}" + "".join(f"{fn(name, kind, i):>15,.0f}" for i in (0, 1) for fn in (med, over)))

    def ratios(name: str, kind: str, i: int, net: bool) -> list[float]:
        floor = (lambda t: t[BASELINE, kind][i]) if net else (lambda t: 0.0)
        return [(t[name, kind][i] - floor(t)) / (t[OTEL, kind][i] - floor(t)) for t in trials]

    print()
    print("latprof / OpenTelemetry, median (min-max) over trials; target <= 0.50 per segment")
    print(f"{'':<28}" + "".join(f"{c:>20}" for c in ("wall", "wall over baseline", "CPU", "CPU over baseline")))
    for label, name, kind in (
        ("segment()", "latprof segment()", "segments"),
        ("record()", "latprof record()", "segments"),
        ("request root", "latprof segment()", "roots"),
    ):
        print(f"  {label:<26}" + "".join(f"{spread(ratios(name, kind, i, net)):>20}" for i in (0, 1) for net in (False, True)))


if __name__ == "__main__":
    main()
