"""Sampling at high request rates: the hooks' sampler, and an analysis that weighs each recorded request.

The contract: a request recorded with `latprof.sample_weight` k counts as k requests. So a
capture of weighted requests must analyse exactly like the capture in which each of them
appears k times - counts, percentiles, cohorts, layer statistics, windows, verdict, findings.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from latprof.collectors.hooks.runtime import Sampler
from timelines import req, seg, timeline

from latprof.analysis.requests import analyze, sample_weight
from latprof.engine import run_rules
from latprof.pipeline import default_rules
from latprof.report.model import build_report
from latprof.semconv import SAMPLE_WEIGHT, SEGMENT_CONNECTION_HOLD
from latprof.analysis.timeline import RequestTimeline


def numbers(obj: object) -> dict[str, float]:
    """The numeric fields of a dataclass instance."""
    return {k: v for k, v in dataclasses.asdict(obj).items() if isinstance(v, (int, float))}  # type: ignore[call-overload]


def weighted(rt: RequestTimeline, weight: int) -> RequestTimeline:
    return RequestTimeline(rt.request._replace(attrs={SAMPLE_WEIGHT: weight}), rt.segments)


def copies(rt: RequestTimeline, n: int) -> list[RequestTimeline]:
    """`n` requests identical to `rt` but for their ids."""
    out = []
    for k in range(n):
        rid = f"{rt.request.request_id}-{k}"
        out.append(
            RequestTimeline(
                rt.request._replace(request_id=rid),
                tuple(s._replace(request_id=rid, segment_id=f"{s.segment_id}-{k}") for s in rt.segments),
            )
        )
    return out


def traffic(n: int, seed: int, tail: str) -> list[tuple[RequestTimeline, int]]:
    """`n` overlapping requests whose tail is a wait in layer `tail` (db.pool or queue), each
    with a random weight 1-6. Most hold their DB connection across the LLM call."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t0 = i * 40.0 + rng.uniform(0, 30)
        query = rng.uniform(2, 8)
        provider = rng.uniform(300, 500)
        wait = rng.choice([0.0] * 12 + [rng.uniform(500, 3000)])
        segments = []
        cursor = t0
        if wait:
            segments.append(seg(tail, cursor, cursor + wait, **{"db.client.connection.pool.name": "main"}))
            cursor += wait
        hold_start = cursor
        segments.append(seg("db.query", cursor, cursor + query))
        cursor += query
        segments.append(seg("provider", cursor, cursor + provider, **{"gen_ai.request.model": "m"}))
        cursor += provider
        if rng.random() < 0.8:
            segments.append(seg(None, hold_start, cursor, name=SEGMENT_CONNECTION_HOLD))
        cursor += rng.uniform(0.5, 3)
        rt = req(t0, cursor, *segments, cpu_ms=1.0)
        out.append((rt, rng.randint(1, 6)))
    return out


@pytest.mark.parametrize(("seed", "tail"), [(1, "db.pool"), (2, "db.pool"), (3, "queue"), (4, "queue")])
def test_a_weighted_capture_analyses_exactly_like_its_requests_repeated(seed, tail):
    pairs = traffic(400, seed, tail)
    sampled = analyze(timeline([weighted(rt, w) for rt, w in pairs]), warmup_s=1.0)
    repeated = analyze(timeline([c for rt, w in pairs for c in copies(rt, w)]), warmup_s=1.0)

    assert sampled.weights is not None and repeated.weights is None
    assert len(sampled.requests) < len(repeated.requests) == sampled.represented
    assert numbers(sampled.latency) == pytest.approx(numbers(repeated.latency))
    assert sampled.warmup_skipped == repeated.warmup_skipped > 0
    for layer, stats in repeated.layers.items():
        assert numbers(sampled.layers[layer]) == pytest.approx(numbers(stats)), layer
    assert [numbers(w) for w in sampled.windows] == [pytest.approx(numbers(w)) for w in repeated.windows]
    assert sampled.coverage == pytest.approx(repeated.coverage)

    a = build_report(sampled, run_rules(sampled, default_rules())).to_dict()
    b = build_report(repeated, run_rules(repeated, default_rules())).to_dict()
    assert a["verdict"]["layer"] == b["verdict"]["layer"] == tail
    assert a["verdict"]["share_of_tail_excess"] == pytest.approx(b["verdict"]["share_of_tail_excess"])
    assert a["window"]["requests"] == b["window"]["requests"]
    assert a["latency_ms"] == pytest.approx(b["latency_ms"])
    assert [f["rule"] for f in a["findings"]] == [f["rule"] for f in b["findings"]]
    assert [f["impact_ms"] for f in a["findings"]] == pytest.approx([f["impact_ms"] for f in b["findings"]])
    for fa, fb in zip(a["findings"], b["findings"]):
        ea = {k: v for k, v in fa["evidence"].items() if k != "example_request_ids"}
        eb = {k: v for k, v in fb["evidence"].items() if k != "example_request_ids"}
        assert ea == eb, fa["rule"]
    # Example ids name distinct recorded requests, not one sampled request three times.
    for finding in a["findings"]:
        ids = finding["evidence"].get("example_request_ids", [])
        assert len(ids) == len(set(ids))
    assert a["collection"]["recorded_requests"] == len(sampled.requests)
    assert [w for w in a["collection"]["warnings"] if w.startswith("sampled:")]
    assert b["collection"]["recorded_requests"] == b["window"]["requests"]
    assert not [w for w in b["collection"]["warnings"] if w.startswith("sampled:")]


