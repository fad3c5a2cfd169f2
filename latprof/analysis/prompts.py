"""Prompt size against TTFT: the Theil–Sen line per model, what prompt length explains of the tail, conversations.

Measured: each streamed call's TTFT (`latprof.ttft_known`), its input tokens (the usage the
service asked for), its request, its start and, when recorded, its conversation's digest.
Inferred: the line through them (TTFT = intercept + slope x input tokens, Theil–Sen: the median
of the pairwise slopes, so provider-side queueing spikes do not tilt it), and from it the part
of a cohort's TTFT the prompt explains.

A conversation is the calls sharing a conversation digest (`latprof.conversation.digest`, from
`gen_ai.conversation.id` or the Responses API's `conversation`), across requests; a call
without one belongs to its request's conversation: the successive LLM calls of one request (an
agent loop). Its turns are its calls in the order they started.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from latprof.analysis.genai import FIT_MAX_CALLS, model_of, theil_sen_slope, token_count
from latprof.analysis.requests import NS_PER_MS, Analysis, percentile
from latprof.events import Segment
from latprof.layers import PROVIDER
from latprof.semconv import CONVERSATION_DIGEST, ESTIMATED, GEN_AI_INPUT_TOKENS, SPLIT_UNKNOWN, TTFT_KNOWN


@dataclass(frozen=True, slots=True)
class TtftCall:
    """One streamed LLM call whose TTFT was measured."""

    request_index: int
    start_ns: int
    ttft_ms: float
    input_tokens: float | None
    model: str
    conversation: str | None  # the conversation digest, when recorded


def ttft_calls(analysis: Analysis) -> tuple[dict[str, list[TtftCall]], dict[str, dict[str, int]]]:
    """Streamed calls by model, and per model how many provider segments were left out and why
    (`split_unknown`, `estimated`, `non_streamed`).

    Only a provider segment with `ttft_known` true measures TTFT; estimated boundaries and
    attach-mode LLM time (provider and model not split) never do.
    """
    by_model: dict[str, list[TtftCall]] = {}
    left_out: list[tuple[str, Segment]] = []
    for index, segment in analysis.segments(PROVIDER):
        if segment.end_ns <= segment.start_ns:
            continue
        attrs = segment.attrs
        if attrs.get(SPLIT_UNKNOWN):  # attach mode: TTFT and decode not told apart
            left_out.append(("split_unknown", segment))
        elif attrs.get(ESTIMATED):
            left_out.append(("estimated", segment))
        elif attrs.get(TTFT_KNOWN) is not True:
            left_out.append(("non_streamed", segment))
        else:
            model = model_of(segment)
            digest = attrs.get(CONVERSATION_DIGEST)
            by_model.setdefault(model, []).append(
                TtftCall(index, segment.start_ns, (segment.end_ns - segment.start_ns) / NS_PER_MS,
                         token_count(attrs.get(GEN_AI_INPUT_TOKENS)), model, digest if isinstance(digest, str) else None)
            )  # fmt: skip
    excluded: dict[str, dict[str, int]] = {}
    if by_model:  # (the counts matter only beside measured calls: without any the rules stop)
        for reason, segment in left_out:
            counts = excluded.setdefault(model_of(segment), {})
            counts[reason] = counts.get(reason, 0) + 1
    return by_model, excluded


def tail_provider_ms_by_model(analysis: Analysis) -> dict[str, float]:
    """Provider time per model in the tail cohort (every provider segment): splits the layer's excess."""
    out: dict[str, float] = {}
    for rt in analysis.cohort("tail"):
        for segment in rt.segments:
            if segment.layer == PROVIDER and segment.end_ns > segment.start_ns:
                key = model_of(segment)
                out[key] = out.get(key, 0.0) + (segment.end_ns - segment.start_ns) / NS_PER_MS
    return out


