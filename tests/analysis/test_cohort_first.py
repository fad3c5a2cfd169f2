"""Cohort-first analysis: every request's latency, then the segments of the cohorts, of each
window's tail and of a deterministic sample of the others - and the same verdict, rules and tail
numbers as the full analysis, with the layers' percentiles estimated and said to be.

Captures here are written by `benchmarks/gen_capture.py` (the benchmark's own shape: 9 segments
a request, a Poisson stream) and by the capture format's encoder; every in-process diagnosis of
the whole suite is also compared with its cohort-first twin (tests/conftest.py).
"""

from __future__ import annotations

import heapq
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from latprof.analysis.cohort_first import in_sample, pick
from latprof.analysis.requests import NS_PER_MS, cohorts
from latprof.analysis.timeline import build_timeline
from latprof.capture.format import encode, make_header
from latprof.capture.reader import read_captures
from latprof.cli import main
from latprof.events import Request, Segment
from latprof.export import EXPORT, read_input
from latprof.layers import DB_POOL, DB_QUERY, PROVIDER
from latprof.pipeline import run_diagnosis
from latprof.report.renderers.report_common import estimated_line
from latprof.semconv import SAMPLE_WEIGHT, TTFT_KNOWN

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 requests of the benchmark's shape (30,000 lines), 60 s of traffic at 50/s."""
    path = tmp_path_factory.mktemp("cohort") / "bench.jsonl"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_capture.py"), str(path), "--requests", "3000"],
                   check=True, capture_output=True)  # fmt: skip
    return path


def _tail_numbers(report: dict) -> dict:
    """Each layer's tail excess and share of it, for the layers with any (a layer without time in the cohorts
    may have a row in one analysis and not in the other: the rows come from the estimated means)."""
    rows = {row["layer"]: (row["tail_excess_ms"], row["share_of_tail_excess"]) for row in report["layers"]}
    return {layer: numbers for layer, numbers in rows.items() if numbers != (0.0, 0.0)}


def test_a_large_capture_gives_the_full_analysis_verdict_and_tail_numbers_reading_a_third_of_it(capture: Path) -> None:
    full = run_diagnosis([capture], exact=True)
    first = run_diagnosis([capture], sample_requests=300)
    assert full.analysis is not None and first.analysis is not None
    assert full.analysis.population is None
    population = first.analysis.population
    assert population is not None
    # read: the cohorts (1% + 5% + p40-p60 = a quarter), the windows' tails, and about 300 others
    assert len(first.analysis.requests) == population.materialised < 0.45 * len(population.requests)
    assert 200 <= population.sampled <= 400
    a, b = full.report.to_dict(), first.report.to_dict()
    for key in ("latency_ms", "window", "p99_over_time"):
        assert a[key] == b[key], key
    assert _tail_numbers(a) == _tail_numbers(b)
    assert a["verdict"] == b["verdict"]
    assert [f["rule"] for f in a["findings"]] == [f["rule"] for f in b["findings"]]
    assert a["collection"]["recorded_requests"] == b["collection"]["recorded_requests"] == len(population.requests)
    # the estimates: within 15% of the full analysis for every layer with time (a sample of 300 and the cohorts)
    estimates = {row["layer"]: row for row in b["layers"]}
    for exact in a["layers"]:
        for key in ("p50_ms", "p99_ms"):
            if exact[key] > 1:
                assert estimates[exact["layer"]][key] == pytest.approx(exact[key], rel=0.15), (exact["layer"], key)
    assert "estimated" not in a["collection"]
    said = b["collection"]["estimated"]
    assert said["method"] == "cohort-first" and said["requests"] == len(population.requests)
    assert said["requests_read"] == population.materialised and said["sample_one_in"] == population.one_in > 1
    assert "layers.p50_ms" in said["estimated"] and "layers.tail_excess_ms" in said["exact"]


def test_the_same_capture_gives_the_same_report(capture: Path) -> None:
    once = run_diagnosis([capture], sample_requests=300).report.to_dict()
    again = run_diagnosis([capture], sample_requests=300).report.to_dict()
    assert once == again


def test_a_capture_small_enough_is_read_whole(capture: Path) -> None:
    """With the default sample (10,000 others) 3,000 requests are all read: the analysis is exact."""
    diagnosis = run_diagnosis([capture])
    assert diagnosis.analysis is not None and diagnosis.analysis.population is None
    assert "estimated" not in diagnosis.report.to_dict()["collection"]


