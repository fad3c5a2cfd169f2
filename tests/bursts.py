"""Hand-built LLM load for the decode-under-load tests: rounds of concurrent streamed calls, some of them bursts."""

from __future__ import annotations

from typing import Any, Callable

from timelines import req, seg

from latprof.analysis.timeline import RequestTimeline
from latprof.layers import APP, MODEL, PROVIDER
from latprof.semconv import GEN_AI_OUTPUT_TOKENS, GEN_AI_REQUEST_MODEL, LLM_CALL_ID, SERVER_ADDRESS, TTFT_KNOWN

MODEL_NAME = "gpt-4o-mini"
TTFT_MS = 50.0
#: Calls in flight at once in a burst round.
BURST = 30

#: (index of the call in the capture, of its round, calls in flight beside it) -> (output tokens, ms per token).
Decode = Callable[[int, int, int], tuple[int, float]]


def crowded(others: int, base_ms: float = 10.0, per_call_ms: float = 2.0) -> float:
    """Time per token of a batch with `others` other streams in it."""
    return base_ms + per_call_ms * others


def tokens_of(i: int) -> int:
    return 35 + i % 11  # 35..45


def load_bound(i: int, r: int, others: int) -> tuple[int, float]:
    """A provider whose tokens slow by 2 ms per other stream decoding: a crowded batch (the
    calls of a round answer alike, so they decode together)."""
    return tokens_of(r), crowded(others)


def steady(i: int, r: int, others: int) -> tuple[int, float]:
    """A provider whose time per token does not depend on the load."""
    return tokens_of(r), 10.0


def rounds(decode: Decode, n_rounds: int = 160, burst_every: int = 40, **attrs: Any) -> list[RequestTimeline]:
    """Rounds of calls that start together: 1 to 4 calls (cycling), every `burst_every`-th round
    `BURST` of them. Each request is 5 ms of app, a `TTFT_MS` first token, then its call's decode
    (`decode(i, r, others)` where `others` is the calls beside it in its round); the next round
    starts 20 ms after the last call of this one ends, so a call's calls in flight are exactly
    the others of its round while they all decode alike."""
    out: list[RequestTimeline] = []
    t = 0.0
    i = 0
    for r in range(n_rounds):
        size = BURST if r % burst_every == burst_every - 1 else 1 + r % 4
        end = t
        for _ in range(size):
            tokens, tpot = decode(i, r, size - 1)
            call = {LLM_CALL_ID: f"call-{i}", GEN_AI_REQUEST_MODEL: MODEL_NAME, **attrs}
            first = t + 5 + TTFT_MS
            done = first + tokens * tpot
            out.append(req(t, done, seg(APP, t, t + 5), seg(PROVIDER, t + 5, first, **call, **{TTFT_KNOWN: True}),
                           seg(MODEL, first, done, **call, **{GEN_AI_OUTPUT_TOKENS: tokens})))  # fmt: skip
            end = max(end, done)
            i += 1
        t = end + 20
    return out


ENDPOINT = {SERVER_ADDRESS: "api.example.com"}
