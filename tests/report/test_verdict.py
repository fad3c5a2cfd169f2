"""Every branch of report-v1's verdict rules, on hand-built populations with known answers."""

from __future__ import annotations

import pytest
from timelines import analysed, population, req, seg

from latprof.analysis.requests import DEFAULT_MIN_TAIL_EXCESS_MS
from latprof.engine import Finding, fingerprint
from latprof.report.model import build_report
from latprof.report.verdict import decide_verdict

TYPICAL = [("db.query", 20), ("provider", 400), ("model", 200)]


def finding(rule: str, layer: str | None, impact: float, crashed: bool = False) -> Finding:
    evidence = {"rule_crashed": True} if crashed else {}
    return Finding(rule, layer, "critical", 0.9, impact, "x", evidence, "fix", fingerprint(rule, layer, ""))


def test_layer_with_largest_excess_owns_the_tail():
    a = analysed(population(200, TYPICAL, [("db.pool", 3000), *TYPICAL]))
    verdict = decide_verdict(a, [finding("db-pool-exhaustion", "db.pool", 3000)])
    assert verdict.layer == "db.pool"
    assert verdict.rule == "db-pool-exhaustion"
    assert verdict.share_of_tail_excess == pytest.approx(1.0, abs=0.01)
    assert verdict.confidence == pytest.approx(1.0, abs=0.01)
    assert verdict.summary.startswith("db.pool owns 100% of the tail")
    assert "waited 3.0 s longer for a database connection" in verdict.summary


def test_rule_is_null_when_no_finding_explains_the_layer_and_crashed_rules_never_count():
    a = analysed(population(200, TYPICAL, [("db.pool", 3000), *TYPICAL]))
    crashed = finding("db-pool-exhaustion", "db.pool", 0, crashed=True)
    other = finding("slow-query", "db.query", 10)
    assert decide_verdict(a, [other, crashed]).rule is None


def test_confidence_is_halved_when_the_leader_does_not_also_lead_the_slowest_5pct():
    # The slowest 1% (2 of 200, at least 3) wait for the pool; the next 4% sit in a queue
    # whose wait is shorter per request but spread over more of the 5%.
    reqs = []
    for i in range(200):
        if i in (50, 150, 199):
            spec = [("db.pool", 4000), *TYPICAL]
        elif i % 20 == 7:
            spec = [("queue", 3500), *TYPICAL]
        else:
            spec = TYPICAL
        cursor, segs = i * 100.0, []
        for layer, dur in spec:
            segs.append(seg(layer, cursor, cursor + dur + (i % 5) * 0.1))
            cursor += dur + (i % 5) * 0.1
        reqs.append(req(i * 100.0, cursor, *segs))
    a = analysed(reqs)
    assert a.layer("db.pool").tail_excess_ms > a.layer("queue").tail_excess_ms
    assert a.layer("queue").tail5_excess_ms > a.layer("db.pool").tail5_excess_ms
    verdict = decide_verdict(a, [])
    assert verdict.layer == "db.pool"
    assert verdict.confidence == pytest.approx(verdict.share_of_tail_excess * 0.5, abs=0.001)
    assert "across the slowest 5% queue leads instead" in verdict.summary


def test_no_tail_when_p99_is_under_twice_p50_but_summary_names_the_typical_layer():
    a = analysed(population(200, TYPICAL, [("db.query", 20), ("provider", 700), ("model", 200)]))
    assert a.latency.p99_ms < 2 * a.latency.p50_ms
    verdict = decide_verdict(a, [finding("provider-floor", "provider", 50)])
    assert verdict.layer is None and verdict.rule is None and verdict.share_of_tail_excess is None
    assert verdict.status == "no_tail"
    assert verdict.summary.startswith("No tail worth explaining")
    assert "typical latency is dominated by provider (400 ms" in verdict.summary


def test_no_verdict_with_fewer_than_50_requests():
    a = analysed(population(49, TYPICAL, [("db.pool", 3000), *TYPICAL]))
    verdict = decide_verdict(a, [])
    assert verdict.layer is None and verdict.status == "too_few_requests"
    assert "Too few requests for a verdict: 49 analysed, 50 needed" in verdict.summary


def test_exactly_50_requests_is_enough():
    a = analysed(population(50, TYPICAL, [("db.pool", 3000), *TYPICAL], slow_every=10))
    assert decide_verdict(a, []).layer == "db.pool"


def test_unattributed_when_it_has_the_largest_excess():
    # The slow requests have 3 s no segment covers and no CPU measured.
    slow = population(200, TYPICAL, [*TYPICAL, (None, 3000)])
    a = analysed(slow)
    verdict = decide_verdict(a, [])
    assert verdict.layer == "unattributed" and verdict.status == "unattributed"
    assert "not explained by what was collected" in verdict.summary
    assert "latprof attach" in verdict.summary  # names what would see it (source kind run)


def test_unattributed_when_attributed_layers_explain_less_than_half():
    # Tail excess: 1000 ms db.pool, 1100 ms unattributed, a 300 ms faster model. The pool
    # leads among attributed layers but explains only 700 of the 1800 ms total excess.
    slow = [("db.pool", 1000), ("db.query", 20), ("provider", 400), (None, 1100)]
    a = analysed(population(200, [("db.query", 20), ("provider", 400), ("model", 300)], slow))
    assert a.layer("db.pool").tail_excess_ms == pytest.approx(1000, abs=5)
    assert a.layer("unattributed").tail_excess_ms > a.layer("db.pool").tail_excess_ms
    verdict = decide_verdict(a, [])
    assert verdict.layer == "unattributed"