def test_the_pick_holds_every_cohort_and_each_windows_tail_and_a_hash_sample(capture: Path) -> None:
    timeline = build_timeline(read_captures([capture], defer_segments=True))
    assert all(not rt.segments for rt in timeline.requests)  # the first pass read no segment
    chosen = pick(timeline, 2.0, sample_requests=300)
    assert chosen is not None
    kept = [timeline.requests[i] for i in chosen.kept]
    latencies = [rt.latency_ns / NS_PER_MS for rt in kept]
    groups = cohorts(latencies)
    read = set(chosen.read)
    assert set(groups.tail) | set(groups.tail5) | set(groups.median) <= read
    # the sample: exactly the others whose id hashes into it
    certain = read - chosen.sampled
    assert chosen.sampled == {i for i in range(len(kept)) if i not in certain and in_sample(kept[i].request.request_id, chosen.one_in)}
    # each window's slowest request is read
    by_second: dict[int, int] = {}
    for i, rt in enumerate(kept):
        second = rt.request.start_ns // 10**9
        if second not in by_second or latencies[i] > latencies[by_second[second]]:
            by_second[second] = i
    assert set(by_second.values()) <= read


def test_segments_are_read_only_for_the_picked_requests(capture: Path) -> None:
    diagnosis = run_diagnosis([capture], sample_requests=300)
    analysis = diagnosis.analysis
    assert analysis is not None and analysis.population is not None
    with_segments = {rt.request.request_id for rt in analysis.timeline.requests if rt.segments}
    assert with_segments == {rt.request.request_id for rt in analysis.requests}
    assert all(len(rt.segments) == 9 for rt in analysis.requests)


def test_cohorts_above_the_cap_are_read_as_a_sample_and_said_to_be(capture: Path) -> None:
    """With a cap of 50 requests a cohort, the median cohort (~590) and the slowest 5% beyond the 1% are read 1 in
    k by hash, each request read standing for k; the slowest 1% (~30) is read whole. The segments held are bounded
    by the caps and the sample, the verdict is the full analysis's, and the tail numbers - estimated now - say so."""
    full_diagnosis = run_diagnosis([capture], exact=True)
    assert full_diagnosis.analysis is not None
    exact_groups = full_diagnosis.analysis.groups
    full = full_diagnosis.report.to_dict()
    diagnosis = run_diagnosis([capture], sample_requests=300, cohort_cap=50)
    analysis = diagnosis.analysis
    assert analysis is not None and analysis.population is not None
    capped = analysis.population.capped
    assert capped == {"median": (len(exact_groups.median), math.ceil(len(exact_groups.median) / 50)),
                      "tail5": (len(exact_groups.tail5), 2)}, capped  # fmt: skip
    groups = analysis.groups
    # the slowest 1% read whole, each once; a drawn cohort counts each request read as the k it stands for
    assert len(groups.tail) == len(set(groups.tail)) == len(exact_groups.tail)
    assert len(set(groups.median)) == pytest.approx(50, rel=0.4)
    assert len(groups.median) == pytest.approx(len(exact_groups.median), rel=0.25)
    assert len(groups.tail5) == pytest.approx(len(exact_groups.tail5), rel=0.25)
    # read: the 1%, each window's slowest, ~50 of each capped stratum, the windows' tails, ~300 others
    assert analysis.population.materialised <= len(groups.tail) + len(analysis.windows) + 3 * 100 + 400
    assert analysis.population.materialised < 0.15 * len(analysis.population.requests)
    report = diagnosis.report.to_dict()
    assert report["verdict"]["layer"] == full["verdict"]["layer"]
    assert [f["rule"] for f in report["findings"]] == [f["rule"] for f in full["findings"]]
    for key in ("latency_ms", "window", "p99_over_time"):
        assert report[key] == full[key], key
    exact_rows = _tail_numbers(full)
    big = {layer for layer, (excess, _share) in exact_rows.items() if excess > 50}
    assert big
    for layer in big:
        assert _tail_numbers(report)[layer][0] == pytest.approx(exact_rows[layer][0], rel=0.2), layer
    said = report["collection"]["estimated"]
    assert said["cohorts_sampled"]["median"] == {"requests": capped["median"][0], "sample_one_in": capped["median"][1]}
    assert "layers.tail_excess_ms" in said["estimated"] and "layers.tail_excess_ms" not in said["exact"]
    assert run_diagnosis([capture], sample_requests=300, cohort_cap=50).report.to_dict() == report
    line = estimated_line(said)
    assert line is not None and f"median cohort 1 in {capped['median'][1]} of {capped['median'][0]:,}" in line
    assert "tail numbers are estimated too" in line


def _write(path: Path, events: list[Request | Segment]) -> Path:
    with open(path, "wb") as out:
        out.write(orjson.dumps(make_header("run")) + b"\n")
        for event in events:
            out.write(orjson.dumps(encode(event)) + b"\n")
    return path


