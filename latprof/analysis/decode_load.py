"""Decode against load: each streamed LLM call's time per output token beside the calls in flight to its model.

A provider (or a self-hosted engine) decodes the calls to one model in one batch: the more
streams in it, the slower each one's tokens. From the capture alone that shows as a
correlation: over every measured streamed call to a model (and endpoint, `server.address`
and `server.port` where the hook recorded them), its time per output token (decode ms /
output tokens) against the mean number of *other* calls to the same model decoding while it
did (`mean_others_in_flight`: time-weighted, over the `model` segments of every request and
process in the capture, warm-up included, estimated decodes of non-streamed calls too).

`fit_load` fits time per token against calls in flight and against output tokens (Theil–Sen
slopes, robust to a slow call now and then); `tail_load` compares the slowest requests' calls
with the median ones' and says how much of their slower tokens each slope predicts. What is
measured: each call's decode, tokens and overlap. What is inferred: that the load is the
cause (a provider slow for a while for another reason also keeps more calls in flight).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

from latprof.analysis.genai import FIT_MAX_CALLS, is_measured, model_of, theil_sen_slope, token_count
from latprof.analysis.requests import NS_PER_MS, Analysis, percentile
from latprof.analysis.timeline import RequestTimeline
from latprof.events import Segment
from latprof.layers import MODEL
from latprof.semconv import GEN_AI_OUTPUT_TOKENS, SERVER_ADDRESS, SERVER_PORT

#: Fewer measured calls of a model than this give no fit: a slope needs calls at several loads.
MIN_CALLS = 20

#: A model and the endpoint serving it ("" when not recorded): the calls that share a batch.
Key = tuple[str, str]


class DecodeCall(NamedTuple):
    """One measured streamed call: its decode, output tokens and the other calls in flight meanwhile."""

    request_id: str
    segment_id: str
    start_ns: int
    decode_ms: float
    output_tokens: float
    #: The time-weighted mean number of other calls to the same model decoding during this one's decode.
    in_flight: float

    @property
    def tpot_ms(self) -> float:
        return self.decode_ms / self.output_tokens


def mean_others_in_flight(intervals: Sequence[tuple[int, int]]) -> list[float]:
    """For each (start_ns, end_ns) interval, the time-weighted mean number of the *other*
    intervals overlapping it: the integral of the count of intervals open over it, divided by
    its length, less one (itself). 0.0 for an empty interval. A sweep: O(n log n).

    Intervals are half-open, so one that ends when another starts does not overlap it."""
    times = sorted({t for interval in intervals for t in interval})
    at = {t: i for i, t in enumerate(times)}
    change = [0] * len(times)
    for start, end in intervals:
        if end > start:
            change[at[start]] += 1
            change[at[end]] -= 1
    area = [0] * len(times)  # area[i]: the integral of the open count from times[0] to times[i]
    open_now = 0
    for i in range(1, len(times)):
        open_now += change[i - 1]
        area[i] = area[i - 1] + open_now * (times[i] - times[i - 1])
    return [(area[at[end]] - area[at[start]]) / (end - start) - 1.0 if end > start else 0.0 for start, end in intervals]


def key_of(segment: Segment) -> Key:
    """The model and endpoint (`host:port`, `host`, or "") of an LLM segment."""
    host = segment.attrs.get(SERVER_ADDRESS)
    port = segment.attrs.get(SERVER_PORT)
    endpoint = f"{host}:{port}" if host and port else str(host or "")
    return model_of(segment), endpoint


def decode_segments(analysis: Analysis) -> list[Segment]:
    """Every `model` segment of the capture: the analysed requests' (with the estimated decode of
    their non-streamed calls) and those of the requests not analysed (warm-up), once each."""
    analysed = [s for _, s in analysis.segments(MODEL)]
    seen = {(s.request_id, s.segment_id) for s in analysed}
    others = (s for rt in analysis.timeline.requests for s in rt.segments
              if s.layer == MODEL and (s.request_id, s.segment_id) not in seen)  # fmt: skip
    return analysed + list(others)


def decode_calls(segments: Iterable[Segment]) -> dict[Key, list[DecodeCall]]:
    """The measured streamed calls (`is_measured` `model` segments with output tokens) of each
    model and endpoint, by start, each with the calls in flight beside it; every `model`
    segment of `segments` with a duration counts as load, measured or not."""
    by_key: dict[Key, list[Segment]] = {}
    for segment in segments:
        if segment.layer == MODEL and segment.end_ns > segment.start_ns:
            by_key.setdefault(key_of(segment), []).append(segment)
    out: dict[Key, list[DecodeCall]] = {}
    for key, group in by_key.items():
        in_flight = mean_others_in_flight([(s.start_ns, s.end_ns) for s in group])
        calls = []
        for segment, others in zip(group, in_flight):
            tokens = token_count(segment.attrs.get(GEN_AI_OUTPUT_TOKENS)) if is_measured(segment) else None
            if tokens:
                calls.append(DecodeCall(segment.request_id, segment.segment_id, segment.start_ns,
                                        (segment.end_ns - segment.start_ns) / NS_PER_MS, tokens, others))  # fmt: skip
        if calls:
            out[key] = sorted(calls, key=lambda c: c.start_ns)
    return out


@dataclass(frozen=True, slots=True)
class LoadFit:
    """How a model's time per output token moves with the calls in flight and with output tokens."""

    key: Key
    calls: int
    #: Theil–Sen slope of time per token (ms) against calls in flight: ms per token per extra call.
    ms_per_token_per_call_in_flight: float
    #: Theil–Sen slope of time per token (ms) against output tokens (0 when tokens never vary).
    ms_per_token_per_output_token: float
    #: The calls at or below the lower quartile of calls in flight, and those at or above the
    #: upper one: their calls in flight and time per token, token-weighted (`cohort_load`).
    in_flight_low: float
    in_flight_high: float
    tpot_ms_low: float
    tpot_ms_high: float


