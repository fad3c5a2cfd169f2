"""Rule long-decode: generation after the first token owns the tail, from many tokens or slow tokens."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from latprof.analysis.requests import NS_PER_MS, Analysis
from latprof.analysis.stall_inference import POSSIBLE_STALL_CONFIDENCE, possible_stall_caveat
from latprof.engine import Finding, Rule, fmt_ms, layer_evidence, owns_tail, severity_for_share
from latprof.events import Segment
from latprof.analysis.genai import is_measured, model_of, token_count
from latprof.layers import MODEL
from latprof.semconv import ESTIMATED, GEN_AI_OUTPUT_TOKENS
from latprof.analysis.timeline import RequestTimeline

OUTPUT_TOKENS = "output_tokens"
TIME_PER_TOKEN = "time_per_token"


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0
    #: A cause explaining at least this share of the decode excess gets its own fix.
    min_cause_share: float = 0.3


@dataclass(frozen=True, slots=True)
class DecodeCohort:
    """Measured decode of a cohort's requests that reported output tokens."""

    requests: int
    mean_output_tokens: float
    tpot_ms: float  # decode ms per output token, token-weighted: mean decode = tokens x tpot

    @property
    def mean_decode_ms(self) -> float:
        return self.mean_output_tokens * self.tpot_ms


class LongDecode(Rule):
    """Generation after the first token owns the tail: too many output tokens, or slow ones.

    What it detects:
        The `model` layer (decode: from the first token to the end of the answer) explains a
        large part of the tail. Decode time is output tokens x time per output token, so
        the rule compares the slowest 1% of requests with the median ones on both factors
        and says which one makes the difference: the tail generates many more tokens, or
        each token comes slower.

    Why it matters for p99:
        Decode grows linearly with the answer: at 5 ms per token a 3,000-token report takes
        15 s however fast the first token came. A few routes or prompts that let the model
        ramble own the p99 on their own. Slower tokens point elsewhere: a larger model, a
        provider short of capacity or a local model server batching too much.

    Evidence:
        decode p50/p99 per request, the tail excess and its share; mean output tokens and
        time per output token (decode ms / output tokens) in the median and the tail cohort;
        the decode excess split into the part from extra tokens and the part from slower
        tokens, and the dominant cause; the models and routes of the tail; example request
        ids. Estimated decode segments (non-streamed calls) are left out of the comparison.

    How to fix:
        Many tokens: cap `max_tokens` / `max_output_tokens` for the route, ask for a shorter
        answer in the prompt, return structured output (JSON with bounded fields) instead of
        prose, or split a long report into sections generated in parallel. Slow tokens: a
        smaller or faster model for the path, more provider capacity (provisioned
        throughput), smaller batches on a self-hosted server. Either way stream the answer
        to the user so reading starts at the first token.

    Example:
        A chat service where 3% of requests hit `POST /report`: the median request decodes
        160 tokens in 0.8 s, the slowest 1% decode 3,100 tokens in 16 s at the same 5 ms per
        token. Model owns 100% of the tail excess and the cause is output tokens: cap
        `max_tokens` for /report or generate its sections in parallel.
    """

    id = "long-decode"
    layer = MODEL
    Thresholds = Thresholds

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(MODEL)
        if not analysis.has_tail:
            return
        if not owns_tail(analysis, stats, min_share=t.min_share_of_tail_excess, min_excess_ms=t.min_tail_excess_ms):
            return
        tail = analysis.cohort("tail")
        median = decode_cohort(analysis.cohort("median"))
        slow = decode_cohort(tail)
        evidence: dict[str, Any] = {**layer_evidence(stats, "decode")}
        cause = "unknown"
        causes: list[str] = []
        if median is not None and slow is not None:
            from_tokens, from_tpot = split_excess(median, slow)
            evidence.update(
                {
                    "output_tokens_median": round(median.mean_output_tokens, 1),
                    "output_tokens_tail": round(slow.mean_output_tokens, 1),
                    "tpot_ms_median": round(median.tpot_ms, 3),
                    "tpot_ms_tail": round(slow.tpot_ms, 3),
                    "excess_from_output_tokens_ms": round(from_tokens, 3),
                    "excess_from_time_per_token_ms": round(from_tpot, 3),
                }
            )
            positive = max(0.0, from_tokens) + max(0.0, from_tpot)
            if positive > 0:
                cause = OUTPUT_TOKENS if from_tokens >= from_tpot else TIME_PER_TOKEN
                causes = [
                    name
                    for name, part in ((OUTPUT_TOKENS, from_tokens), (TIME_PER_TOKEN, from_tpot))
                    if name == cause or (part > 0 and part / positive >= t.min_cause_share)
                ]
                evidence["output_tokens_share_of_excess"] = round(max(0.0, from_tokens) / positive, 4)
        evidence["dominant_cause"] = cause
        evidence["estimated_segments_excluded"] = sum(1 for _, s in analysis.segments(MODEL) if s.attrs.get(ESTIMATED))
        models = Counter[str]()
        for rt in tail:
            for segment in _decode_segments(rt, measured_only=False):
                models[model_of(segment)] += segment.end_ns - segment.start_ns
        evidence["tail_models"] = [m for m, _ in models.most_common() if m]
        evidence["tail_routes"] = sorted({rt.request.route for rt in tail})
        evidence["example_request_ids"] = analysis.example_request_ids(MODEL)

        summary = (
            f"The slowest 1% of requests spent {fmt_ms(stats.tail_excess_ms)} longer generating after the first"
            f" token than the median request ({stats.share_of_tail_excess:.0%} of the tail excess)"
        )
        if median is not None and slow is not None:
            summary += (
                f": {slow.mean_output_tokens:,.0f} output tokens vs {median.mean_output_tokens:,.0f},"
                f" at {slow.tpot_ms:.1f} vs {median.tpot_ms:.1f} ms per token"
            )
            if cause == OUTPUT_TOKENS:
                summary += "; the tail generates many more tokens"
            elif cause == TIME_PER_TOKEN:
                summary += "; the tail's tokens come slower"
        else:
            summary += "; output token counts were not recorded, so tokens and speed cannot be told apart"
        confidence = stats.share_of_tail_excess * (1.0 if cause != "unknown" else 0.7)
        caveat = possible_stall_caveat(tail, MODEL, analysis.timeline.possible_stalls)
        if caveat is not None:  # the client read the stream late: its loop was blocked, maybe
            confidence = min(confidence, POSSIBLE_STALL_CONFIDENCE)
            summary += f"; but {caveat}"
            evidence["possible_event_loop_stalls"] = len(analysis.timeline.possible_stalls)
        yield self.finding(
            severity=severity_for_share(stats.share_of_tail_excess),
            confidence=confidence,
            impact_ms=stats.tail_excess_ms,
            summary=summary + ".",
            evidence=evidence,
            fix=_fix(causes or [cause], evidence["tail_routes"]),
            subject=models.most_common(1)[0][0] if models else "",
        )


