"""Rule provider-floor: the part of time to first token that no prompt change moves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from latprof.analysis.requests import NS_PER_MS, Analysis, LayerStats, percentile
from latprof.engine import Finding, Rule, fmt_ms, owns_tail, severity_for_share
from latprof.events import Segment
from latprof.analysis.genai import model_of, token_count
from latprof.layers import LAYERS, PROVIDER
from latprof.semconv import (
    ESTIMATED,
    GEN_AI_INPUT_TOKENS,
    SPLIT_UNKNOWN,
    TTFT_KNOWN,
)

#: Share (%) of calls furthest above the first least-squares line left out of the second fit.
_TRIM_PERCENT = 5.0


@dataclass(frozen=True, slots=True)
class Thresholds:
    #: Streamed calls (TTFT measured) a model needs before its floor is computed.
    min_calls: int = 20
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0
    #: Without a tail it owns, the provider must take this share of a median request's latency ...
    min_share_of_median_latency: float = 0.3
    #: ... and the floor must be at least this long.
    min_floor_ms: float = 200.0
    #: The floor is this percentile of TTFT once the prompt's part is taken out.
    floor_percentile: float = 5.0
    #: Fit a per-token slope only when input tokens vary at least this much (p95 - p5).
    min_input_token_spread: int = 500


@dataclass(frozen=True, slots=True)
class FloorFit:
    """TTFT of one model split into a floor and a part that grows with the prompt."""

    floor_ms: float
    ms_per_1k_input_tokens: float | None  # None: input tokens missing or too uniform to fit
    r_squared: float | None
    ls_intercept_ms: float | None  # the least-squares line at 0 tokens: a typical, not a minimal, TTFT
    fitted_calls: int


@dataclass(frozen=True, slots=True)
class _Call:
    request_index: int
    ttft_ms: float
    input_tokens: float | None


class ProviderFloor(Rule):
    """TTFT floor vs input tokens: the part no prompt change fixes.

    What it detects:
        Time to first token (the `provider` layer of streamed LLM calls) split into a floor
        that every call pays - network round trip, provider-side queueing, the prefill
        minimum - and a part that grows with the prompt. Per model, TTFT is fitted against
        input tokens by least squares; the slope is the cost of 1k more input tokens, and the
        floor is the 5th percentile of TTFT with that prompt part taken out (with no usable
        token counts: the 5th percentile of TTFT). Reported when the provider owns the tail,
        or when it is a large share of a typical request and the floor is long.

    Why it matters for p99:
        When the provider owns the tail, the first question is what a change on your side
        can move. Trimming prompts only moves the slope part; the floor stays whatever you
        do to the prompt, and TTFT in the tail above floor and prompt is provider-side
        queueing. Knowing the split stops weeks of prompt tuning that cannot reach the p99,
        and points at the fixes that can: where and how the model is served.

    Evidence:
        floor_ms and ms_per_1k_input_tokens (with r_squared of the fit), TTFT p5/p50/p99,
        the number of streamed calls used, input tokens p50/p99, the floor's share of TTFT
        p50 and p99, the mean TTFT of tail requests and how much of it lies above floor and
        prompt, and the calls left out: non-streamed calls (no TTFT, `ttft_known: false`),
        estimated segments and attach-mode LLM time whose TTFT/decode split is unknown.

    How to fix:
        The floor: route to a closer region or endpoint, buy dedicated or provisioned
        throughput (it also removes provider-side queueing), use a smaller or faster model on
        latency-critical paths, and keep a stable prompt prefix so prompt caching applies.
        Stream the answer to the user so they see the first token as soon as it exists. If
        the per-token part dominates, trim the prompt: fewer retrieved chunks, shorter
        history, a summary instead of the full conversation.

    Example:
        A summarisation endpoint on gpt-4o-mini: TTFT p50 1.0 s, p99 3.9 s. The fit gives a
        floor of 700 ms and 40 ms per 1k input tokens, so halving a 4k-token prompt saves
        80 ms. The slowest 1% waited 3.4 s above floor and prompt: provider-side queueing,
        which provisioned throughput removes and no prompt change touches.
    """

    id = "provider-floor"
    layer = PROVIDER
    Thresholds = Thresholds

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(PROVIDER)
        if not stats.seen:
            return
        tail_owned = owns_tail(
            analysis, stats, min_share=t.min_share_of_tail_excess, min_excess_ms=t.min_tail_excess_ms
        )
        median_latency_ms = sum(analysis.layer(name).median_mean_ms for name in LAYERS)
        median_share = stats.median_mean_ms / median_latency_ms if median_latency_ms > 0 else 0.0
        if not tail_owned and median_share < t.min_share_of_median_latency:
            return
        calls, excluded = _ttft_calls(analysis)
        if not calls:
            return
        tail_weights = _tail_provider_ms_by_model(analysis)
        tail_total_ms = sum(tail_weights.values())
        for model in sorted(calls):
            model_calls = calls[model]
            if len(model_calls) < t.min_calls:
                continue
            fit = fit_floor(
                [c.ttft_ms for c in model_calls],
                [c.input_tokens for c in model_calls],
                floor_percentile=t.floor_percentile,
                min_input_token_spread=t.min_input_token_spread,
            )
            # The layer's tail excess, split between models by their provider time in the tail.
            weight = tail_weights.get(model, 0.0) / tail_total_ms if tail_total_ms > 0 else 1.0 / len(calls)
            model_owns_tail = (
                tail_owned
                and stats.share_of_tail_excess * weight >= t.min_share_of_tail_excess
                and stats.tail_excess_ms * weight >= t.min_tail_excess_ms
            )
            if not model_owns_tail and (median_share < t.min_share_of_median_latency or fit.floor_ms < t.min_floor_ms):
                continue
            yield self._finding(
                analysis,
                stats,
                model,
                model_calls,
                fit,
                excluded.get(model, {}),
                model_owns_tail,
                median_share,
                weight,
                several_models=len(calls) > 1,
            )

    def _finding(
        self,
        analysis: Analysis,
        stats: LayerStats,
        model: str,
        calls: Sequence[_Call],
        fit: FloorFit,
        excluded: Mapping[str, int],
        tail_owned: bool,
        median_share: float,
        weight: float,
        *,
        several_models: bool,
    ) -> Finding:
        ttfts = sorted(c.ttft_ms for c in calls)
        ttft_p50, ttft_p99 = percentile(ttfts, 50), percentile(ttfts, 99)
        tokens = sorted(c.input_tokens for c in calls if c.input_tokens is not None)
        slope = fit.ms_per_1k_input_tokens
        model_share = stats.share_of_tail_excess * weight
        evidence: dict[str, Any] = {
            "model": model or None,
            "calls": len(calls),
            "floor_ms": round(fit.floor_ms, 3),
            "ms_per_1k_input_tokens": None if slope is None else round(slope, 3),
            "ttft_p5_ms": round(percentile(ttfts, 5), 3),
            "ttft_p50_ms": round(ttft_p50, 3),
            "ttft_p99_ms": round(ttft_p99, 3),
            "floor_share_of_ttft_p50": round(fit.floor_ms / ttft_p50, 4) if ttft_p50 > 0 else None,
            "floor_share_of_ttft_p99": round(fit.floor_ms / ttft_p99, 4) if ttft_p99 > 0 else None,
            "provider_share_of_median_latency": round(median_share, 4),
            "non_streamed_calls_excluded": excluded.get("non_streamed", 0),
            "split_unknown_calls_excluded": excluded.get("split_unknown", 0),
            "estimated_calls_excluded": excluded.get("estimated", 0),
        }
        if fit.r_squared is not None:
            evidence["r_squared"] = round(fit.r_squared, 4)
        if slope is not None:
            evidence["fitted_calls"] = fit.fitted_calls
        if fit.ls_intercept_ms is not None:
            evidence["ls_intercept_ms"] = round(fit.ls_intercept_ms, 3)
        prompt_ms_at_p50: float | None = None
        if tokens:
            evidence["input_tokens_p50"] = round(percentile(tokens, 50), 1)
            evidence["input_tokens_p99"] = round(percentile(tokens, 99), 1)
            if slope is not None:
                prompt_ms_at_p50 = slope * percentile(tokens, 50) / 1000
                evidence["prompt_part_at_p50_input_ms"] = round(prompt_ms_at_p50, 3)
        above_ms = _tail_above_floor_and_prompt(analysis, calls, fit, evidence)

        who = f"For {model}, TTFT" if model else "TTFT"
        floor_text = f"{who} has a floor of {fmt_ms(fit.floor_ms)} that no prompt change moves"
        if ttft_p50 > 0:
            floor_text += f" ({fit.floor_ms / ttft_p50:.0%} of TTFT p50)"
        if slope is None:
            prompt_text = "the prompt's part is unknown: input tokens were not recorded or hardly vary"
        else:
            prompt_text = f"shorter prompts save at most {slope:.0f} ms per 1k input tokens"
        if tail_owned:
            from_model = f" from {model}" if model and several_models else ""
            summary = (
                f"The provider owns {model_share:.0%} of the tail excess: the slowest 1% of requests waited"
                f" {fmt_ms(stats.tail_excess_ms * weight)} longer for first tokens{from_model} than the median"
                f" request. {floor_text}; {prompt_text}"
            )
            if above_ms is not None and above_ms > 0:
                summary += f"; tail TTFT ran {fmt_ms(above_ms)} above floor and prompt (provider-side queueing)"
            severity = severity_for_share(model_share)
        else:
            summary = (
                f"{floor_text}; {prompt_text}. Waiting for first tokens is {median_share:.0%} of a median request's"
                " latency"
            )
            severity = "warning" if median_share >= 0.5 else "info"
        evidence["provider_tail_excess_ms"] = round(stats.tail_excess_ms, 3)
        evidence["provider_share_of_tail_excess"] = round(stats.share_of_tail_excess, 4)
        evidence["share_of_tail_excess"] = round(model_share, 4)
        if tail_owned:
            evidence["example_request_ids"] = analysis.example_request_ids(PROVIDER)

        confidence = 0.5 + 0.3 * min(1.0, len(calls) / 100) + 0.2 * (fit.r_squared or 0.0)
        if tail_owned:
            confidence = min(confidence, 0.5 + model_share / 2)
        return self.finding(
            severity=severity,
            confidence=confidence,
            impact_ms=max(0.0, stats.tail_excess_ms) * weight,
            summary=summary + ".",
            evidence=evidence,
            fix=_fix(fit, prompt_ms_at_p50, evidence.get("input_tokens_p50"), above_ms),
            subject=model,
        )


def fit_floor(
    ttfts_ms: Sequence[float],
    input_tokens: Sequence[float | None],
    *,
    floor_percentile: float = 5.0,
    min_input_token_spread: float = 500,
) -> FloorFit:
    """Split TTFT into floor + slope x input tokens.

    Calls with a token count are fitted by least squares, TTFT_ms = a + b * tokens / 1000,
    when there are at least 3 of them with at least 3 distinct counts spread by
    `min_input_token_spread` (p95 - p5), then fitted again without the 5% of calls furthest
    above the line (queueing spikes); a negative slope is clamped to 0. The floor is the
    `floor_percentile` of TTFT - b * tokens / 1000 over the fitted calls (a floor, not the
    intercept `a`, which is a typical TTFT and carries the mean provider queueing and its
    spikes). Without a fit the floor is that percentile of every TTFT. Never below 0.
    """
    if not ttfts_ms:
        raise ValueError("fit_floor of no calls")
    pairs = [(t, float(n)) for t, n in zip(ttfts_ms, input_tokens) if n is not None]
    slope = r_squared = intercept = None
    if len(pairs) >= 3 and len({n for _, n in pairs}) >= 3:
        ordered = sorted(n for _, n in pairs)
        if percentile(ordered, 95) - percentile(ordered, 5) >= min_input_token_spread:
            slope, intercept, r_squared = _least_squares([n / 1000 for _, n in pairs], [t for t, _ in pairs])
            # Provider-side queueing spikes do not depend on the prompt but swamp the fit:
            # fit again without the calls furthest above the line.
            residuals = [t - intercept - slope * n / 1000 for t, n in pairs]
            cut = percentile(sorted(residuals), 100 - _TRIM_PERCENT)
            kept = [pair for pair, residual in zip(pairs, residuals) if residual <= cut]
            if len(kept) >= 3 and len({n for _, n in kept}) >= 2:
                slope, intercept, r_squared = _least_squares([n / 1000 for _, n in kept], [t for t, _ in kept])
    if slope is None:
        floor = percentile(sorted(ttfts_ms), floor_percentile)
        return FloorFit(max(0.0, floor), None, None, None, len(ttfts_ms))
    if slope < 0:  # more input never makes TTFT shorter: the tokens explain nothing here
        slope, r_squared, intercept = 0.0, 0.0, None
    adjusted = sorted(t - slope * n / 1000 for t, n in pairs)
    floor = percentile(adjusted, floor_percentile)
    return FloorFit(max(0.0, floor), slope, r_squared, intercept, len(pairs))


def _least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float | None]:
    """Return (slope, intercept, r_squared) of y = intercept + slope * x; xs must not be constant."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    syy = sum((y - mean_y) ** 2 for y in ys)
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    r_squared = None if syy == 0 else max(0.0, min(1.0, sxy * sxy / (sxx * syy)))
    return slope, intercept, r_squared


