"""Reading LLM calls off segments: model, token counts, whether TTFT was measured; the non-streamed split."""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

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
from latprof.analysis.timeline import RequestTimeline


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


def decode_ms_per_token(model_segments: Iterable[Segment]) -> dict[str, float]:
    """Median decode time per output token, per model, over measured (streamed) `model` segments."""
    per_token: dict[str, list[float]] = {}
    for segment in model_segments:
        if segment.layer != MODEL or not is_measured(segment):
            continue
        tokens = token_count(segment.attrs.get(GEN_AI_OUTPUT_TOKENS))
        if tokens and segment.end_ns > segment.start_ns:
            per_token.setdefault(model_of(segment), []).append((segment.end_ns - segment.start_ns) / 1e6 / tokens)
    return {model: statistics.median(values) for model, values in per_token.items()}


def is_unstreamed(segment: Segment) -> bool:
    """True for the `provider` segment of an LLM call whose TTFT was not observed."""
    return segment[4] == PROVIDER and segment[8].get(TTFT_KNOWN) is False  # layer, attrs (hot path)


#: The fit of decode from call durations (`fit_decode_ms_per_token`) is trusted only over at least
#: this many non-streamed calls of a model, whose output tokens span at least this ratio (max / min).
FIT_MIN_CALLS = 8
FIT_MIN_TOKEN_RATIO = 2.0
#: At most this many calls per model enter the pairwise slopes (evenly picked): the pairs grow as n².
FIT_MAX_CALLS = 400


def theil_sen_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The Theil–Sen slope of `points` (x, y): the median of the slopes between every two points
    with different x; None when no two x differ. Robust to outliers (a slow provider now and
    then), unlike least squares."""
    slopes = []
    for i, (x1, y1) in enumerate(points):
        for x2, y2 in points[i + 1 :]:
            if x2 != x1:
                slopes.append((y2 - y1) / (x2 - x1))
    return statistics.median(slopes) if slopes else None


class DecodeFit(NamedTuple):
    """A model's decode time per output token fitted from non-streamed call durations."""

    ms_per_token: float
    calls: int