# --- the line ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptLine:
    """TTFT against input tokens: TTFT_ms = intercept_ms + ms_per_1k_input_tokens x tokens / 1000."""

    ms_per_1k_input_tokens: float  # the Theil–Sen slope, clamped at 0
    intercept_ms: float  # the median of TTFT - slope x tokens: a typical TTFT at 0 tokens, not a floor
    #: 1 - SS(residuals) / SS(TTFT - mean) over every fitted call: the share of TTFT's variance
    #: the line explains, queueing spikes included (they lower it).
    r_squared: float | None
    #: 1 - (MAD of residuals / MAD of TTFT)^2: how well the line fits the bulk of the calls,
    #: whatever a few spikes do.
    robust_r_squared: float | None
    calls: int  # calls with a token count that entered the fit


def fit_prompt_line(
    ttfts_ms: Sequence[float], input_tokens: Sequence[float | None], *, min_input_token_spread: float = 500
) -> PromptLine | None:
    """The Theil–Sen line of TTFT (ms) against input tokens over the calls with a token count.

    None unless at least 3 calls have a count, with at least 3 distinct counts spread by
    `min_input_token_spread` (p95 - p5): tokens that barely vary cannot tell prompt from
    provider time. The slope is the median of the slopes between every two calls (over at most
    `FIT_MAX_CALLS` evenly picked calls: the pairs grow as n²); a negative slope (more input
    never makes TTFT shorter) is clamped to 0. No trimming: up to ~29% of calls can be
    arbitrary spikes before the median moves.
    """
    pairs = [(float(n) / 1000, t) for t, n in zip(ttfts_ms, input_tokens) if n is not None]
    if len(pairs) < 3 or len({x for x, _ in pairs}) < 3:
        return None
    ordered = sorted(x for x, _ in pairs)
    if (percentile(ordered, 95) - percentile(ordered, 5)) * 1000 < min_input_token_spread:
        return None
    n = len(pairs)
    sample = pairs if n <= FIT_MAX_CALLS else [pairs[i * n // FIT_MAX_CALLS] for i in range(FIT_MAX_CALLS)]
    slope = theil_sen_slope(sample)
    if slope is None or not math.isfinite(slope):
        return None
    slope = max(0.0, slope)
    residuals = [t - slope * x for x, t in pairs]
    intercept = statistics.median(residuals)
    residuals = [r - intercept for r in residuals]
    ys = [t for _, t in pairs]
    mean_y = sum(ys) / n
    ss_total = sum((y - mean_y) ** 2 for y in ys)
    r_squared = None if ss_total == 0 else max(0.0, 1.0 - sum(r * r for r in residuals) / ss_total)
    median_y = statistics.median(ys)
    mad_y = statistics.median(abs(y - median_y) for y in ys)
    mad_r = statistics.median(abs(r) for r in residuals)
    robust = None if mad_y == 0 else max(0.0, 1.0 - (mad_r / mad_y) ** 2)
    return PromptLine(slope, intercept, r_squared, robust, n)


def prompt_lines(calls: Mapping[str, Sequence[TtftCall]], *, min_calls: int, min_input_token_spread: float) -> dict[str, PromptLine]:
    """`fit_prompt_line` of each model with at least `min_calls` calls, where one fits."""
    out: dict[str, PromptLine] = {}
    for model, model_calls in calls.items():
        if len(model_calls) >= min_calls:
            line = fit_prompt_line([c.ttft_ms for c in model_calls], [c.input_tokens for c in model_calls],
                                   min_input_token_spread=min_input_token_spread)  # fmt: skip
            if line is not None:
                out[model] = line
    return out


# --- what the prompt explains of the tail --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptPart:
    """The tail cohort's TTFT against the median cohort's, and the part the prompt explains.

    Per call (`per_request=False`) or per request, summing its calls' TTFT and input tokens
    (`per_request=True`: a request with more or longer LLM calls waits longer in all).
    """

    tail_units: int  # tail calls, or tail requests with a call
    tail_ttft_ms: float  # mean TTFT of a tail call (or summed over a tail request)
    median_ttft_ms: float  # the same over the median cohort (0 without one)
    tail_input_tokens: float  # mean input tokens of a tail call (or summed over a tail request)
    median_input_tokens: float
    tail_prompt_ms: float  # slope x the tail's input tokens: the prompt's part of the tail's TTFT
    excess_ms: float  # tail_ttft_ms - median_ttft_ms
    excess_from_prompt_ms: float  # slope x (tail - median input tokens): the part of the excess longer prompts explain

    @property
    def prompt_share_of_ttft(self) -> float:
        return self.tail_prompt_ms / self.tail_ttft_ms if self.tail_ttft_ms > 0 else 0.0

    @property
    def excess_share_from_prompt(self) -> float:
        """The share of the tail's extra TTFT that longer prompts explain, within [0, 1]."""
        if self.excess_ms <= 0:
            return 0.0
        return max(0.0, min(1.0, self.excess_from_prompt_ms / self.excess_ms))


def prompt_part(
    analysis: Analysis, calls: Iterable[TtftCall], lines: Mapping[str, PromptLine], *, per_request: bool
) -> PromptPart | None:
    """The tail's TTFT and the part of it (and of its excess over the median cohort) that
    input tokens explain through each call's model line (`lines`; a call whose model has no
    line, or with no token count, has a prompt part of 0). None without tail calls."""
    tail, median = set(analysis.groups.tail), set(analysis.groups.median)
    units: dict[str, dict[object, list[float]]] = {"tail": {}, "median": {}}
    for i, call in enumerate(calls):
        cohort = "tail" if call.request_index in tail else "median" if call.request_index in median else None
        if cohort is None:
            continue
        line = lines.get(call.model)
        tokens = call.input_tokens or 0.0
        prompt_ms = line.ms_per_1k_input_tokens * tokens / 1000 if line is not None and call.input_tokens is not None else 0.0
        key: object = call.request_index if per_request else i
        unit = units[cohort].setdefault(key, [0.0, 0.0, 0.0])
        unit[0] += call.ttft_ms
        unit[1] += tokens
        unit[2] += prompt_ms
    if not units["tail"]:
        return None

    def means(cohort: str) -> tuple[float, float, float]:
        values = list(units[cohort].values())
        n = len(values) or 1
        return sum(v[0] for v in values) / n, sum(v[1] for v in values) / n, sum(v[2] for v in values) / n

    tail_ttft, tail_tokens, tail_prompt = means("tail")
    median_ttft, median_tokens, median_prompt = means("median")
    return PromptPart(len(units["tail"]), tail_ttft, median_ttft, tail_tokens, median_tokens, tail_prompt,
                      tail_ttft - median_ttft, tail_prompt - median_prompt)  # fmt: skip


# --- conversations -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation's calls in the order they started (its turns)."""

    key: str  # "c:" + the digest, or "r:" + the request index
    by_digest: bool  # grouped by a recorded conversation id (else: one request's successive calls)
    calls: tuple[TtftCall, ...]

    @property
    def turns(self) -> int:
        return len(self.calls)

    def growth(self) -> float | None:
        """The Theil–Sen slope of input tokens against the turn number (tokens a turn adds), or
        None when fewer than 2 turns have a token count."""
        points = [(float(turn), c.input_tokens) for turn, c in enumerate(self.calls) if c.input_tokens is not None]
        return theil_sen_slope(points) if len(points) >= 2 else None


def conversations(calls: Iterable[TtftCall]) -> list[Conversation]:
    """The calls grouped into conversations (by digest, else by request), each in start order."""
    groups: dict[str, list[TtftCall]] = {}
    for call in calls:
        key = f"c:{call.conversation}" if call.conversation else f"r:{call.request_index}"
        groups.setdefault(key, []).append(call)
    return [
        Conversation(key, key.startswith("c:"), tuple(sorted(group, key=lambda c: c.start_ns)))
        for key, group in sorted(groups.items())
    ]
