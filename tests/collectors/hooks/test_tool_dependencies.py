"""collectors/hooks/_tools.py: a later call that sends a value an earlier call answered depends on it."""

from __future__ import annotations

from latprof.collectors.hooks import _tools
from latprof.collectors.hooks.runtime import RequestState


def state() -> RequestState:
    return RequestState("r1", "GET /x", 0, 1)


def test_id_like_values_have_a_digit_and_a_length_of_4_to_64():
    found = _tools.tokens(b'{"id": "cust_48213", "name": "Ada", "n": 12, "at": "2026-11-30", "ok": true, "uuid": "9f2c1e"}')
    assert found == {b"cust_48213", b"2026-11-30", b"9f2c1e"}


def test_a_call_sending_an_earlier_answer_depends_on_the_latest_call_that_gave_it():
    s = state()
    _tools.answered(s, "a", b'{"id": "cust_48213"}')
    _tools.answered(s, "b", b'{"tickets": ["tk_1001", "tk_1002"], "customer": "cust_48213"}')
    assert _tools.depends_on(s, "/tickets?of=cust_48213") == "b"  # the latest call that answered it
    assert _tools.depends_on(s, b"/plans/tk_1002") == "b"
    assert _tools.depends_on(s, "/search", body=b'{"customer": "cust_48213"}') == "b"
    assert _tools.depends_on(s, "/weather?city=paris") is None
    assert _tools.depends_on(state(), "/tickets?of=cust_48213") is None  # another request knows nothing


def test_memory_stays_bounded():
    s = state()
    for i in range(100):
        _tools.answered(s, f"c{i}", b" ".join(f"id_{i}_{k:04d}".encode() for k in range(1000)))
    calls = s.scratch["tools"]
    assert len(calls) == _tools.MAX_CALLS and all(len(values) <= _tools.MAX_TOKENS for _, values in calls)
    assert calls[-1][0] == "c99"
