"""Rule context-growth: input tokens and TTFT grow turn over turn, and the long conversations are the tail."""

from __future__ import annotations

import random
from typing import Any

import pytest
from timelines import analysed, req, seg

from latprof.analysis.timeline import RequestTimeline
from latprof.engine import run_rules
from latprof.layers import APP, MODEL, PROVIDER
from latprof.report.verdict import decide_verdict
from latprof.rules.context_growth import ContextGrowth, Thresholds
from latprof.rules.provider_floor import ProviderFloor
from latprof.semconv import (
    CONVERSATION_DIGEST,
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_REQUEST_MODEL,
    LLM_CALL_ID,
    TTFT_KNOWN,
)

MINI = "gpt-4o-mini"
INTERCEPT_MS = 150.0
MS_PER_1K = 40.0


def ttft_of(tokens: int, rng: random.Random) -> float:
    return INTERCEPT_MS + MS_PER_1K * tokens / 1000 + rng.uniform(-5.0, 5.0)


def llm_request(
    i: int, turns: list[tuple[int, float]], *, conversation: str | None = None, decode_ms: float = 40.0, **attrs: Any
) -> RequestTimeline:
    """App work, then one streamed LLM call per (input tokens, TTFT ms) turn, one after the other."""
    t0 = i * 100.0
    cursor = t0 + 10.0
    segments = [seg(APP, t0, cursor)]
    for k, (tokens, ttft) in enumerate(turns):
        call = {LLM_CALL_ID: f"call-{i}-{k}", GEN_AI_REQUEST_MODEL: MINI, GEN_AI_INPUT_TOKENS: tokens, **attrs}
        if conversation is not None:
            call[CONVERSATION_DIGEST] = conversation
        first = cursor + ttft
        segments.append(seg(PROVIDER, cursor, first, name=f"chat {MINI}", **call, **{TTFT_KNOWN: True}))
        segments.append(seg(MODEL, first, first + decode_ms, name=f"chat {MINI}", **call, **{GEN_AI_OUTPUT_TOKENS: 20}))
        cursor = first + decode_ms
    return req(t0, cursor, *segments, route="POST /agent")


