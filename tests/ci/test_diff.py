"""`latprof diff`: the pure diff on hand-built reports with known answers, then the CLI on real demo captures."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from timelines import analysed, population

from latprof.analysis.requests import Analysis
from latprof.cli import main
from latprof.ci.diff import (
    SCHEMA,
    TAIL_EXCESS,
    TAIL_MEAN,
    Change,
    LayerChange,
    diff_reports,
    load,
    named_layers,
    read_saved_report,
    regression_failure,
    report_from_dict,
    signed_ms,
    signed_pct,
    tail_means,
)
from latprof.engine import Finding
from latprof.errors import InputError
from latprof.report import renderers
from latprof.report.model import Report, build_report

TYPICAL = [("provider", 100.0), ("model", 50.0)]


def _analysis(slow: list[tuple[str, float]], typical: list[tuple[str, float]] = TYPICAL, **kw: Any) -> Analysis:
    """200 requests 100 ms apart; every 20th is `slow` (so the slowest 1% are all slow ones)."""
    return analysed(population(200, typical, slow), **kw)


def _finding(rule: str, layer: str, subject: str = "") -> Finding:
    return Finding(rule, layer, "warning", 0.9, 100.0, f"{rule} on {layer}", {}, "fix it", f"{rule}/{layer}/{subject}")


def _with(report: Report, *findings: Finding) -> Report:
    return dataclasses.replace(report, findings=list(findings))


@pytest.fixture(scope="module")
def provider_then_retry() -> tuple[Analysis, Analysis]:
    before = _analysis([("provider", 700.0), ("model", 50.0)])  # slow ones wait 600 ms more for the first token
    after = _analysis([("provider", 100.0), ("retry", 1500.0), ("model", 50.0)])  # ... now sleep 1.5 s in backoff
    return before, after


def _diff(pair: tuple[Analysis, Analysis], before_findings: tuple[Finding, ...] = (), after_findings: tuple[Finding, ...] = (),
          **kw: Any):  # fmt: skip
    before, after = pair
    return diff_reports(
        build_report(before, list(before_findings)),
        build_report(after, list(after_findings)),
        before_tail_ms=tail_means(before),
        after_tail_ms=tail_means(after),
        **kw,
    )


# --- formatting -------------------------------------------------------------------------------


def test_signed_times_switch_from_ms_to_s_and_always_show_the_sign() -> None:
    assert signed_ms(410.4) == "+410 ms"
    assert signed_ms(-410.4) == "-410 ms"
    assert signed_ms(2300) == "+2.3 s"
    assert signed_ms(-400) == "-400 ms"
    assert signed_ms(-0.42) == "-0.4 ms"
    assert signed_ms(12_400) == "+12 s"
    assert signed_ms(0.0) == "+0.0 ms"
    assert signed_pct(265.6) == "+266%"
    assert signed_pct(-12.4) == "-12%"
    assert signed_pct(1.23) == "+1.2%"
    assert signed_pct(-4.96) == "-5.0%"


def test_a_change_in_percent_needs_a_non_zero_before() -> None:
    assert Change(200.0, 250.0).delta == 50.0 and Change(200.0, 250.0).pct == 25.0
    assert Change(0.0, 5.0).pct is None
    assert Change(None, 5.0).delta is None and Change(None, 5.0).pct is None


# --- diff_reports -----------------------------------------------------------------------------


def test_the_sentence_names_the_layers_whose_tail_time_moved_and_the_new_verdict(provider_then_retry) -> None:
    diff = _diff(provider_then_retry)
    # p99 754 ms → 1.65 s; in the slowest 1% retry went 0 → 1500 ms and provider 700 → 100 ms
    assert diff.summary == "p99 +900 ms (+119%, 754 ms → 1.7 s): retry +1.5 s, provider -600 ms in the slowest 1%; verdict provider → retry"
    assert diff.tail_metric == TAIL_MEAN and diff.material
    assert [c.layer for c in diff.layers] == ["retry", "provider", "model"]
    retry, provider, model = diff.layers
    assert (retry.tail_ms.before, retry.tail_ms.after) == (0.0, 1500.0)
    assert retry.p99_ms.before is None and retry.p99_ms.after == 1500.0  # not seen before: no row
    assert provider.tail_delta_ms == pytest.approx(-600.0)
    assert model.tail_delta_ms == 0.0  # the same jitter on both sides
    assert diff.latency_ms["p99"].delta == pytest.approx(900.0)
    assert diff.regression.p99_pct == pytest.approx(119.43, abs=0.01)


def test_without_tail_means_both_sides_use_the_tail_excess(provider_then_retry) -> None:
    before, after = provider_then_retry
    diff = diff_reports(build_report(before, []), build_report(after, []), before_tail_ms=tail_means(before))
    assert diff.tail_metric == TAIL_EXCESS
    assert diff.summary.startswith("p99 +900 ms (+119%, 754 ms → 1.7 s): retry +1.5 s, provider -600 ms in the tail's excess")


def test_findings_are_matched_by_fingerprint(provider_then_retry) -> None:
    floor, pool, backoff = _finding("provider-floor", "provider"), _finding("db-pool-exhaustion", "db.pool"), _finding("retry-backoff", "retry")
    moved_pool = dataclasses.replace(pool, summary="other numbers, same problem", impact_ms=5.0)
    diff = _diff(provider_then_retry, (floor, pool), (backoff, moved_pool))
    assert [f.rule for f in diff.findings.appeared] == ["retry-backoff"]
    assert [f.rule for f in diff.findings.disappeared] == ["provider-floor"]
    assert [(f.rule, f.summary) for f in diff.findings.unchanged] == [("db-pool-exhaustion", "other numbers, same problem")]
    assert diff.summary.endswith("; verdict provider → retry; new finding retry-backoff; finding provider-floor gone")
    two_queries = (_finding("slow-query", "db.query", "SELECT a"), _finding("slow-query", "db.query", "SELECT b"))
    assert _diff(provider_then_retry, (), (backoff, *two_queries)).summary.endswith("new findings retry-backoff, slow-query")


def test_the_same_report_twice_is_no_material_change(provider_then_retry) -> None:
    before, _ = provider_then_retry
    report = build_report(before, [_finding("provider-floor", "provider")])
    diff = diff_reports(report, report, before_tail_ms=tail_means(before), after_tail_ms=tail_means(before))
    assert diff.summary == "no material change: p99 +0.0 ms (+0.0%, 754 ms → 754 ms); verdict still provider"
    assert not diff.material and not diff.verdict_changed
    assert [f.rule for f in diff.findings.unchanged] == ["provider-floor"]
    assert regression_failure(diff.with_threshold(5)) is None


def test_a_small_p99_change_is_material_when_a_finding_appears(provider_then_retry) -> None:
    before, _ = provider_then_retry
    report = build_report(before, [])
    diff = diff_reports(report, _with(report, _finding("lock-contention", "lock")))
    assert diff.material
    assert diff.summary == "p99 +0.0 ms (+0.0%, 754 ms → 754 ms); verdict still provider; new finding lock-contention"


def test_a_p99_change_within_five_percent_is_not_material() -> None:
    before = _analysis([("provider", 700.0), ("model", 50.0)])
    after = _analysis([("provider", 730.0), ("model", 50.0)])  # p99 754 → 784 ms: +4.0%
    diff = diff_reports(build_report(before, []), build_report(after, []), before_tail_ms=tail_means(before), after_tail_ms=tail_means(after))
    assert diff.summary == "no material change: p99 +30 ms (+4.0%, 754 ms → 784 ms); verdict still provider"
    assert diff.layers[0].layer == "provider" and diff.layers[0].tail_delta_ms == pytest.approx(30.0)


def test_layers_under_five_percent_of_the_p99_change_are_not_named() -> None:
    before = _analysis([("provider", 700.0), ("model", 50.0)])
    # every request decodes 10 ms longer: +10 ms in the slowest 1%, about 1% of the p99 change
    after = _analysis([("provider", 100.0), ("retry", 1500.0), ("model", 60.0)], typical=[("provider", 100.0), ("model", 60.0)])
    diff = diff_reports(build_report(before, []), build_report(after, []), before_tail_ms=tail_means(before), after_tail_ms=tail_means(after))
    assert [c.layer for c in diff.layers] == ["retry", "provider", "model"]
    assert diff.layers[2].tail_delta_ms == pytest.approx(10.0)
    assert ": retry +1.5 s, provider -600 ms in the slowest 1%;" in diff.summary


def test_named_layers_are_at_most_three_and_at_least_one_ms() -> None:
    def moved(layer: str, delta_ms: float) -> LayerChange:
        nothing = Change(None, None)
        return LayerChange(layer, nothing, nothing, nothing, nothing, Change(100.0, 100.0 + delta_ms))

    layers = [moved("app", 0.9), moved("retry", -300.0), moved("model", 40.0), moved("lock", 500.0), moved("tool", 60.0)]
    assert [c.layer for c in named_layers(layers, 900.0)] == ["lock", "retry", "tool"]
    assert [c.layer for c in named_layers(layers, 1000.0)] == ["lock", "retry", "tool"]  # 60 ms >= 5% of 1 s
    assert [c.layer for c in named_layers(layers, 1300.0)] == ["lock", "retry"]  # 60 ms < 65 ms
    assert [c.layer for c in named_layers(layers, 2.0)] == ["lock", "retry", "tool"]
    assert [c.layer for c in named_layers([moved("app", 0.9)], 2.0)] == []  # under 1 ms
    assert [c.layer for c in named_layers([moved("app", 1.5)], None)] == ["app"]


def test_a_side_without_latency_still_diffs_and_cannot_be_checked(provider_then_retry) -> None:
    before, _ = provider_then_retry
    empty = _analysis([("provider", 700.0), ("model", 50.0)], warmup_s=1000.0)  # every request is warm-up
    assert empty.latency is None
    diff = diff_reports(build_report(before, []), build_report(empty, []), before_tail_ms=tail_means(before), after_tail_ms=tail_means(empty))
    assert diff.latency_ms["p99"] == Change(753.571, None)
    assert diff.summary.startswith("p99 754 ms → none (no requests analysed): provider -700 ms")
    assert diff.summary.endswith("; verdict provider → no verdict")
    assert diff.regression.p99_pct is None and not diff.regression.failed
    assert regression_failure(diff) is None  # not asked for
    with pytest.raises(InputError, match="AFTER has no p99"):
        regression_failure(diff.with_threshold(10))
    for fmt in ("text", "json", "markdown"):
        renderers.DIFF.render(fmt, diff, io.StringIO())


def test_the_regression_check_fails_only_above_its_threshold(provider_then_retry) -> None:
    diff = _diff(provider_then_retry)
    assert regression_failure(diff.with_threshold(120)) is None
    assert diff.with_threshold(120).regression.to_dict() == {"p99_pct": 119.43, "threshold_pct": 120, "failed": False}
    line = regression_failure(diff.with_threshold(100))
    assert line == "p99 regressed +119% (754 ms → 1.7 s), more than the allowed +100%"
    assert diff.with_threshold(100).regression.failed
    before, after = provider_then_retry
    faster = diff_reports(build_report(after, []), build_report(before, []), threshold_pct=0)
    assert regression_failure(faster) is None and faster.summary.startswith("p99 -900 ms (-54%, 1.7 s → 754 ms)")


# --- saved reports and renderers --------------------------------------------------------------


def test_a_saved_report_reads_back_to_the_same_diff(provider_then_retry, tmp_path: Path) -> None:
    before, after = provider_then_retry
    reports = [build_report(before, [_finding("provider-floor", "provider")]), build_report(after, [_finding("retry-backoff", "retry")])]
    direct = diff_reports(*reports)
    saved = []
    for name, report in zip(("before", "after"), reports):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(report.to_dict()))
        saved.append(path)
    again = [read_saved_report(path) for path in saved]
    assert again[0] is not None and again[1] is not None
    assert diff_reports(again[0], again[1]).to_dict() == direct.to_dict()
    assert report_from_dict(reports[0].to_dict()).to_dict() == reports[0].to_dict()
    loaded = load(saved[0])
    assert loaded.tail_ms is None and loaded.label == str(saved[0])
    assert read_saved_report(tmp_path / "missing.json") is None
    (tmp_path / "other.json").write_text('{"resourceSpans": []}')
    assert read_saved_report(tmp_path / "other.json") is None


def test_json_has_the_documented_keys(provider_then_retry) -> None:
    out = io.StringIO()
    diff = _diff(provider_then_retry, (), (_finding("retry-backoff", "retry"),), threshold_pct=10)
    renderers.DIFF.render("json", diff, out)
    data = json.loads(out.getvalue())
    assert data["schema"] == SCHEMA == "latprof.diff/1"
    assert set(data) >= {"summary", "before", "after", "latency_ms", "layers", "verdict", "findings", "regression", "tail_metric"}
    assert set(data["before"]) >= {"input", "source", "requests", "latency_ms", "verdict"}
    assert data["latency_ms"]["p99"] == {"before": 753.571, "after": 1653.571, "delta": 900.0, "pct": 119.43}
    assert data["layers"][0]["layer"] == "retry" and data["layers"][0]["tail_ms"]["delta"] == 1500.0
    assert set(data["layers"][0]) == {"layer", "p50_ms", "p99_ms", "mean_ms", "share_of_tail_excess", "tail_ms"}
    assert data["verdict"] == {"before": "provider", "after": "retry", "before_status": "layer", "after_status": "layer", "changed": True}
    assert [f["rule"] for f in data["findings"]["appeared"]] == ["retry-backoff"]
    assert set(data["findings"]["appeared"][0]) == {"rule", "layer", "summary", "fingerprint", "impact_ms"}
    assert data["findings"]["disappeared"] == [] and data["findings"]["unchanged"] == []
    assert data["regression"] == {"p99_pct": 119.43, "threshold_pct": 10, "failed": True}


def test_text_leads_with_the_sentence_then_the_layer_table(provider_then_retry) -> None:
    out = io.StringIO()
    diff = _diff(provider_then_retry, (_finding("provider-floor", "provider"),), (_finding("retry-backoff", "retry"),))
    renderers.DIFF.render("text", diff, out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("p99 +900 ms")
    header = next(i for i, line in enumerate(lines) if line.startswith("layer"))
    assert lines[header + 1].split()[:4] == ["retry", "-", "→", "1.5"]
    assert lines[header + 1].endswith("+1.5 s")
    assert lines[header + 2].startswith("provider") and lines[header + 2].endswith("-600 ms")
    assert "+ retry-backoff (retry): retry-backoff on retry" in lines
    assert "- provider-floor (provider): provider-floor on provider" in lines


def test_markdown_is_tables_for_a_pull_request(provider_then_retry) -> None:
    out = io.StringIO()
    diff = _diff(provider_then_retry, (), (_finding("retry-backoff", "retry"),), threshold_pct=10)
    renderers.DIFF.render("markdown", diff, out)
    text = out.getvalue()
    assert text.startswith("### latprof diff\n\n**p99 +900 ms")
    assert "| p99 | 754 ms | 1.7 s | +900 ms (+119%) |" in text
    assert "| verdict | provider | retry | |" in text
    assert "| `retry` | - → 1.5 s | - → 100% | +1.5 s |" in text
    assert "regression check: p99 +119%, +10% allowed: FAILED" in text
    assert "**New findings**\n\n- `retry-backoff` (retry): retry-backoff on retry" in text


# --- the CLI on real captures -----------------------------------------------------------------


def _cli(*args: str):
    return CliRunner().invoke(main, ["diff", *args], catch_exceptions=False)


@pytest.mark.slow
def test_healthy_to_pool_held_across_llm_is_a_db_pool_regression(demo_capture) -> None:
    healthy, held = demo_capture("healthy"), demo_capture("pool-held-across-llm")
    result = _cli(str(healthy.capture), str(held.capture), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "latprof.diff/1" and data["tail_metric"] == "tail_mean_ms"
    assert data["before"]["input"] == str(healthy.capture) and data["after"]["input"] == str(held.capture)
    p99 = data["latency_ms"]["p99"]
    assert p99["delta"] > 0 and p99["pct"] > 50, p99
    top = data["layers"][0]
    assert top["layer"] == "db.pool", data["layers"]
    assert top["tail_ms"]["delta"] > 100 and top["tail_ms"]["delta"] > 0.5 * p99["delta"], top  # most of the p99 change
    assert ": db.pool +" in data["summary"], data["summary"]  # the first layer named
    assert "db-pool-exhaustion" in [f["rule"] for f in data["findings"]["appeared"]], data["findings"]
    assert "new finding" in data["summary"] and "db-pool-exhaustion" in data["summary"]
    assert data["verdict"]["after"] == "db.pool" and data["verdict"]["changed"]
    assert data["regression"] == {"p99_pct": p99["pct"], "threshold_pct": None, "failed": False}
    text = _cli(str(healthy.capture), str(held.capture))
    assert text.exit_code == 0 and text.stdout.splitlines()[0] == data["summary"]
    print(text.stdout)


@pytest.mark.slow
def test_pool_held_across_llm_to_healthy_shows_the_finding_gone(demo_capture) -> None:
    healthy, held = demo_capture("healthy"), demo_capture("pool-held-across-llm")
    result = _cli(str(held.capture), str(healthy.capture), "--format", "json", "--fail-on-regression", "0")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "db-pool-exhaustion" in [f["rule"] for f in data["findings"]["disappeared"]]
    assert "db-pool-exhaustion" not in [f["rule"] for f in data["findings"]["appeared"] + data["findings"]["unchanged"]]
    assert data["layers"][0]["layer"] == "db.pool" and data["layers"][0]["tail_ms"]["delta"] < -100
    assert data["latency_ms"]["p99"]["delta"] < 0
    assert "finding db-pool-exhaustion gone" in data["summary"] or "findings db-pool-exhaustion" in data["summary"]
    assert data["regression"]["failed"] is False


@pytest.mark.slow
def test_a_capture_against_itself_is_no_material_change(demo_capture) -> None:
    held = demo_capture("pool-held-across-llm")
    result = _cli(str(held.capture), str(held.capture), "--fail-on-regression", "5")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("no material change: p99 +0.0 ms (+0.0%, "), result.stdout
    assert "regression check: p99 +0.0%, +5% allowed: passed" in result.stdout
    assert result.stderr == ""


@pytest.mark.slow
def test_fail_on_regression_exits_1_with_one_line(demo_capture, tmp_path: Path) -> None:
    healthy, held = demo_capture("healthy"), demo_capture("pool-held-across-llm")
    out = tmp_path / "diff.md"
    result = _cli(str(healthy.capture), str(held.capture), "--fail-on-regression", "10", "--format", "markdown", "-o", str(out))
    assert result.exit_code == 1, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("latprof diff: p99 regressed +") and "more than the allowed +10%" in line, line
    assert result.stdout == ""
    assert out.read_text().startswith("### latprof diff\n\n**p99 +")


@pytest.mark.slow
def test_a_saved_report_diffs_against_a_capture(demo_capture) -> None:
    healthy, held = demo_capture("healthy"), demo_capture("pool-held-across-llm")
    result = _cli(str(healthy.capture), str(held.report_json), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["tail_metric"] == "tail_excess_ms"  # the saved report has no tail means
    assert data["after"]["latency_ms"] == json.loads(held.report_json.read_text())["latency_ms"]
    assert data["layers"][0]["layer"] == "db.pool" and ": db.pool +" in data["summary"]


@pytest.mark.slow
def test_a_capture_with_no_requests_after_warmup_diffs_but_cannot_be_checked(demo_capture) -> None:
    held = demo_capture("pool-held-across-llm")
    shown = _cli(str(held.capture), str(held.capture), "--skip-warmup", "1000")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith("no material change: p99 none → none (no requests analysed)")
    checked = _cli(str(held.capture), str(held.capture), "--skip-warmup", "1000", "--fail-on-regression", "5")
    assert checked.exit_code == 2
    [line] = checked.stderr.splitlines()
    assert line == (
        "latprof: error: --fail-on-regression: BEFORE and AFTER have no p99 (no requests analysed after warm-up); cannot compare"
    )


def test_a_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    there = tmp_path / "there.jsonl"
    there.write_text("")
    result = _cli(str(tmp_path / "nope.jsonl"), str(there))
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line == f"latprof: error: {tmp_path / 'nope.jsonl'}: no such file or directory"
    assert result.stdout == ""