def test_weights_that_are_not_a_believable_whole_number_count_once():
    rt = req(0, 10)
    assert sample_weight(rt) == 1
    for bad in (0, -3, 2.5, "4", True, 10**9, None):
        assert sample_weight(weighted(rt, bad)) == 1, bad  # type: ignore[arg-type]
    assert sample_weight(weighted(rt, 7)) == 7
    assert sample_weight(weighted(rt, 7.0)) == 7  # type: ignore[arg-type]


class Clock:
    """A monotonic clock the test moves by hand (ns)."""

    def __init__(self) -> None:
        self.now = 10**12

    def __call__(self) -> int:
        return self.now


def arrivals(sampler: Sampler, clock: Clock, rate: float, seconds: float) -> list[int]:
    """Feed `rate` requests a second for `seconds` into the sampler; its decision for each."""
    gap = int(1e9 / rate)
    out = []
    for _ in range(int(rate * seconds)):
        clock.now += gap
        out.append(sampler())
    return out


def test_below_the_max_rate_every_request_is_recorded_once():
    clock = Clock()
    sampler = Sampler(100, clock=clock, rng=random.Random(1).random)
    assert set(arrivals(sampler, clock, 90, 5)) == {1}
    assert Sampler(0, clock=clock)() == 1 and set(arrivals(Sampler(0, clock=clock), clock, 50_000, 1)) == {1}


@pytest.mark.parametrize("rate", [400, 3_000, 20_000])
def test_above_the_max_rate_about_max_rate_are_recorded_and_their_weights_add_up_to_the_arrivals(rate):
    clock = Clock()
    sampler = Sampler(100, clock=clock, rng=random.Random(rate).random)
    decisions = arrivals(sampler, clock, rate, 20)
    recorded = [w for w in decisions if w]
    per_second = len(recorded) / 20
    assert 60 <= per_second <= 140, per_second
    assert sum(recorded) == pytest.approx(len(decisions), rel=0.1)
    # After the first window the stride is the rate over the max rate, rounded up.
    stride = -(-rate // 100)
    assert set(decisions[len(decisions) // 2 :]) <= {0, stride, stride + 1}  # +1: a window's count is off by one


def test_a_burst_raises_the_stride_within_a_window_and_a_quiet_spell_lowers_it():
    clock = Clock()
    sampler = Sampler(100, clock=clock, rng=random.Random(5).random)
    arrivals(sampler, clock, 50, 2)
    assert sampler.stride == 1
    burst = arrivals(sampler, clock, 100_000, 0.05)  # 5,000 requests in 50 ms: all inside one window
    assert sum(1 for w in burst if w) < 200  # at stride 1 all 5,000 would have been recorded
    assert sampler.stride > 100
    clock.now += 2_000_000_000
    assert set(arrivals(sampler, clock, 20, 2)) == {1}


def test_one_of_each_k_consecutive_arrivals_is_recorded_so_a_run_of_slow_requests_is_never_all_missed():
    clock = Clock()
    sampler = Sampler(100, clock=clock, rng=random.Random(7).random)
    decisions = arrivals(sampler, clock, 250, 20)[500:]  # past the first windows: stride 3
    assert set(decisions) == {0, 3}
    # A run of slow requests (a pool backing up) is some consecutive arrivals: any 8 of them
    # keep at least 2 (two whole blocks of 3), where independent 1-in-3 draws would keep none
    # of 8 about 4% of the time, and at most 1 about 20%.
    kept = [sum(1 for w in decisions[i : i + 8] if w) for i in range(len(decisions) - 8)]
    assert min(kept) >= 2, min(kept)
    # Each position of a block is the recorded one equally often: a pattern that repeats
    # every 3 requests (a page calling three routes in turn) is seen through all its phases.
    by_phase = [sum(1 for w in decisions[phase::3] if w) for phase in range(3)]
    assert all(abs(n - len(decisions) / 9) <= 0.15 * len(decisions) / 9 for n in by_phase), by_phase