def fit_decode_ms_per_token(unstreamed: Iterable[Segment]) -> dict[str, DecodeFit]:
    """Decode time per output token, per model, fitted from how the duration of its non-streamed
    calls (`is_unstreamed` segments) grows with their output tokens: the Theil–Sen slope of
    duration (ms) against output tokens.

    Kept only when credible: at least `FIT_MIN_CALLS` calls with an output token count, the
    largest count at least `FIT_MIN_TOKEN_RATIO` times the smallest (tokens that barely vary
    cannot tell decode from provider time), and a positive slope. The intercept is the part of
    a call that does not grow with the answer (TTFT); it is not needed."""
    points: dict[str, list[tuple[float, float]]] = {}
    for segment in unstreamed:
        if not is_unstreamed(segment) or not is_measured(segment):
            continue
        tokens = token_count(segment.attrs.get(GEN_AI_OUTPUT_TOKENS))
        if tokens and segment.end_ns > segment.start_ns:
            points.setdefault(model_of(segment), []).append((tokens, (segment.end_ns - segment.start_ns) / 1e6))
    fits: dict[str, DecodeFit] = {}
    for model, calls in points.items():
        counts = [x for x, _ in calls]
        if len(calls) < FIT_MIN_CALLS or max(counts) < FIT_MIN_TOKEN_RATIO * min(counts):
            continue
        sample = calls if len(calls) <= FIT_MAX_CALLS else [calls[i * len(calls) // FIT_MAX_CALLS] for i in range(FIT_MAX_CALLS)]
        slope = theil_sen_slope(sample)
        if slope is not None and slope > 0 and math.isfinite(slope):
            fits[model] = DecodeFit(slope, len(calls))
    return fits


class UnstreamedSplitter:
    """Splits non-streamed LLM calls into `provider` and an estimated `model` part.

    A non-streamed call has no TTFT (its `provider` segment says `latprof.ttft_known: false`
    and no `model` segment shares its call id). Its decode is estimated (docs/design.md,
    "Non-streamed calls: an estimated split") as its output tokens times the median time per
    token of streamed calls of the same model (`rates`, from `decode_ms_per_token`); a model
    with no streamed calls uses the time per token fitted from its non-streamed calls'
    durations (`fits`, from `fit_decode_ms_per_token`) when there is one. At most the whole
    call; both parts are marked `latprof.estimated`. A call with no output token count, or
    whose model has neither, stays whole in `provider`. `warnings()` says what was done.
    """

    def __init__(self, rates: Mapping[str, float], fits: Mapping[str, DecodeFit] | None = None) -> None:
        self.rates = rates
        self.fits = fits or {}
        self.split = 0
        self.fitted = 0
        self.unsplit = 0
        self.used: dict[str, float] = {}
        self.used_fits: dict[str, DecodeFit] = {}

    def __call__(self, rt: RequestTimeline) -> RequestTimeline:
        streamed_calls = {s.attrs.get(LLM_CALL_ID) for s in rt.segments if s.layer == MODEL and s.attrs.get(LLM_CALL_ID)}
        segments: list[Segment] = []
        for segment in rt.segments:
            call_id = segment.attrs.get(LLM_CALL_ID)
            if not is_unstreamed(segment) or not is_measured(segment) or (call_id and call_id in streamed_calls):
                segments.append(segment)
                continue
            model = model_of(segment)
            tokens = token_count(segment.attrs.get(GEN_AI_OUTPUT_TOKENS))
            rate = self.rates.get(model)
            fit = self.fits.get(model) if rate is None else None
            if not tokens or (rate is None and fit is None):
                self.unsplit += 1
                segments.append(segment)
                continue
            if fit is not None:
                rate = fit.ms_per_token
                self.used_fits[model] = fit
                self.fitted += 1
            else:
                assert rate is not None
                self.used[model] = rate
                self.split += 1
            decode_ns = min(segment.end_ns - segment.start_ns, int(tokens * rate * 1e6))
            boundary = segment.end_ns - decode_ns
            attrs = {**segment.attrs, ESTIMATED: True}
            segments.append(segment._replace(end_ns=boundary, attrs=attrs))
            segments.append(
                Segment(segment.request_id, f"{segment.segment_id}.decode", segment.parent_id, segment.name, MODEL,
                        boundary, segment.end_ns, segment.pid, attrs)
            )  # fmt: skip
        return RequestTimeline(rt.request, tuple(segments))

    def warnings(self) -> list[str]:
        out = []
        if self.split:
            rates = ", ".join(f"{model or 'unnamed model'} {rate:.2f} ms/token" for model, rate in sorted(self.used.items()))
            out.append(
                f"{self.split} non-streamed LLM call(s) have no measured TTFT: their decode is estimated as output"
                f" tokens x the median time per token of streamed calls of the same model ({rates})"
            )
        if self.fitted:
            fits = ", ".join(f"{model or 'unnamed model'} {fit.ms_per_token:.2f} ms/token over {fit.calls} calls"
                             for model, fit in sorted(self.used_fits.items()))  # fmt: skip
            out.append(
                f"{self.fitted} non-streamed LLM call(s) have no measured TTFT and their model no streamed calls: their"
                f" decode is estimated as output tokens x a time per token fitted from how call duration grows with"
                f" output tokens (Theil-Sen slope: {fits})"
            )
        if self.unsplit:
            out.append(
                f"{self.unsplit} non-streamed LLM call(s) could not be split (no output token count, or no streamed"
                " calls of the same model): counted whole as provider"
            )
        return out


def split_unstreamed_calls(requests: Sequence[RequestTimeline]) -> tuple[list[RequestTimeline], list[str]]:
    """`UnstreamedSplitter` over a list of requests; unchanged requests are the same objects."""
    candidates = [i for i, rt in enumerate(requests) if any(is_unstreamed(s) for s in rt.segments)]
    out = list(requests)
    if not candidates:
        return out, []
    splitter = unstreamed_splitter((s for rt in requests for s in rt.segments), (requests[i] for i in candidates))
    for i in candidates:
        out[i] = splitter(out[i])
    return out, splitter.warnings()


def unstreamed_splitter(model_segments: Iterable[Segment], unstreamed_requests: Iterable[RequestTimeline]) -> UnstreamedSplitter:
    """The splitter for a set of requests: streamed rates from `model_segments`, fits from the
    non-streamed calls of `unstreamed_requests` (the requests holding any)."""
    return UnstreamedSplitter(decode_ms_per_token(model_segments),
                              fit_decode_ms_per_token(s for rt in unstreamed_requests for s in rt.segments))  # fmt: skip
