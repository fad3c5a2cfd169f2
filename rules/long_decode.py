"""Rule long-decode: generation after the first token owns the tail, from many tokens or slow tokens."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from latprof.analysis.decode_load import TailLoad, tail_load
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
#: The tail's tokens come slower with more calls to the model in flight (inferred; `decode_load`).
CALLS_IN_FLIGHT = "calls_in_flight"
LOAD_INFERRED_FROM = (
    "time per output token against the calls to the same model in flight, over every streamed call of the"
    " capture: a correlation, not a measurement of the provider's batch"
)


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0
    #: A cause explaining at least this share of the decode excess gets its own fix.
    min_cause_share: float = 0.3
    #: Slower tokens are put down to load (calls in flight) when the load slope predicts at
    #: least this share of the tail's extra time per token, and more of it than output length.
    min_load_share_of_tpot_excess: float = 0.5


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
        each token comes slower. Slower tokens are then set against the load: when each
        streamed call's time per token rises with the calls to the same model (and endpoint)
        in flight during its decode, and the tail decoded beside more of them, the slow
        tokens are put down to a crowded batch (inferred: a correlation over the capture).

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
        When the tail's tokens are slower, the load fit of the tail's model: time per token
        at low and high calls in flight, its Theil-Sen slope in ms per token per extra call
        in flight (and per output token), the calls in flight in the tail and the median,
        the share of the slower tokens the load accounts for, and `slow_tokens_cause`
        (`calls_in_flight`, with `cause_inferred_from`, or unknown).

    How to fix:
        Many tokens: cap `max_tokens` / `max_output_tokens` for the route, ask for a shorter
        answer in the prompt, return structured output (JSON with bounded fields) instead of
        prose, or split a long report into sections generated in parallel. Slow tokens: a
        smaller or faster model for the path, more provider capacity (provisioned
        throughput), smaller batches on a self-hosted server. Slow tokens under load: cap
        the calls in flight to the model or endpoint, spread bursts, provisioned throughput,
        or a smaller max batch (max num seqs) on a self-hosted engine. Either way stream the
        answer to the user so reading starts at the first token.

    Example:
        A chat service where 3% of requests hit `POST /report`: the median request decodes
        160 tokens in 0.8 s, the slowest 1% decode 3,100 tokens in 16 s at the same 5 ms per
        token. Model owns 100% of the tail excess and the cause is output tokens: cap
        `max_tokens` for /report or generate its sections in parallel. Another service
        fires bursts of 16 calls: its tail decodes the same 40 tokens at 70 ms per token
        against 14, beside 15 other calls in flight against 1, and time per token rises by
        4 ms per extra call in flight (inferred): cap the calls in flight to the model.
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
        load = tail_load(analysis) if TIME_PER_TOKEN in causes else None
        # A client loop blocked now and then also slows every stream in flight at once: no cause is read then.
        under_load = (load is not None and load.explains(t.min_load_share_of_tpot_excess)
                      and possible_stall_caveat(tail, MODEL, analysis.timeline.possible_stalls) is None)  # fmt: skip
        if load is not None:
            evidence.update(load_evidence(load, under_load))
        if under_load:
            causes = [CALLS_IN_FLIGHT if c == TIME_PER_TOKEN else c for c in causes]
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
            if under_load and load is not None:
                summary += "; " + load_summary(load)
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


def load_evidence(load: TailLoad, under_load: bool) -> dict[str, Any]:
    """The evidence of the load fit (`latprof.analysis.decode_load`): time per token at low and
    high load, its slopes, the calls in flight in the tail and the median, and what each slope
    predicts of the tail's slower tokens; the cause and what it was inferred from when it is load."""
    fit = load.fit
    model, endpoint = fit.key
    evidence: dict[str, Any] = {  # `or 0.0`: a slope of -0.0 reads as 0
        "load_model": model,
        "load_endpoint": endpoint,
        "calls_fitted": fit.calls,
        "calls_in_flight_median": round(load.median.in_flight, 2),
        "calls_in_flight_tail": round(load.tail.in_flight, 2),
        "calls_in_flight_low": round(fit.in_flight_low, 2),
        "calls_in_flight_high": round(fit.in_flight_high, 2),
        "tpot_ms_at_low_in_flight": round(fit.tpot_ms_low, 3),
        "tpot_ms_at_high_in_flight": round(fit.tpot_ms_high, 3),
        "tpot_ms_per_call_in_flight": round(fit.ms_per_token_per_call_in_flight, 4) or 0.0,
        "tpot_ms_per_output_token": round(fit.ms_per_token_per_output_token, 5) or 0.0,
        "tpot_excess_ms": round(load.tpot_excess_ms, 3),
        "tpot_excess_from_load_ms": round(load.from_load_ms, 3),
        "tpot_excess_from_output_length_ms": round(load.from_length_ms, 3),
        "load_share_of_tpot_excess": round(load.load_share, 4),
        "slow_tokens_cause": CALLS_IN_FLIGHT if under_load else "unknown",
    }
    if under_load:
        evidence["cause_inferred_from"] = LOAD_INFERRED_FROM
    return evidence


def load_summary(load: TailLoad) -> str:
    """'time per token rises with the calls to m in flight, by 2.00 ms per extra call (...)', said to be inferred."""
    fit = load.fit
    return (
        f"time per token rises with the calls to {fit.key[0] or 'the model'} in flight, by"
        f" {fit.ms_per_token_per_call_in_flight:.2f} ms per extra call ({fit.tpot_ms_low:.1f} ms at"
        f" {fit.in_flight_low:.1f} others in flight, {fit.tpot_ms_high:.1f} ms at {fit.in_flight_high:.1f}), and the"
        f" tail decoded beside {load.tail.in_flight:.1f} other calls against {load.median.in_flight:.1f} for the median:"
        f" the load accounts for {load.load_share:.0%} of its slower tokens (inferred from a correlation over the"
        " capture: a crowded batch)"
    )


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
    if CALLS_IN_FLIGHT in causes:
        parts.append(
            "The tail's tokens come slower when more calls to the model are in flight (a crowded batch): cap the"
            " calls in flight to this model or endpoint (a semaphore around the client), spread bursts out or"
            " over more deployments or regions, buy provisioned throughput, or, for a self-hosted engine, lower"
            " its batch size (vLLM --max-num-seqs, TGI --max-batch-size) or add replicas."
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
