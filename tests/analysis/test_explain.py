"""One request explained: the four real traces of tests/collectors/traces/fixtures/otlp read as their
README concludes, and synthetic requests for each rule's edges (what must not fire)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from latprof.analysis.explain import explain_request
from latprof.analysis.timeline import RequestTimeline
from latprof.events import Request, Segment
from latprof.layers import DB_QUERY, PROVIDER, TOOL
from latprof.pipeline import run_diagnosis
from latprof.semconv import SPAN_STATUS_ERROR
from tests.report_schema import assert_valid

FIXTURES = Path(__file__).resolve().parents[1] / "collectors" / "traces" / "fixtures" / "otlp"
T0 = 1_790_000_000_000_000_000
_ids = itertools.count(1)


def explained(name: str, **kw: Any) -> dict[str, Any]:
    """The one explained request of a fixture, from the report-v1 JSON."""
    report = run_diagnosis([FIXTURES / name], **kw).report.to_dict()
    assert_valid(report)
    [request] = report["requests"]
    return request


def kinds(request: dict[str, Any]) -> list[str]:
    return [f["kind"] for f in request["findings"]]


def test_a_proxy_timeout_masks_the_frontend_span_that_used_the_budget() -> None:
    request = explained("error_timeout_masked.otlp.json")
    assert kinds(request) == ["timeout-masked"]
    [finding] = request["findings"]
    evidence = finding["evidence"]
    assert evidence["inferred"] is True
    assert (evidence["failed_service"], evidence["failed_as"]) == ("frontend-proxy", "HTTP 504")
    assert (evidence["used_by_span"], evidence["used_by_service"]) == ("POST", "frontend")
    assert evidence["used_ms"] > 0.99 * evidence["failed_ms"] > 14_000
    assert evidence["traced_below"] == 0  # the trace stops at the frontend: the fix says to trace below it
    assert "nothing below it was traced" in finding["fix"]
    # the critical path's longest span is the frontend's POST, 99% of the request
    top = request["critical_path"]["spans"][0]
    assert (top["name"], top["service"]) == ("POST", "frontend") and top["share"] > 0.99


def test_thirteen_sequential_redis_calls_are_an_n_plus_one_with_the_time_a_batch_saves() -> None:
    request = explained("n_plus_one_positive.otlp.json")
    assert kinds(request) == ["sequential-calls"]  # the retried timeouts are not "several errors"
    evidence = request["findings"][0]["evidence"]
    assert evidence["calls"] == 13 and evidence["failed_calls"] == 3
    # 13 calls of 8-31 ms back to back (~194 ms): at once, the slowest call's 30 ms
    assert evidence["call_ms_max"] == pytest.approx(30.455, abs=0.01)
    assert evidence["saved_ms_if_concurrent"] == pytest.approx(evidence["sequential_ms"] - evidence["call_ms_max"], abs=0.01)
    assert 150 < evidence["saved_ms_if_concurrent"] < evidence["saved_ms_if_batched"] < evidence["sequential_ms"]
    assert "GetDriver" in request["findings"][0]["summary"]
    # the longest gap is the untraced 1.3 s before the driver lookup (the trimmed customer call)
    gap = request["longest_gap"]
    assert gap["ms"] == pytest.approx(1299.9, abs=0.5) and gap["start_offset_ms"] == 0
    assert "FindNearest" in gap["before"]


def test_overlapping_sibling_calls_are_not_an_n_plus_one() -> None:
    request = explained("n_plus_one_near_miss.otlp.json")
    assert kinds(request) == []
    top = request["critical_path"]["spans"][0]
    assert top["name"] == "HTTP GET" and top["ms"] == pytest.approx(1309.6, abs=0.5)  # the one slow customer lookup
    assert request["longest_gap"]["ms"] == pytest.approx(225.0, abs=0.5)


def test_the_first_of_several_errored_siblings_is_the_cause_followed_to_its_origin() -> None:
    request = explained("sibling_errors.otlp.json")
    assert kinds(request) == ["first-error"]
    evidence = request["findings"][0]["evidence"]
    assert evidence["first_failed_span"] == "oteldemo.PaymentService/Charge"
    assert (evidence["origin_span"], evidence["origin_service"]) == ("oteldemo.PaymentService/Charge", "payment")
    assert evidence["later_failed_spans"] == ["oteldemo.EmailService/SendOrderConfirmation"]


def test_explanations_only_when_too_few_for_a_verdict_or_a_trace_is_picked(tmp_path: Path) -> None:
    merged = tmp_path / "two.otlp.json"
    merged.write_bytes(
        b"\n".join(json.dumps(json.loads((FIXTURES / name).read_bytes())).encode() for name in
                   ("n_plus_one_positive.otlp.json", "n_plus_one_near_miss.otlp.json")) + b"\n"
    )  # fmt: skip
    report = run_diagnosis([merged]).report.to_dict()
    assert len(report["requests"]) == 2 and report["requests"][0]["latency_ms"] >= report["requests"][1]["latency_ms"]
    assert "explained on its own" in report["verdict"]["summary"]
    picked = run_diagnosis([merged], trace_id="66371DD0EAFC70E48E4234803FE94D41").report.to_dict()
    assert [r["request_id"] for r in picked["requests"]] == ["66371dd0eafc70e48e4234803fe94d41"]
    assert picked["collection"]["warmup_requests_skipped"] == 0  # a picked trace is not warm-up
    many = run_diagnosis([Path(__file__).resolve().parents[2] / "examples" / "healthy.jsonl.gz"]).report.to_dict()
    assert "requests" not in many


def test_the_cli_picks_a_trace_and_refuses_an_unknown_one_in_one_line() -> None:
    fixture = str(FIXTURES / "sibling_errors.otlp.json")
    ok = subprocess.run([sys.executable, "-m", "latprof", "analyze", fixture, "--trace", "7c4f1a90b3e84d2f9a6c5e8017b3d264"],
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "Each request explained" in ok.stdout and "first-error" in ok.stdout and "payment" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "latprof", "analyze", fixture, "--trace", "abc123"], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [f"latprof: error: no trace abc123 in {fixture} (1 requests read)"]


# --- synthetic requests: the edges ------------------------------------------------------------


def ms(t: float) -> int:
    return T0 + int(t * 1_000_000)


def seg(name: str, start: float, end: float, layer: str | None = TOOL, parent: Segment | None = None, **attrs: Any) -> Segment:
    return Segment("r", f"s{next(_ids)}", parent.segment_id if parent else None, name, layer, ms(start), ms(end), 1, attrs)


def request(end: float, *segments: Segment) -> RequestTimeline:
    return RequestTimeline(Request("r", "GET /x", ms(0), ms(end), 1, None, 200), segments)


def test_the_critical_path_gives_each_span_its_own_time_and_the_innermost_owns_it() -> None:
    handler = seg("handler", 0, 90, None)
    query = seg("SELECT", 10, 40, DB_QUERY, handler)
    llm = seg("chat", 45, 85, PROVIDER, handler)
    e = explain_request(request(110, handler, query, llm), {})
    own = {p.name: round(p.ms, 3) for p in e.path}
    assert own == {"chat": 40.0, "SELECT": 30.0, "handler": 20.0}  # handler: 0-10, 40-45, 85-90
    assert {p.name: p.layer for p in e.path}["handler"] is None
    assert e.gap is not None and e.gap.ms == pytest.approx(20.0) and e.gap.inside == "the request (GET /x)"
    assert e.gap.after == "`handler`" and e.gap.before is None  # 90-110: the root's own, after the handler


def test_an_n_plus_one_needs_identical_back_to_back_calls_that_matter() -> None:
    def lookups(count: int, each: float, statement: str = "SELECT * FROM a WHERE id = %s") -> list[Segment]:
        return [seg("SELECT test", 5 + i * each, 5 + (i + 1) * each, DB_QUERY, **{"db.statement": statement}) for i in range(count)]

    assert kinds_of(request(100, *lookups(5, 10))) == ["sequential-calls"]
    assert kinds_of(request(100, *lookups(2, 10))) == []  # two calls are not a pattern
    assert kinds_of(request(10_000, *lookups(5, 10))) == []  # 40 ms of a 10 s request is not why it was slow
    # a different statement in between (the next lookup may need its answer) splits the run
    calls = lookups(4, 10)
    other = seg("SELECT test", 25, 26, DB_QUERY, **{"db.statement": "SELECT * FROM b"})
    split = [calls[0], calls[1], other, *(c._replace(start_ns=c.start_ns + ms(1) - T0, end_ns=c.end_ns + ms(1) - T0) for c in calls[2:])]
    assert kinds_of(request(100, *split)) == []
    # one statement per row (the same name, different statements) is not one call repeated
    assert kinds_of(request(100, *(s._replace(attrs={"db.statement": f"SELECT {i}"}) for i, s in enumerate(lookups(5, 10))))) == []


def test_calls_that_overlap_are_a_fan_out_not_an_n_plus_one() -> None:
    fan_out = [seg("GET", 5 + i, 50 + i, TOOL, **{"server.address": "tools"}) for i in range(6)]
    assert kinds_of(request(100, *fan_out)) == []


def test_a_failure_from_below_is_not_masked_and_a_retried_failure_is_not_an_error() -> None:
    proxy = seg("POST", 0, 500, None, **{"http.status_code": "504", SPAN_STATUS_ERROR: True})
    app = seg("POST", 1, 499, None, proxy, **{SPAN_STATUS_ERROR: True, "error.type": "TimeoutError"})
    assert kinds_of(request(500, proxy, app)) == []  # the app failed too: its own failure, not a mask
    ok_app = app._replace(attrs={})
    assert kinds_of(request(500, proxy, ok_app)) == ["timeout-masked"]
    quick = seg("POST", 0, 50, None, **{"http.status_code": 504})
    assert kinds_of(request(60, quick, seg("POST", 1, 49, None, quick))) == []  # a fast failure masks nothing
    retried = [seg("GET", 0, 10, TOOL, **{"error.type": "timeout"}), seg("GET", 10, 20, TOOL),
               seg("PUT", 20, 30, TOOL, **{"error.type": "timeout"}), seg("PUT", 30, 40, TOOL)]  # fmt: skip
    assert kinds_of(request(40, *retried)) == []


def kinds_of(rt: RequestTimeline) -> list[str]:
    return [f.kind for f in explain_request(rt, {}).findings]