def _sampled_traffic(n: int, seed: int) -> list[Request | Segment]:
    """`n` overlapping requests, each recorded with a sample weight of 1-4, whose slowest wait for a
    pooled DB connection (`db.pool`) before their query and LLM call."""
    rng = random.Random(seed)
    events: list[Request | Segment] = []
    origin = 1_764_000_000 * 10**9
    for i in range(n):
        rid = f"{rng.getrandbits(64):016x}"
        start = origin + int(i * 25e6 + rng.uniform(0, 20e6))
        t = start
        wait = rng.choice([0] * 30 + [int(rng.uniform(300, 2000) * 1e6)])
        segments = []
        if wait:
            segments.append(Segment(rid, f"{rid}-p", None, "checkout", DB_POOL, t, t + wait, 7))
            t += wait
        query = int(rng.uniform(2, 9) * 1e6)
        segments.append(Segment(rid, f"{rid}-q", None, "SELECT", DB_QUERY, t, t + query, 7))
        t += query
        llm = int(rng.uniform(200, 400) * 1e6)
        segments.append(Segment(rid, f"{rid}-l", None, "chat", PROVIDER, t, t + llm, 7))
        t += llm + int(rng.uniform(1, 3) * 1e6)
        events.extend(segments)
        events.append(Request(rid, "POST /chat", start, t, 7, attrs={SAMPLE_WEIGHT: rng.randint(1, 4)}))
    return events


def test_sampled_requests_weigh_the_same_in_both_analyses(tmp_path: Path) -> None:
    path = _write(tmp_path / "sampled.jsonl", _sampled_traffic(4000, 11))
    full = run_diagnosis([path], exact=True).report.to_dict()
    first = run_diagnosis([path], sample_requests=200)
    assert first.analysis is not None and first.analysis.population is not None
    b = first.report.to_dict()
    assert full["window"] == b["window"] and full["latency_ms"] == b["latency_ms"]
    assert full["window"]["requests"] > 4000  # weighted
    assert _tail_numbers(full) == _tail_numbers(b)
    assert full["verdict"]["layer"] == b["verdict"]["layer"] == DB_POOL
    assert full["verdict"]["rule"] == b["verdict"]["rule"]
    assert full["collection"]["warmup_requests_skipped"] == b["collection"]["warmup_requests_skipped"] > 0


def test_analyze_exact_reads_everything_and_the_sample_size_is_an_option(capture: Path) -> None:
    runner = CliRunner()
    exact = runner.invoke(main, ["analyze", str(capture), "--format", "json", "--exact"])
    sampled = runner.invoke(main, ["analyze", str(capture), "--format", "json", "--sample-requests", "300"])
    assert exact.exit_code == 0 and sampled.exit_code == 0, (exact.output, sampled.output)
    a, b = json.loads(exact.output), json.loads(sampled.output)
    assert "estimated" not in a["collection"] and b["collection"]["estimated"]["sample_requests"] > 0
    assert a["verdict"] == b["verdict"]
    text = runner.invoke(main, ["analyze", str(capture), "--sample-requests", "300"])
    assert "estimated from" in text.output
    bad = runner.invoke(main, ["analyze", str(capture), "--sample-requests", "0"])
    assert bad.exit_code == 2