def fit_load(key: Key, calls: Sequence[DecodeCall]) -> LoadFit | None:
    """The fit over a model's calls (at most `FIT_MAX_CALLS` of them, evenly picked, enter the
    slopes: their pairs grow as n²); None with fewer than `MIN_CALLS` calls or no two loads."""
    if len(calls) < MIN_CALLS:
        return None
    sample = calls if len(calls) <= FIT_MAX_CALLS else [calls[i * len(calls) // FIT_MAX_CALLS] for i in range(FIT_MAX_CALLS)]
    by_load = theil_sen_slope([(c.in_flight, c.tpot_ms) for c in sample])
    if by_load is None or not math.isfinite(by_load):
        return None
    by_length = theil_sen_slope([(c.output_tokens, c.tpot_ms) for c in sample])
    loads = sorted(c.in_flight for c in calls)
    lower, upper = percentile(loads, 25), percentile(loads, 75)
    low = cohort_load([c for c in calls if c.in_flight <= lower])
    high = cohort_load([c for c in calls if c.in_flight >= upper])
    assert low is not None and high is not None  # each holds a call with output tokens at least
    return LoadFit(key, len(calls), by_load, by_length if by_length is not None and math.isfinite(by_length) else 0.0,
                   low.in_flight, high.in_flight, low.tpot_ms, high.tpot_ms)  # fmt: skip


def _tpot_ms(calls: Sequence[DecodeCall]) -> float:
    """Token-weighted time per output token of `calls` (0 without any)."""
    tokens = sum(c.output_tokens for c in calls)
    return sum(c.decode_ms for c in calls) / tokens if tokens else 0.0


@dataclass(frozen=True, slots=True)
class CohortLoad:
    """A cohort's measured calls to one model: token-weighted time per token and calls in flight."""

    calls: int
    mean_output_tokens: float
    tpot_ms: float
    in_flight: float


def cohort_load(calls: Sequence[DecodeCall]) -> CohortLoad | None:
    """Token-weighted, so that a linear fit's prediction of time per token holds for the cohort."""
    tokens = sum(c.output_tokens for c in calls)
    if not tokens:
        return None
    in_flight = sum(c.in_flight * c.output_tokens for c in calls) / tokens
    return CohortLoad(len(calls), tokens / len(calls), _tpot_ms(calls), in_flight)


@dataclass(frozen=True, slots=True)
class TailLoad:
    """The tail's calls to a model against the median requests' calls, and the fit that explains them."""

    fit: LoadFit
    median: CohortLoad
    tail: CohortLoad

    @property
    def tpot_excess_ms(self) -> float:
        """How much slower the tail's tokens came than the median's, ms per token."""
        return self.tail.tpot_ms - self.median.tpot_ms

    @property
    def from_load_ms(self) -> float:
        """What the load slope predicts of it: slope x (tail's calls in flight - median's)."""
        return self.fit.ms_per_token_per_call_in_flight * (self.tail.in_flight - self.median.in_flight)

    @property
    def from_length_ms(self) -> float:
        """What the output-length slope predicts of it: slope x (tail's output tokens - median's)."""
        return self.fit.ms_per_token_per_output_token * (self.tail.mean_output_tokens - self.median.mean_output_tokens)

    @property
    def load_share(self) -> float:
        """The share of the tail's slower tokens the load predicts, within [0, 1] (0 when not slower)."""
        excess = self.tpot_excess_ms
        return min(1.0, max(0.0, self.from_load_ms / excess)) if excess > 0 else 0.0

    def explains(self, min_share: float) -> bool:
        """True when time per token rises with calls in flight, the load predicts at least
        `min_share` of the tail's slower tokens, and more of them than output length does."""
        return (
            self.fit.ms_per_token_per_call_in_flight > 0
            and self.tpot_excess_ms > 0
            and self.from_load_ms >= min_share * self.tpot_excess_ms
            and self.from_load_ms > self.from_length_ms
        )


def tail_load(analysis: Analysis) -> TailLoad | None:
    """The load fit of the model (and endpoint) with the most measured decode in the tail
    cohort, with the tail's and the median cohort's calls to it; None when the tail has no
    measured call, the median none to the same model, or the model too few calls to fit."""
    calls = decode_calls(decode_segments(analysis))
    if not calls:
        return None
    tail_ids = _request_ids(analysis.cohort("tail"))
    decode_ms: dict[Key, float] = {}
    for key, group in calls.items():
        decode_ms[key] = sum(c.decode_ms for c in group if c.request_id in tail_ids)
    key = max(decode_ms, key=lambda k: decode_ms[k])
    if decode_ms[key] <= 0:
        return None
    fit = fit_load(key, calls[key])
    median_ids = _request_ids(analysis.cohort("median"))
    median = cohort_load([c for c in calls[key] if c.request_id in median_ids])
    tail = cohort_load([c for c in calls[key] if c.request_id in tail_ids])
    if fit is None or median is None or tail is None:
        return None
    return TailLoad(fit, median, tail)


def _request_ids(requests: Iterable[RequestTimeline]) -> set[str]:
    return {rt.request.request_id for rt in requests}