def agent_loops(
    n: int = 300, *, long_every: int = 50, long_turns: int = 12, short_turns: int = 2, per_turn: int = 1500,
    base: int = 300, seed: int = 3, spike_every: int = 0, spike_ms: float = 4000.0,
) -> list[RequestTimeline]:
    """Agent requests whose turn k sends base + per_turn x k input tokens; every `long_every`-th runs `long_turns` turns."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        turns = long_turns if long_every and i % long_every == long_every - 1 else short_turns
        plan = []
        for k in range(turns):
            tokens = base + per_turn * k + rng.randint(0, 200)
            ttft = ttft_of(tokens, rng)
            if spike_every and i % spike_every == spike_every - 1 and k == turns - 1:
                ttft += spike_ms
            plan.append((tokens, ttft))
        out.append(llm_request(i, plan))
    return out


def findings(requests: list[RequestTimeline], rule: ContextGrowth | None = None) -> list[Any]:
    return list((rule or ContextGrowth()).check(analysed(requests)))


# --- firing ---------------------------------------------------------------------------------------


def test_fires_on_agent_loops_whose_history_grows_each_turn() -> None:
    requests = agent_loops()
    a = analysed(requests)
    [f] = ContextGrowth().check(a)
    e = f.evidence
    assert f.rule == "context-growth" and f.layer == PROVIDER and f.severity == "critical"
    assert e["grouped_by"] == "request" and e["conversations_by_id"] == 0
    assert e["conversations"] == 300 and e["growing_conversations"] == 6  # the 2-turn loops are too short to count
    assert e["tail_requests_in_growing_conversations"] == 3 and e["tail_share_in_growing_conversations"] == 1.0
    assert e["turns"] == 12
    assert 300 <= e["input_tokens_first_turn"] <= 500 and 16_800 <= e["input_tokens_last_turn"] <= 17_000
    assert e["input_tokens_added_per_turn"] == pytest.approx(1500, abs=60)
    assert e["ttft_first_turn_ms"] == pytest.approx(INTERCEPT_MS + 16, abs=15)
    assert e["ttft_last_turn_ms"] == pytest.approx(INTERCEPT_MS + 40 * 16.9, abs=15)
    assert e["ms_per_1k_input_tokens"] == pytest.approx(MS_PER_1K, rel=0.05)
    assert e["llm_calls_per_tail_request"] == 12 and e["llm_calls_per_median_request"] == 2
    # The tail requests' summed TTFT over the median ones': most of it is the input tokens ...
    assert e["tail_excess_share_from_input_tokens"] > 0.65
    # ... and the rest the extra turns, each paying the intercept.
    assert e["tail_excess_from_more_turns_ms"] == pytest.approx(10 * INTERCEPT_MS, rel=0.1)
    assert e["tail_excess_from_input_tokens_ms"] + e["tail_excess_from_more_turns_ms"] == pytest.approx(
        e["tail_ttft_excess_ms"], rel=0.05
    )
    assert f.impact_ms == pytest.approx(a.layer(PROVIDER).tail_excess_ms)
    long_ids = {requests[i].request.request_id for i in range(49, 300, 50)}
    assert set(e["example_request_ids"]) <= long_ids and len(e["example_request_ids"]) == 3
    assert f.summary.startswith("The context grows turn over turn: along successive LLM calls of one request")
    assert "ms per 1k input tokens" in f.summary and "100% of the slowest 1%" in f.summary
    assert "summarise older turns" in f.fix and "Cap the agent loop's turns (the tail's run 12)" in f.fix
    assert "prompt caching" in f.fix


def test_the_verdict_names_context_growth_over_provider_floor() -> None:
    a = analysed(agent_loops())
    found = run_rules(a, [ProviderFloor(), ContextGrowth()])
    assert {f.rule for f in found} == {"provider-floor", "context-growth"}
    verdict = decide_verdict(a, found)
    assert verdict.layer == PROVIDER and verdict.rule == "context-growth"


def test_fires_on_conversations_across_requests_by_their_id() -> None:
    """One LLM call per request; 100 conversations of 2 turns and 4 of 15, each turn resending the history."""
    rng = random.Random(5)
    plan: list[tuple[str, int]] = [(f"c{k}", turns) for k, turns in enumerate([2] * 100 + [15] * 4)]
    turns_of: list[tuple[str, int]] = [(conv, k) for conv, turns in plan for k in range(turns)]
    rng.shuffle(turns_of)
    seen: dict[str, int] = {}
    requests = []
    for i, (conv, _) in enumerate(turns_of):
        k = seen[conv] = seen.get(conv, -1) + 1  # turns in arrival order
        tokens = 400 + 1200 * k
        requests.append(llm_request(i, [(tokens, ttft_of(tokens, rng))], conversation=f"digest-{conv}"))
    [f] = findings(requests)
    e = f.evidence
    assert e["grouped_by"] == "conversation_id"
    assert e["conversations"] == 104 and e["conversations_by_id"] == 104 and e["growing_conversations"] == 4
    assert e["turns"] == 15 and e["input_tokens_first_turn"] == 400 and e["input_tokens_last_turn"] == 400 + 1200 * 14
    assert e["tail_share_in_growing_conversations"] == 1.0
    assert e["tail_excess_share_from_input_tokens"] > 0.9
    assert "along calls sharing a conversation id" in f.summary
    assert "Cap the agent loop" not in f.fix


def test_rule_runs_inside_the_engine() -> None:
    [f] = run_rules(analysed(agent_loops()), [ContextGrowth()])
    assert not f.crashed and f.rule == "context-growth"


# --- not firing ------------------------------------------------------------------------------------


def test_does_not_fire_when_long_loops_send_constant_prompts() -> None:
    """The tail's requests run 12 turns of a constant 8k-token prompt: long prompts and many
    turns, but the context does not grow."""
    rng = random.Random(7)
    requests = []
    for i in range(300):
        tokens, turns = (8000, 12) if i % 50 == 49 else (500 + rng.randint(0, 2000), 2)
        requests.append(llm_request(i, [(tokens, ttft_of(tokens, rng)) for _ in range(turns)]))
    a = analysed(requests)
    assert a.layer(PROVIDER).share_of_tail_excess > 0.9  # the provider owns the tail ...
    assert list(ContextGrowth().check(a)) == []  # ... but no conversation grows


def test_does_not_fire_when_conversations_do_not_grow_even_with_long_prompts_in_the_tail() -> None:
    """The tail's requests send 30k-token prompts twice: the prompt explains their TTFT
    (provider-floor says so), but turn two sends no more than turn one."""
    rng = random.Random(8)
    requests = []
    for i in range(300):
        tokens = 30_000 if i % 50 == 49 else 300 + rng.randint(0, 3000)
        requests.append(llm_request(i, [(tokens, ttft_of(tokens, rng)), (tokens, ttft_of(tokens, rng))]))
    a = analysed(requests)
    assert list(ContextGrowth().check(a)) == []
    [floor] = ProviderFloor().check(a)
    assert "longer prompts explain" in floor.summary


def test_does_not_fire_when_provider_spikes_own_the_tail() -> None:
    """Every request is a 3-turn growing loop; 2% get a 4 s queueing spike on their last turn:
    the tail is in growing conversations, but its input tokens are the median's."""
    requests = agent_loops(long_every=0, short_turns=3, spike_every=50)
    a = analysed(requests)
    assert a.layer(PROVIDER).share_of_tail_excess > 0.9
    assert findings(requests) == []


def test_does_not_fire_without_a_tail() -> None:
    requests = agent_loops(long_every=0, short_turns=4)
    assert not analysed(requests).has_tail
    assert findings(requests) == []


def test_does_not_fire_without_enough_streamed_calls_or_token_counts() -> None:
    assert findings(agent_loops(), ContextGrowth(Thresholds(min_calls=10_000))) == []
    no_tokens = [
        RequestTimeline(rt.request, tuple(s._replace(attrs={k: v for k, v in s.attrs.items() if k != GEN_AI_INPUT_TOKENS})
                                          for s in rt.segments))
        for rt in agent_loops()
    ]  # fmt: skip
    assert findings(no_tokens) == []


def test_does_not_fire_when_thresholds_are_raised() -> None:
    requests = agent_loops()
    assert findings(requests)
    assert findings(requests, ContextGrowth(Thresholds(min_turns=13))) == []
    assert findings(requests, ContextGrowth(Thresholds(min_share_explained=0.99))) == []
    assert findings(requests, ContextGrowth(Thresholds(min_growth_ratio=100.0))) == []
    assert findings(requests, ContextGrowth(Thresholds(min_tail_excess_ms=100_000.0))) == []
