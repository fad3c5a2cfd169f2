"""Prompt size against TTFT (the Theil-Sen line, the prompt's part of the tail), conversations, and conversation digests."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pytest
from timelines import analysed, req, seg

from latprof import digests
from latprof.analysis.prompts import PromptLine, TtftCall, conversations, fit_prompt_line, prompt_part, ttft_calls
from latprof.semconv import CONVERSATION_DIGEST, GEN_AI_INPUT_TOKENS, GEN_AI_REQUEST_MODEL, TTFT_KNOWN


def call(request: int, start: int, tokens: float | None, conversation: str | None = None, ttft: float = 100.0) -> TtftCall:
    return TtftCall(request, start, ttft, tokens, "m", conversation)


# --- the line ------------------------------------------------------------------------------------


def test_line_of_an_exact_line_and_its_fit_figures() -> None:
    tokens = [100 * k for k in range(1, 51)]
    line = fit_prompt_line([300 + 50 * n / 1000 for n in tokens], tokens)
    assert line is not None and line.calls == 50
    assert line.ms_per_1k_input_tokens == pytest.approx(50.0) and line.intercept_ms == pytest.approx(300.0)
    assert line.r_squared == pytest.approx(1.0) and line.robust_r_squared == pytest.approx(1.0)


def test_no_line_without_enough_distinct_or_spread_token_counts() -> None:
    assert fit_prompt_line([100.0, 200.0], [1000, 2000]) is None  # 2 calls
    assert fit_prompt_line([100.0] * 10, [1000, 2000] * 5) is None  # 2 distinct counts
    assert fit_prompt_line([100.0 + k for k in range(10)], [1000 + k for k in range(10)]) is None  # spread 9 < 500
    assert fit_prompt_line([100.0] * 10, [None] * 10) is None


def test_a_falling_line_is_clamped_to_no_prompt_cost() -> None:
    tokens = [1000 * k for k in range(1, 21)]
    line = fit_prompt_line([2000 - 10 * n / 1000 for n in tokens], tokens)
    assert line is not None and line.ms_per_1k_input_tokens == 0.0


def test_many_calls_are_subsampled_evenly_and_keep_the_slope() -> None:
    rng = random.Random(2)
    tokens = [rng.randint(100, 9000) for _ in range(3000)]
    ttfts = [200 + 30 * n / 1000 + rng.gauss(0, 20) + (5000 if rng.random() < 0.1 else 0) for n in tokens]
    line = fit_prompt_line(ttfts, tokens)
    assert line is not None and line.calls == 3000
    assert line.ms_per_1k_input_tokens == pytest.approx(30.0, rel=0.1)


# --- the prompt's part of the tail ----------------------------------------------------------------


def llm(i: int, ttft_ms: float, tokens: int, **attrs: Any) -> Any:
    t0 = i * 10.0
    return req(t0, t0 + ttft_ms, seg("provider", t0, t0 + ttft_ms, **{GEN_AI_REQUEST_MODEL: "m", TTFT_KNOWN: True,
                                                                       GEN_AI_INPUT_TOKENS: tokens, **attrs}))  # fmt: skip


def test_prompt_part_of_the_tail_per_call() -> None:
    """100 ms + 50 ms per 1k tokens; 3 of 300 calls send 20k tokens: 1,000 ms of their 1,100 is
    the prompt, and their excess over the median calls (1,000 - 50 x 1k/1000 ms) is the prompt's."""
    requests = [llm(i, 100 + 50 * n / 1000, n) for i, n in enumerate(20_000 if i % 100 == 99 else 1000 for i in range(300))]
    a = analysed(requests)
    by_model, excluded = ttft_calls(a)
    assert excluded == {} and len(by_model["m"]) == 300
    assert fit_prompt_line([c.ttft_ms for c in by_model["m"]], [c.input_tokens for c in by_model["m"]]) is None  # 2 counts
    part = prompt_part(a, by_model["m"], {"m": PromptLine(50.0, 100.0, 1.0, 1.0, 300)}, per_request=False)
    assert part is not None and part.tail_units == 3
    assert part.tail_prompt_ms == pytest.approx(1000.0) and part.prompt_share_of_ttft == pytest.approx(1000 / 1100)
    assert part.excess_ms == pytest.approx(950.0) and part.excess_from_prompt_ms == pytest.approx(950.0)
    assert part.excess_share_from_prompt == pytest.approx(1.0)