def test_two_processes_read_the_second_pass_as_one_does(capture: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second pass of a plain capture is read by this process and a forked one (its second half):
    the same segments, in the same order, as one process reads; and a failed child's half is read here."""
    from latprof.capture import reader

    monkeypatch.setattr(reader, "_FORK_MIN_BYTES", 0)
    timeline = build_timeline(read_captures([capture], defer_segments=True))
    chosen = pick(timeline, 2.0, sample_requests=300)
    assert chosen is not None
    wanted = chosen.wanted_ids(timeline)
    results = []
    for workers in (1, 2):
        data = read_captures([capture], defer_segments=True)
        reader.read_deferred_segments(data, wanted, workers=workers)
        results.append(data)
    one, two = results
    assert one.segments_by_request == two.segments_by_request and len(one.segments_by_request) == len(wanted)
    assert one.segment_count == two.segment_count == 9 * len(wanted)

    def broken_pickle(pipe: object) -> object:
        raise EOFError("a child that said nothing whole")

    monkeypatch.setattr(reader.pickle, "load", broken_pickle)
    data = read_captures([capture], defer_segments=True)
    reader.read_deferred_segments(data, wanted, workers=2)
    assert data.segments_by_request == one.segments_by_request and data.segment_count == one.segment_count


def _pooled_traffic(n: int, pool: int, seed: int) -> list[Request | Segment]:
    """`n` requests through a FIFO pool of `pool` DB connections, each held from its first statement
    across its LLM call to its last, arriving spaced out with a burst of eight now and then; nothing
    records the wait for a connection: only the gap before the first statement shows it."""
    rng = random.Random(seed)
    free = [0] * pool  # when each connection comes back (a heap)
    events: list[Request | Segment] = []
    t = 1_764_000_000 * 10**9
    for i in range(n):
        t += int((rng.uniform(110, 150) if i % 40 not in range(1, 8) else 0.5) * NS_PER_MS)
        got = max(t, heapq.heappop(free))
        rid = f"{rng.getrandbits(64):016x}"
        llm = int(rng.uniform(150, 170) * NS_PER_MS)
        first, call, last = got + 3 * 10**6, got + 3 * 10**6 + llm, got + 6 * 10**6 + llm
        events += [Segment(rid, f"{rid}-q", None, "SELECT", DB_QUERY, got, first, 7),
                   Segment(rid, f"{rid}-l", None, "POST", PROVIDER, first, call, 7),
                   Segment(rid, f"{rid}-i", None, "INSERT", DB_QUERY, call, last, 7)]  # fmt: skip
        heapq.heappush(free, last)
        events.append(Request(rid, "POST /chat", t, last + 2 * 10**6, 7))
    return events


def _as_otlp(path: Path, events: list[Request | Segment]) -> Path:
    """`events` as the OTLP JSON file `latprof export` makes of their capture."""
    capture = _write(path.with_name(path.name + ".capture.jsonl"), events)
    with open(path, "w", encoding="utf-8") as out:
        EXPORT.render("otlp", read_input([capture]), out)
    return path


def test_a_trace_file_is_inferred_whole_and_analysed_cohort_first(tmp_path: Path) -> None:
    """A trace file's inferences compare each trace with the ones beside it, so it is mapped and inferred whole;
    the analysis then reads the cohorts and a sample, as a capture's does: the same verdict (a pool inferred from
    the gaps before the first statement), rules and tail numbers as the full analysis, the unpicked requests'
    segments let go, and the report saying what it estimated."""
    traces = _as_otlp(tmp_path / "pooled.otlp.jsonl", _pooled_traffic(3000, 3, 5))
    full = run_diagnosis([traces], exact=True)
    first = run_diagnosis([traces], sample_requests=200)
    assert full.analysis is not None and full.analysis.population is None
    analysis = first.analysis
    assert analysis is not None and analysis.population is not None
    assert analysis.population.materialised < 0.45 * len(analysis.population.requests)
    a, b = full.report.to_dict(), first.report.to_dict()
    assert a["source"]["kind"] == b["source"]["kind"] == "otlp"
    assert (a["verdict"]["layer"], a["verdict"]["rule"]) == (DB_POOL, "db-pool-exhaustion"), a["verdict"]
    assert a["verdict"] == b["verdict"] and "inferred" in b["verdict"]["summary"]
    assert [f["rule"] for f in a["findings"]] == [f["rule"] for f in b["findings"]]
    for key in ("latency_ms", "window", "p99_over_time"):
        assert a[key] == b[key], key
    assert _tail_numbers(a) == _tail_numbers(b)
    # inferred on every trace (the pool's holders are the requests beside the tail's), read for the picked only
    assert any(s.layer == DB_POOL for rt in analysis.requests for s in rt.segments)
    with_segments = {rt.request.request_id for rt in analysis.timeline.requests if rt.segments}
    assert with_segments == {rt.request.request_id for rt in analysis.requests}
    said = b["collection"]["estimated"]
    assert said["method"] == "cohort-first" and said["requests_read"] == analysis.population.materialised
    assert "estimated" not in a["collection"]


def test_a_trace_file_with_a_call_whose_first_token_is_unknown_is_analysed_whole(tmp_path: Path) -> None:
    """A non-streamed LLM call is split into provider and model by the decode rates of every call analysed
    (`genai.unstreamed_splitter`): read from the picked requests alone, the median's split - and the tail numbers
    made of it - would differ from the full analysis's, so such a trace file is analysed whole."""
    events = _pooled_traffic(3000, 3, 5)
    events = [e._replace(attrs={TTFT_KNOWN: False}) if isinstance(e, Segment) and e.layer == PROVIDER and k % 7 == 0 else e
              for k, e in enumerate(events)]  # fmt: skip
    traces = _as_otlp(tmp_path / "unstreamed.otlp.jsonl", events)
    diagnosis = run_diagnosis([traces], sample_requests=200)
    assert diagnosis.analysis is not None and diagnosis.analysis.population is None
    assert any(s.attrs.get(TTFT_KNOWN) is False for rt in diagnosis.analysis.timeline.requests for s in rt.segments)
    assert "estimated" not in diagnosis.report.to_dict()["collection"]
