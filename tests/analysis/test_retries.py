"""Which sleeps were backoff: a sleep after a failed call and before another call to the same target is `retry`."""

from __future__ import annotations

from timelines import analysed, req, seg

from latprof.layers import PROVIDER, RETRY, TOOL, UNATTRIBUTED
from latprof.analysis.retries import classify_sleeps
from latprof.semconv import (
    ERROR_TYPE,
    HTTP_STATUS_CODE,
    RETRY_AFTER_ERROR,
    RETRY_AFTER_STATUS,
    SERVER_ADDRESS,
    SLEEP_SEGMENT,
)


def sleep(start: float, end: float):
    return seg(None, start, end, name=SLEEP_SEGMENT)


def call(layer: str, start: float, end: float, target: str = "api.local", **attrs):
    return seg(layer, start, end, name=f"call {target}", **{SERVER_ADDRESS: target, **attrs})


def layer_of_sleep(rt) -> str | None:
    (s,) = [s for s in classify_sleeps(rt).segments if s.name == SLEEP_SEGMENT]
    return s.layer


def test_a_sleep_between_a_429_and_the_next_attempt_is_retry_with_the_status():
    rt = req(0, 700, call(TOOL, 0, 100, **{HTTP_STATUS_CODE: 429}), sleep(100, 600), call(TOOL, 600, 700, **{HTTP_STATUS_CODE: 200}))
    (s,) = [s for s in classify_sleeps(rt).segments if s.name == SLEEP_SEGMENT]
    assert s.layer == RETRY and s.attrs[RETRY_AFTER_STATUS] == 429
    assert analysed([rt]).breakdowns[0] == {TOOL: 200.0, RETRY: 500.0}


def test_errors_and_5xx_of_llm_calls_count_too():
    timeout = req(0, 700, call(PROVIDER, 0, 100, **{ERROR_TYPE: "APITimeoutError"}), sleep(100.2, 600), call(PROVIDER, 600, 700))
    (s,) = [s for s in classify_sleeps(timeout).segments if s.name == SLEEP_SEGMENT]
    assert s.layer == RETRY and s.attrs[RETRY_AFTER_ERROR] == "APITimeoutError"
    assert layer_of_sleep(req(0, 700, call(PROVIDER, 0, 100, **{HTTP_STATUS_CODE: 503}), sleep(100, 600), call(PROVIDER, 600, 700))) == RETRY


def test_other_sleeps_stay_without_a_layer():
    ok = {HTTP_STATUS_CODE: 200}
    fail = {HTTP_STATUS_CODE: 429}
    cases = {
        "after a success": req(0, 700, call(TOOL, 0, 100, **ok), sleep(100, 600), call(TOOL, 600, 700)),
        "after a 404": req(0, 700, call(TOOL, 0, 100, **{HTTP_STATUS_CODE: 404}), sleep(100, 600), call(TOOL, 600, 700)),
        "then another target": req(0, 700, call(TOOL, 0, 100, **fail), sleep(100, 600), call(TOOL, 600, 700, target="other.local")),
        "no call after": req(0, 600, call(TOOL, 0, 100, **fail), sleep(100, 600)),
        "no call before": req(0, 700, sleep(0, 600), call(TOOL, 600, 700)),
        "a later failure": req(0, 900, call(TOOL, 0, 100, **ok), sleep(100, 600), call(TOOL, 700, 800, **fail), call(TOOL, 800, 900)),
    }
    for what, rt in cases.items():
        assert layer_of_sleep(rt) is None, what
    # A sleep that is no backoff owns no time: without CPU to back it, it is unattributed.
    assert analysed([cases["after a success"]]).breakdowns[0] == {TOOL: 200.0, UNATTRIBUTED: 500.0}