def test_prompt_part_per_request_sums_a_requests_calls() -> None:
    a = analysed([llm(i, 100.0, 1000) for i in range(100)])
    calls = [call(i, i, 1000.0) for i in a.groups.tail] * 2 + [call(i, i, 1000.0) for i in a.groups.median]
    line = fit_prompt_line([100.0, 150.0, 200.0], [0, 1000, 2000])
    assert line is not None
    part = prompt_part(a, calls, {"m": line}, per_request=True)
    assert part is not None
    assert part.tail_ttft_ms == 200.0 and part.median_ttft_ms == 100.0  # two calls a tail request, one a median one
    assert part.tail_input_tokens == 2000.0 and part.excess_from_prompt_ms == pytest.approx(50.0)
    assert part.excess_share_from_prompt == pytest.approx(0.5)


# --- conversations ---------------------------------------------------------------------------------


def test_calls_group_by_digest_across_requests_else_by_request_in_start_order() -> None:
    calls = [call(1, 30, 900, "d1"), call(2, 10, 300, "d1"), call(3, 20, 600, "d1"),
             call(4, 50, 100), call(4, 40, 50), call(5, 60, 80)]  # fmt: skip
    by_key = {c.key: c for c in conversations(calls)}
    assert set(by_key) == {"c:d1", "r:4", "r:5"}
    assert by_key["c:d1"].by_digest and [c.request_index for c in by_key["c:d1"].calls] == [2, 3, 1]
    assert by_key["c:d1"].turns == 3 and by_key["c:d1"].growth() == pytest.approx(300.0)
    assert not by_key["r:4"].by_digest and [c.input_tokens for c in by_key["r:4"].calls] == [50, 100]
    assert by_key["r:5"].growth() is None  # one turn


# --- digests ---------------------------------------------------------------------------------------


def test_digest_is_keyed_short_and_the_same_for_each_form_of_an_id(monkeypatch: pytest.MonkeyPatch) -> None:
    key = bytes(range(16))
    monkeypatch.setattr(digests, "_KEY", key)
    expected = hashlib.blake2b(b"conv_123", digest_size=8, key=key).hexdigest()
    assert digests.conversation_digest("conv_123") == expected and len(expected) == 16
    assert digests.conversation_digest({"id": "conv_123"}) == expected

    class Conversation:
        id = "conv_123"

    assert digests.conversation_digest(Conversation()) == expected
    assert digests.conversation_digest(123) == digests.conversation_digest("123")
    assert hashlib.blake2b(b"conv_123", digest_size=8).hexdigest() != expected  # not a plain hash: the key matters
    for nothing in (None, "", True, 1.5, {"id": None}, [], object()):
        assert digests.conversation_digest(nothing) is None


def test_a_session_key_comes_from_the_environment_else_at_random(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(digests.ENV_DIGEST_KEY, "00" * 16)
    assert digests._key() == bytes(16)
    for bad in ("", "zz", "00" * 8):  # not hex, too short: a random key, never a weak one
        monkeypatch.setenv(digests.ENV_DIGEST_KEY, bad)
        assert len(digests._key()) == 16 and digests._key() != digests._key()
    assert len(bytes.fromhex(digests.new_key())) == 16


def test_ttft_calls_read_the_conversation_digest() -> None:
    a = analysed([llm(0, 100.0, 1000, **{CONVERSATION_DIGEST: "abc"}), llm(1, 100.0, 1000)])
    by_model, _ = ttft_calls(a)
    assert [c.conversation for c in by_model["m"]] == ["abc", None]