def decode_cohort(requests: Sequence[RequestTimeline]) -> DecodeCohort | None:
    """Mean output tokens and token-weighted time per output token over requests that report tokens.

    Only measured decode segments count (not estimated ones, not attach-mode LLM time); a
    request counts when one of its decode segments has an output token count, and then only
    those segments count. None when no request qualifies.
    """
    counted = 0
    tokens_total = 0.0
    decode_ns = 0
    for rt in requests:
        request_tokens = 0.0
        request_ns = 0
        for segment in _decode_segments(rt, measured_only=True):
            tokens = token_count(segment.attrs.get(GEN_AI_OUTPUT_TOKENS))
            if tokens:
                request_tokens += tokens
                request_ns += segment.end_ns - segment.start_ns
        if request_tokens > 0:
            counted += 1
            tokens_total += request_tokens
            decode_ns += request_ns
    if not counted:
        return None
    return DecodeCohort(counted, tokens_total / counted, decode_ns / NS_PER_MS / tokens_total)


def split_excess(median: DecodeCohort, tail: DecodeCohort) -> tuple[float, float]:
    """Split the tail's extra decode (N_t*T_t - N_m*T_m) into (more tokens, slower tokens), in ms.

    Symmetric in the two factors: tokens part (N_t - N_m)(T_t + T_m)/2, speed part
    (T_t - T_m)(N_t + N_m)/2; they sum exactly to the difference in mean decode.
    """
    n_m, t_m = median.mean_output_tokens, median.tpot_ms
    n_t, t_t = tail.mean_output_tokens, tail.tpot_ms
    return (n_t - n_m) * (t_t + t_m) / 2, (t_t - t_m) * (n_t + n_m) / 2


def _decode_segments(rt: RequestTimeline, *, measured_only: bool) -> Iterable[Segment]:
    for segment in rt.segments:
        if segment.layer != MODEL or segment.end_ns <= segment.start_ns:
            continue
        if measured_only and not is_measured(segment):
            continue
        yield segment


def _fix(causes: Sequence[str], routes: Sequence[str]) -> str:
    where = f" on {', '.join(routes)}" if routes and len(routes) <= 3 else ""
    parts = []
    if OUTPUT_TOKENS in causes:
        parts.append(
            f"The tail generates many more tokens{where}: cap max_tokens / max_output_tokens for it, ask for a shorter"
            " answer, return structured output with bounded fields, or generate long documents in sections in"
            " parallel."
        )
    if TIME_PER_TOKEN in causes:
        parts.append(
            "The tail's tokens come slower: use a smaller or faster model on this path, get more provider capacity"
            " (provisioned throughput), or run smaller batches on a self-hosted model server."
        )
    if not parts:
        parts.append(
            "Record output token counts to tell long answers from slow tokens; meanwhile cap max_tokens on the"
            " slow routes and consider a faster model."
        )
    parts.append("Stream the answer to the user so reading starts at the first token.")
    return " ".join(parts)