def _ttft_calls(analysis: Analysis) -> tuple[dict[str, list[_Call]], dict[str, dict[str, int]]]:
    """Streamed calls by model, and per model how many provider segments were left out and why.

    Only a provider segment with `ttft_known` true measures TTFT; estimated boundaries and
    attach-mode LLM time (provider and model not split) never do.
    """
    by_model: dict[str, list[_Call]] = {}
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
            ttft_ms = (segment.end_ns - segment.start_ns) / NS_PER_MS
            by_model.setdefault(model_of(segment), []).append(_Call(index, ttft_ms, token_count(attrs.get(GEN_AI_INPUT_TOKENS))))
    excluded: dict[str, dict[str, int]] = {}
    if by_model:  # (the counts matter only beside measured calls: without any the rule stops)
        for reason, segment in left_out:
            counts = excluded.setdefault(model_of(segment), {})
            counts[reason] = counts.get(reason, 0) + 1
    return by_model, excluded


def _tail_provider_ms_by_model(analysis: Analysis) -> dict[str, float]:
    """Provider time per model in the tail cohort (every provider segment): splits the layer's excess."""
    out: dict[str, float] = {}
    for rt in analysis.cohort("tail"):
        for segment in rt.segments:
            if segment.layer == PROVIDER and segment.end_ns > segment.start_ns:
                key = model_of(segment)
                out[key] = out.get(key, 0.0) + (segment.end_ns - segment.start_ns) / NS_PER_MS
    return out


