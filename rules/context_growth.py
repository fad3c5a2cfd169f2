"""Rule context-growth: input tokens and TTFT grow turn over turn, and the long conversations are the tail."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from latprof.analysis.prompts import Conversation, PromptLine, TtftCall, conversations, prompt_lines, prompt_part, ttft_calls
from latprof.analysis.requests import Analysis
from latprof.engine import Finding, Rule, fmt_ms, owns_tail, severity_for_share
from latprof.layers import PROVIDER


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0
    #: Streamed calls (TTFT measured) a model needs before its TTFT is fitted against input tokens ...
    min_calls: int = 20
    #: ... whose input tokens vary at least this much (p95 - p5).
    min_input_token_spread: int = 500
    #: A conversation grows when it has at least this many turns ...
    min_turns: int = 3
    #: ... and its last turn's input tokens are at least this many times its first's.
    min_growth_ratio: float = 1.5
    #: At least this share of the tail's requests must be late turns of growing conversations ...
    min_tail_share_in_growing: float = 0.5
    #: ... and input tokens (through the fitted slope) must explain at least this share of the
    #: tail requests' extra TTFT over the median requests'.
    min_share_explained: float = 0.5


class ContextGrowth(Rule):
    """Context grows turn over turn: each call resends a longer history, and the long conversations own the tail.

    What it detects:
        Along a conversation - the successive LLM calls of one request (an agent loop), or
        the calls sharing a conversation id across requests (`gen_ai.conversation.id` from
        traces, the Responses API's `conversation` from the openai hook, stored as a keyed
        digest) - the input tokens of each call grow turn over turn, and with them time to
        first token. Measured: each streamed call's TTFT, input tokens, request and order.
        Inferred: TTFT's cost per 1k input tokens (the Theil-Sen line of TTFT against input
        tokens per model, as provider-floor fits it) and from it the share of the tail's
        extra TTFT that input tokens explain. Reported when the provider owns the tail, most
        tail requests are late turns of growing conversations, and their input tokens explain
        most of the tail's extra TTFT.

    Why it matters for p99:
        Every turn resends the whole history: a conversation's tenth call carries ten turns
        of messages, tool results and answers, and prefill time grows with them. Most
        conversations are short, so the median request is fast; the few long ones pay for
        every turn and become the p99. Neither the provider nor the network is slow: the
        service sends more each time, and only the service can send less.

    Evidence:
        conversations seen (by conversation id and by request), how many grow, the tail
        requests in growing conversations and their share; for the tail's conversations the
        turns, input tokens and TTFT of the first and the last turn, and the tokens a turn
        adds (median Theil-Sen slope of input tokens against turn); ms_per_1k_input_tokens of
        the fit; the tail requests' TTFT (summed over their calls) against the median
        requests', the part of that excess the input tokens explain (ms and share) and the
        part from more turns at the intercept; the provider's tail excess and its share;
        example request ids.

    How to fix:
        Send less history: summarise older turns into a short running summary, keep a
        window of the last turns, drop tool results once they were used, cap the turns of an
        agent loop. Retrieve fewer chunks per turn. Keep the stable part of the prompt
        (system prompt, tools) first and unchanged so the provider's prompt caching applies
        to it; with the Responses API, `previous_response_id` or a conversation lets the
        provider keep the history instead of receiving it again.

    Example:
        An agent endpoint loops until its task is done: most requests take 2 LLM calls, 2%
        take 12. Each turn appends the previous answer and a 3k-character tool result, so the
        12th call sends 9,000 input tokens against 300 for the first, at 40 ms per 1k input
        tokens. The provider owns 95% of the tail excess and input tokens explain 80% of it:
        summarise the history after 4 turns and cap the loop at 8.
    """

    id = "context-growth"
    layer = PROVIDER
    Thresholds = Thresholds

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(PROVIDER)
        if not stats.seen or not owns_tail(
            analysis, stats, min_share=t.min_share_of_tail_excess, min_excess_ms=t.min_tail_excess_ms
        ):
            return
        by_model, _ = ttft_calls(analysis)
        lines = prompt_lines(by_model, min_calls=t.min_calls, min_input_token_spread=t.min_input_token_spread)
        if not lines:
            return
        calls = [c for model_calls in by_model.values() for c in model_calls]
        convs = conversations(calls)
        growing = [c for c in convs if _grows(c, t)]
        tail = sorted(set(analysis.groups.tail))
        late_turn_of: dict[int, Conversation] = {}  # tail request -> a growing conversation it is a late turn of
        for conv in growing:
            for turn, call in enumerate(conv.calls):
                if turn > 0 and call.request_index in tail:
                    late_turn_of.setdefault(call.request_index, conv)
        tail_with_calls = {c.request_index for c in calls} & set(tail)
        if not tail_with_calls or not late_turn_of:
            return
        tail_share = len(late_turn_of) / len(tail_with_calls)
        part = prompt_part(analysis, calls, lines, per_request=True)
        if part is None or part.excess_ms <= 0:
            return
        explained = part.excess_share_from_prompt
        if tail_share < t.min_tail_share_in_growing or explained < t.min_share_explained:
            return
        yield self._finding(analysis, stats.share_of_tail_excess, stats.tail_excess_ms, convs, growing,
                            late_turn_of, tail_share, part, lines, calls)  # fmt: skip

    def _finding(
        self,
        analysis: Analysis,
        share: float,
        tail_excess_ms: float,
        convs: Sequence[Conversation],
        growing: Sequence[Conversation],
        late_turn_of: dict[int, Conversation],
        tail_share: float,
        part: Any,
        lines: dict[str, PromptLine],
        calls: Sequence[TtftCall],
    ) -> Finding:
        tail_convs = list({conv.key: conv for conv in late_turn_of.values()}.values())
        turns = statistics.median(conv.turns for conv in tail_convs)
        first_tokens = _median_of(conv.calls[0].input_tokens for conv in tail_convs)
        last_tokens = _median_of(conv.calls[-1].input_tokens for conv in tail_convs)
        first_ttft = statistics.median(conv.calls[0].ttft_ms for conv in tail_convs)
        last_ttft = statistics.median(conv.calls[-1].ttft_ms for conv in tail_convs)
        per_turn = _median_of(conv.growth() for conv in tail_convs)
        model = max(lines, key=lambda m: lines[m].calls)
        line = lines[model]
        tail_set, median_set = set(analysis.groups.tail), set(analysis.groups.median)
        tail_turns = _mean_calls(calls, tail_set)
        median_turns = _mean_calls(calls, median_set)
        from_turns_ms = line.intercept_ms * (tail_turns - median_turns)
        by_id = [conv for conv in convs if conv.by_digest]
        evidence: dict[str, Any] = {
            "model": model or None,
            "conversations": len(convs),
            "conversations_by_id": len(by_id),
            "conversations_by_request": len(convs) - len(by_id),
            "growing_conversations": len(growing),
            "grouped_by": "conversation_id" if tail_convs and all(c.by_digest for c in tail_convs) else
                          "request" if not any(c.by_digest for c in tail_convs) else "both",
            "tail_requests_in_growing_conversations": len(late_turn_of),
            "tail_share_in_growing_conversations": round(tail_share, 4),
            "turns": turns,
            "input_tokens_first_turn": None if first_tokens is None else round(first_tokens, 1),
            "input_tokens_last_turn": None if last_tokens is None else round(last_tokens, 1),
            "input_tokens_added_per_turn": None if per_turn is None else round(per_turn, 1),
            "ttft_first_turn_ms": round(first_ttft, 3),
            "ttft_last_turn_ms": round(last_ttft, 3),
            "ms_per_1k_input_tokens": round(line.ms_per_1k_input_tokens, 3),
            "robust_r_squared": None if line.robust_r_squared is None else round(line.robust_r_squared, 4),
            "llm_calls_per_tail_request": round(tail_turns, 2),
            "llm_calls_per_median_request": round(median_turns, 2),
            "tail_ttft_ms": round(part.tail_ttft_ms, 3),
            "median_ttft_ms": round(part.median_ttft_ms, 3),
            "tail_input_tokens": round(part.tail_input_tokens, 1),
            "median_input_tokens": round(part.median_input_tokens, 1),
            "tail_ttft_excess_ms": round(part.excess_ms, 3),
            "tail_excess_from_input_tokens_ms": round(part.excess_from_prompt_ms, 3),
            "tail_excess_share_from_input_tokens": round(part.excess_share_from_prompt, 4),
            "tail_excess_from_more_turns_ms": round(from_turns_ms, 3),
            "provider_tail_excess_ms": round(tail_excess_ms, 3),
            "share_of_tail_excess": round(share, 4),
            "example_request_ids": [analysis.requests[i].request.request_id for i in sorted(
                late_turn_of, key=lambda i: -analysis.breakdowns[i].get(PROVIDER, 0.0))[:3]],
        }  # fmt: skip
        along = "calls sharing a conversation id" if evidence["grouped_by"] == "conversation_id" else (
            "successive LLM calls of one request" if evidence["grouped_by"] == "request" else "conversations")
        tokens_text = ""
        if first_tokens is not None and last_tokens is not None:
            tokens_text = f" input tokens grow from {first_tokens:,.0f} on the first turn to {last_tokens:,.0f} on the last"
        summary = (
            f"The context grows turn over turn: along {along},{tokens_text} ({turns:g} turns), and TTFT from"
            f" {fmt_ms(first_ttft)} to {fmt_ms(last_ttft)}. {tail_share:.0%} of the slowest 1% of requests are late turns"
            f" of such conversations; the provider owns {share:.0%} of the tail excess, and at the fitted"
            f" {line.ms_per_1k_input_tokens:.0f} ms per 1k input tokens their input tokens explain"
            f" {part.excess_share_from_prompt:.0%} of their extra time to first token"
            f" ({fmt_ms(part.excess_from_prompt_ms)} of {fmt_ms(part.excess_ms)})."
        )
        confidence = share * (0.5 + 0.5 * part.excess_share_from_prompt) * (0.5 + 0.5 * tail_share)
        return self.finding(
            severity=severity_for_share(share),
            confidence=confidence,
            impact_ms=max(0.0, tail_excess_ms),
            summary=summary,
            evidence=evidence,
            fix=_fix(turns, last_tokens, line.ms_per_1k_input_tokens, by_request=evidence["grouped_by"] != "conversation_id"),
            subject=model,
        )


def _grows(conv: Conversation, t: Thresholds) -> bool:
    """At least `min_turns` turns, input tokens rising turn over turn (a positive Theil-Sen slope)
    and the last turn's at least `min_growth_ratio` times the first's."""
    if conv.turns < t.min_turns:
        return False
    first, last = conv.calls[0].input_tokens, conv.calls[-1].input_tokens
    slope = conv.growth()
    return bool(first and last and slope is not None and slope > 0 and last >= t.min_growth_ratio * first)


def _median_of(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _mean_calls(calls: Sequence[TtftCall], cohort: set[int]) -> float:
    """Mean number of measured LLM calls of the cohort's requests that made any."""
    counts: dict[int, int] = {}
    for call in calls:
        if call.request_index in cohort:
            counts[call.request_index] = counts.get(call.request_index, 0) + 1
    return sum(counts.values()) / len(counts) if counts else 0.0


def _fix(turns: float, last_tokens: float | None, ms_per_1k: float, *, by_request: bool) -> str:
    parts = []
    if last_tokens is not None:
        parts.append(
            f"The last turn sends {last_tokens:,.0f} input tokens, about {fmt_ms(ms_per_1k * last_tokens / 1000)} of"
            " prefill before its first token:"
        )
    parts.append(
        "send less history - summarise older turns into a short running summary, keep a window of the last turns,"
        " drop tool results once they were used, and retrieve fewer chunks per turn."
    )
    if by_request:
        parts.append(f"Cap the agent loop's turns (the tail's run {turns:g}) and stop it as soon as the task is done.")
    parts.append(
        "Keep the stable part of the prompt (system prompt, tool definitions) first and unchanged so prompt caching"
        " applies to it; with the Responses API, previous_response_id or a conversation keeps the history on the"
        " provider's side instead of resending it."
    )
    return " ".join(parts)
