"""Reading LLM calls off segments: model, token counts, whether TTFT was measured; the non-streamed split."""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from latprof.events import Segment
from latprof.layers import MODEL, PROVIDER
from latprof.semconv import (
    ESTIMATED,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
    LLM_CALL_ID,
    SPLIT_UNKNOWN,
    TTFT_KNOWN,
)
from latprof.timeline import RequestTimeline


def model_of(segment: Segment) -> str:
    """The model an LLM segment called (requested, else responding), or ""."""
    model = segment.attrs.get(GEN_AI_REQUEST_MODEL) or segment.attrs.get(GEN_AI_RESPONSE_MODEL)
    return str(model) if model else ""


def token_count(value: Any) -> float | None:
    """A token count as a float, or None when absent or not a finite non-negative number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def is_measured(segment: Segment) -> bool:
    """False for estimated boundaries and for attach-mode LLM time whose TTFT/decode split is unknown."""
    return not (segment.attrs.get(ESTIMATED) or segment.attrs.get(SPLIT_UNKNOWN))


def decode_ms_per_token(requests: Sequence[RequestTimeline]) -> dict[str, float]:
    """Median decode time per output token, per model, from measured (streamed) `model` segments."""
    per_token: dict[str, list[float]] = {}
    for rt in requests:
        for segment in rt.segments:
            if segment.layer != MODEL or not is_measured(segment):
                continue
            tokens = token_count(segment.attrs.get(GEN_AI_OUTPUT_TOKENS))
            if tokens and segment.end_ns > segment.start_ns:
                per_token.setdefault(model_of(segment), []).append((segment.end_ns - segment.start_ns) / 1e6 / tokens)
    return {model: statistics.median(values) for model, values in per_token.items()}


def split_unstreamed_calls(requests: Sequence[RequestTimeline]) -> tuple[list[RequestTimeline], list[str]]:
    """Split each non-streamed LLM call into `provider` and an estimated `model` part.

    A non-streamed call has no TTFT (its `provider` segment says `latprof.ttft_known: false`
    and no `model` segment shares its call id). Its decode is estimated (DESIGN.md) as its
    output tokens times the median time per token of streamed calls of the same model, at
    most the whole call; both parts are marked `latprof.estimated`. A call with no output
    token count, or whose model has no streamed calls, stays whole in `provider`. Returns
    the requests (unchanged ones are the same objects) and warnings saying what was done.
    """
    candidates = []
    for i, rt in enumerate(requests):
        for segment in rt.segments:
            if segment[4] == PROVIDER and segment[8].get(TTFT_KNOWN) is False:  # layer, attrs
                candidates.append(i)
                break
    if not candidates:
        return list(requests), []
    rates = decode_ms_per_token(requests)
    out = list(requests)
    split = unsplit = 0
    used: dict[str, float] = {}
    for i in candidates:
        rt = out[i]
        streamed_calls = {s.attrs.get(LLM_CALL_ID) for s in rt.segments if s.layer == MODEL and s.attrs.get(LLM_CALL_ID)}
        segments: list[Segment] = []
        for segment in rt.segments:
            if (
                segment.layer != PROVIDER
                or segment.attrs.get(TTFT_KNOWN) is not False
                or not is_measured(segment)
                or (segment.attrs.get(LLM_CALL_ID) and segment.attrs.get(LLM_CALL_ID) in streamed_calls)
            ):
                segments.append(segment)
                continue
            model = model_of(segment)
            tokens = token_count(segment.attrs.get(GEN_AI_OUTPUT_TOKENS))
            rate = rates.get(model)
            if not tokens or rate is None:
                unsplit += 1
                segments.append(segment)
                continue
            decode_ns = min(segment.end_ns - segment.start_ns, int(tokens * rate * 1e6))
            boundary = segment.end_ns - decode_ns
            attrs = {**segment.attrs, ESTIMATED: True}
            segments.append(segment._replace(end_ns=boundary, attrs=attrs))
            segments.append(
                Segment(segment.request_id, f"{segment.segment_id}.decode", segment.parent_id, segment.name, MODEL,
                        boundary, segment.end_ns, segment.pid, attrs)
            )
            used[model] = rate
            split += 1
        out[i] = RequestTimeline(rt.request, tuple(segments))
    warnings = []
    if split:
        rates_text = ", ".join(f"{model or 'unnamed model'} {rate:.2f} ms/token" for model, rate in sorted(used.items()))
        warnings.append(
            f"{split} non-streamed LLM call(s) have no measured TTFT: their decode is estimated as output tokens x"
            f" the median time per token of streamed calls of the same model ({rates_text})"
        )
    if unsplit:
        warnings.append(
            f"{unsplit} non-streamed LLM call(s) could not be split (no output token count, or no streamed calls of"
            " the same model): counted whole as provider"
        )
    return out, warnings