def _tail_above_floor_and_prompt(
    analysis: Analysis, calls: Sequence[_Call], fit: FloorFit, evidence: dict[str, Any]
) -> float | None:
    """Mean TTFT of this model's calls in tail requests, and how far it lies above floor + prompt."""
    tail = set(analysis.groups.tail)
    tail_calls = [c for c in calls if c.request_index in tail]
    if not tail_calls:
        return None
    mean_ttft = sum(c.ttft_ms for c in tail_calls) / len(tail_calls)
    evidence["tail_calls"] = len(tail_calls)
    evidence["tail_ttft_mean_ms"] = round(mean_ttft, 3)
    prompt_ms = 0.0
    slope = fit.ms_per_1k_input_tokens
    if slope is not None:
        known = [c.input_tokens for c in tail_calls if c.input_tokens is not None]
        if known:
            prompt_ms = slope * sum(known) / len(known) / 1000
            evidence["tail_prompt_part_ms"] = round(prompt_ms, 3)
    above = mean_ttft - fit.floor_ms - prompt_ms
    evidence["tail_ttft_above_floor_and_prompt_ms"] = round(above, 3)
    return above


def _fix(fit: FloorFit, prompt_ms_at_p50: float | None, tokens_p50: Any, above_ms: float | None) -> str:
    floor = fmt_ms(fit.floor_ms)
    parts = []
    if prompt_ms_at_p50 is not None and prompt_ms_at_p50 > fit.floor_ms:
        parts.append(
            f"Trim prompts first: the p50 prompt ({tokens_p50:,.0f} input tokens) costs {fmt_ms(prompt_ms_at_p50)}"
            f" of TTFT, more than the {floor} floor - retrieve fewer chunks, summarise history, drop unused"
            " instructions."
        )
    parts.append(
        f"The {floor} floor is network round trip, provider-side queueing and the prefill minimum: route to a"
        " closer region or endpoint, use dedicated or provisioned throughput, use a smaller or faster model on"
        " latency-critical paths, and keep a stable prompt prefix so prompt caching applies."
    )
    if above_ms is not None and above_ms > fit.floor_ms:
        parts.append(
            f"Tail TTFT ran {fmt_ms(above_ms)} above floor and prompt: provider-side queueing, which provisioned"
            " throughput removes; a TTFT timeout with a hedged second request caps it."
        )
    parts.append("Stream the answer to the user so they see the first token as soon as it exists.")
    return " ".join(parts)