def test_attributed_layer_wins_when_unattributed_is_minor():
    slow = [("db.pool", 2000), ("db.query", 20), ("provider", 400), ("model", 200), (None, 300)]
    a = analysed(population(200, TYPICAL, slow))
    assert decide_verdict(a, []).layer == "db.pool"


def test_cpu_backed_uncovered_time_is_app_not_unattributed():
    reqs = []
    for i in range(200):
        extra = 3000 if i % 20 == 19 else 0
        reqs.append(req(i * 100, i * 100 + 400 + extra + (i % 7), seg("provider", i * 100, i * 100 + 400), cpu_ms=extra + (i % 7)))
    verdict = decide_verdict(analysed(reqs), [])
    assert verdict.layer == "app"


@pytest.mark.parametrize(
    ("kind", "hint"),
    [("attach", "latprof run"), ("otlp", "instrument the calls"), ("run", "latprof attach")],
)
def test_unattributed_summary_names_the_collector_that_would_see_it(kind, hint):
    from timelines import timeline

    from latprof.analysis.requests import analyze

    a = analyze(timeline(population(200, TYPICAL, [*TYPICAL, (None, 3000)]), source_kind=kind), warmup_s=0)
    assert hint in decide_verdict(a, []).summary


def test_report_shape_follows_report_v1():
    a = analysed(population(200, TYPICAL, [("db.pool", 3000), *TYPICAL]))
    report = build_report(a, [finding("db-pool-exhaustion", "db.pool", 3000)]).to_dict()
    assert report["schema"] == "latprof.report/1"
    assert set(report) >= {"schema", "source", "window", "latency_ms", "layers", "verdict", "findings", "collection"}
    assert report["source"]["kind"] == "run" and report["source"]["pid"] == 1
    assert report["window"]["requests"] == 200
    assert set(report["latency_ms"]) == {"p50", "p90", "p99", "max"}
    assert report["layers"][0]["layer"] == "db.pool"
    assert {"layer", "p50_ms", "p99_ms", "tail_excess_ms", "share_of_tail_excess"} <= set(report["layers"][0])
    assert sum(row["share_of_tail_excess"] for row in report["layers"]) == pytest.approx(1.0, abs=0.001)
    assert set(report["verdict"]) == {"layer", "rule", "share_of_tail_excess", "confidence", "summary", "status"}
    assert report["verdict"]["status"] == "layer"
    assert set(report["findings"][0]) >= {"rule", "layer", "severity", "confidence", "impact_ms", "summary", "evidence", "fix"}
    assert set(report["collection"]) >= {"collectors", "coverage", "idle_share", "warmup_requests_skipped", "overhead", "warnings"}
    assert report["collection"]["coverage"] == 1.0
    assert all(layer["layer"] in {
        "queue", "event_loop", "db.pool", "db.query", "http.pool", "provider", "model", "tool", "retry", "lock", "app", "unattributed"
    } for layer in report["layers"])


# --- the floor on the tail excess -------------------------------------------------------------------

FAST = [("db.query", 2), ("app", 3)]
FAST_SLOW = [("db.query", 12), ("app", 3)]  # the slowest 5%: 10 ms more in the database, p99 ~15 ms


def test_no_verdict_when_the_tail_excess_is_under_the_floor_and_the_summary_says_why():
    a = analysed(population(200, FAST, FAST_SLOW))
    assert a.latency.p99_ms >= 2 * a.latency.p50_ms  # a tail by the ratio alone ...
    assert 10 <= a.tail_excess_ms <= 13  # ... of 10 ms in the database (and the population's jitter)
    assert a.min_tail_excess_ms == DEFAULT_MIN_TAIL_EXCESS_MS == 20.0 and not a.has_tail
    verdict = decide_verdict(a, [])
    assert verdict.layer is None and verdict.rule is None and verdict.status == "no_tail"
    assert verdict.summary.startswith("No tail worth explaining: the slowest 1% of requests took 1")
    assert "under the 20 ms worth acting on (min_tail_excess_ms)" in verdict.summary
    assert "typical latency is dominated by app (" in verdict.summary


def test_the_floor_is_configurable_and_a_lower_one_gives_the_verdict_back():
    from timelines import timeline

    from latprof.analysis.requests import analyze

    a = analyze(timeline(population(200, FAST, FAST_SLOW)), warmup_s=0, min_tail_excess_ms=5.0)
    assert a.has_tail
    verdict = decide_verdict(a, [])
    assert verdict.layer == "db.query" and verdict.status == "layer"


def test_two_runs_of_a_fast_healthy_service_agree_there_is_no_tail():
    # The same service twice, its slow requests a few ms slower in the database: p99 lands
    # either side of 2x p50, so without the floor one run says "db.query owns the tail" and
    # the other nothing; with it both say there is no tail worth explaining.
    from timelines import timeline

    from latprof.analysis.requests import analyze

    runs = [population(200, FAST, [("db.query", 2 + extra), ("app", 3)], jitter_ms=1.0) for extra in (4, 7)]
    unfloored = [decide_verdict(analyze(timeline(r), warmup_s=0, min_tail_excess_ms=0), []) for r in runs]
    assert [v.status for v in unfloored] == ["no_tail", "layer"] and unfloored[1].layer == "db.query"
    assert [decide_verdict(analysed(r), []).status for r in runs] == ["no_tail", "no_tail"]
