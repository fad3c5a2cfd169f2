"""Rule provider-floor: the part of time to first token that no prompt change moves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from latprof.analysis.prompts import PromptLine, PromptPart, TtftCall, fit_prompt_line, prompt_part, tail_provider_ms_by_model, ttft_calls
from latprof.analysis.engine import engine_queue_ms
from latprof.analysis.network import NetCall, net_calls, tail_setup_excess_ms
from latprof.analysis.requests import Analysis, LayerStats, percentile
from latprof.engine import Finding, Rule, fmt_ms, owns_tail, severity_for_share
from latprof.layers import LAYERS, PROVIDER


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
    #: The summary says how much of the tail's extra TTFT longer prompts explain from this share on.
    min_prompt_share_to_say: float = 0.5


@dataclass(frozen=True, slots=True)
class FloorFit:
    """TTFT of one model split into a floor and a part that grows with the prompt."""

    floor_ms: float
    ms_per_1k_input_tokens: float | None  # None: input tokens missing or too uniform to fit
    r_squared: float | None  # of the Theil-Sen line over every fitted call (spikes lower it)
    intercept_ms: float | None  # the Theil-Sen line at 0 tokens: a typical, not a minimal, TTFT
    fitted_calls: int
    robust_r_squared: float | None = None  # 1 - (MAD of residuals / MAD of TTFT)^2: the fit of the bulk


class ProviderFloor(Rule):
    """TTFT floor vs input tokens: the part no prompt change fixes.

    What it detects:
        Time to first token (the `provider` layer of streamed LLM calls) split into a floor
        that every call pays - network round trip, provider-side queueing, the prefill
        minimum - and a part that grows with the prompt. Per model, TTFT is fitted against
        input tokens with the Theil-Sen line (the median of the slopes between every two
        calls, which provider-side queueing spikes do not tilt); the slope is the cost of 1k
        more input tokens, and the floor is the 5th percentile of TTFT with that prompt part
        taken out (with no usable token counts: the 5th percentile of TTFT). Reported when
        the provider owns the tail, or when it is a large share of a typical request and the
        floor is long.

    Why it matters for p99:
        When the provider owns the tail, the first question is what a change on your side
        can move. Trimming prompts only moves the slope part; the floor stays whatever you
        do to the prompt, and TTFT in the tail above floor and prompt is provider-side
        queueing. Knowing the split stops weeks of prompt tuning that cannot reach the p99,
        and points at the fixes that can: where and how the model is served.

    Evidence:
        floor_ms and ms_per_1k_input_tokens, with the line's intercept_ms, r_squared (the
        share of TTFT's variance it explains, spikes included) and robust_r_squared (1 - (MAD
        of residuals / MAD of TTFT)^2: its fit to the bulk); TTFT p5/p50/p99, the number of
        streamed calls used, input tokens p50/p99, the floor's share of TTFT p50 and p99, the
        mean TTFT of tail requests, the prompt's part of it (ms and share), its connection
        set-up where the HTTP client measured it (`tail_connection_setup_ms`, left to the
        connection-setup rule: not counted as queueing, nor in this finding's impact) and how
        much lies above floor, prompt and set-up; the tail calls' extra TTFT over the median requests' calls
        and the part of it longer prompts explain (ms and share); and the calls left out:
        non-streamed calls (no TTFT, `ttft_known: false`), estimated segments and
        attach-mode LLM time whose TTFT/decode split is unknown.

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
        calls, excluded = ttft_calls(analysis)
        if not calls:
            return
        tail_weights = tail_provider_ms_by_model(analysis)
        tail_total_ms = sum(tail_weights.values())
        # Connection set-up the HTTP client measured (every model's calls): read once.
        timed = net_calls(analysis)
        setup = (_tail_setup_per_call(analysis, timed), tail_setup_excess_ms(analysis, timed) if tail_owned else 0.0)
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
                setup=setup,
            )

    def _finding(
        self,
        analysis: Analysis,
        stats: LayerStats,
        model: str,
        calls: Sequence[TtftCall],
        fit: FloorFit,
        excluded: Mapping[str, int],
        tail_owned: bool,
        median_share: float,
        weight: float,
        *,
        several_models: bool,
        setup: tuple[float, float],
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
        if fit.robust_r_squared is not None:
            evidence["robust_r_squared"] = round(fit.robust_r_squared, 4)
        if slope is not None:
            evidence["fitted_calls"] = fit.fitted_calls
        if fit.intercept_ms is not None:
            evidence["intercept_ms"] = round(fit.intercept_ms, 3)
        prompt_ms_at_p50: float | None = None
        if tokens:
            evidence["input_tokens_p50"] = round(percentile(tokens, 50), 1)
            evidence["input_tokens_p99"] = round(percentile(tokens, 99), 1)
            if slope is not None:
                prompt_ms_at_p50 = slope * percentile(tokens, 50) / 1000
                evidence["prompt_part_at_p50_input_ms"] = round(prompt_ms_at_p50, 3)
        above_ms, part = _tail_above_floor_and_prompt(analysis, calls, fit, evidence)
        # Connection set-up the HTTP client measured sits inside TTFT: it is no provider-side
        # queueing, and the part of the tail excess it explains is connection-setup's to name.
        setup_ms = setup[0]  # a tail call's mean set-up, and the tail excess it explains (`tail_setup_excess_ms`)
        if setup_ms and above_ms is not None:
            evidence["tail_connection_setup_ms"] = round(setup_ms, 3)
            above_ms -= setup_ms
            evidence["tail_ttft_above_floor_and_prompt_ms"] = round(above_ms, 3)
        setup_excess_ms = setup[1] * weight if tail_owned else 0.0
        # a self-hosted engine's queue, seen in its own metrics, is rule engine-queueing's
        engine_ms = min(engine_queue_ms(analysis, model), stats.tail_excess_ms * weight) if tail_owned else 0.0
        if engine_ms:
            evidence["tail_engine_queue_ms"] = round(engine_ms, 3)

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
            if part is not None and part.excess_ms > 0 and part.excess_share_from_prompt >= self.thresholds.min_prompt_share_to_say:
                summary += (
                    f"; longer prompts explain {part.excess_share_from_prompt:.0%} of the tail's extra TTFT"
                    f" ({fmt_ms(part.excess_from_prompt_ms)} of {fmt_ms(part.excess_ms)} per call)"
                )
            if setup_ms:
                summary += f"; {fmt_ms(setup_ms)} of the tail's TTFT was opening connections (connection-setup)"
            if engine_ms:
                summary += f"; {fmt_ms(engine_ms)} of the tail's excess was the engine's own queue (engine-queueing)"
            # (a few ms above them is the fit's noise, not queueing: said from a tenth of the tail's TTFT)
            if above_ms is not None and above_ms > 0 and above_ms >= 0.1 * evidence.get("tail_ttft_mean_ms", 0.0):
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

        confidence = 0.5 + 0.3 * min(1.0, len(calls) / 100) + 0.2 * (fit.robust_r_squared or 0.0)
        if tail_owned:
            confidence = min(confidence, 0.5 + model_share / 2)
        return self.finding(
            severity=severity,
            confidence=confidence,
            impact_ms=max(0.0, stats.tail_excess_ms * weight - setup_excess_ms - engine_ms),
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

    Calls with a token count are fitted with the Theil-Sen line of TTFT against input tokens
    (`latprof.analysis.prompts.fit_prompt_line`: the median of the pairwise slopes, robust to
    provider-side queueing spikes without trimming any call; a negative slope is clamped to 0)
    when there are at least 3 of them with at least 3 distinct counts spread by
    `min_input_token_spread` (p95 - p5). The floor is the `floor_percentile` of
    TTFT - slope * tokens / 1000 over the fitted calls (a floor, not the intercept, which is a
    typical TTFT and carries the median provider queueing). Without a fit the floor is that
    percentile of every TTFT. Never below 0.
    """
    if not ttfts_ms:
        raise ValueError("fit_floor of no calls")
    line = fit_prompt_line(ttfts_ms, input_tokens, min_input_token_spread=min_input_token_spread)
    if line is None:
        floor = percentile(sorted(ttfts_ms), floor_percentile)
        return FloorFit(max(0.0, floor), None, None, None, len(ttfts_ms))
    slope = line.ms_per_1k_input_tokens
    adjusted = sorted(t - slope * n / 1000 for t, n in zip(ttfts_ms, input_tokens) if n is not None)
    floor = percentile(adjusted, floor_percentile)
    return FloorFit(max(0.0, floor), slope, line.r_squared, line.intercept_ms, line.calls, line.robust_r_squared)


def _tail_above_floor_and_prompt(
    analysis: Analysis, calls: Sequence[TtftCall], fit: FloorFit, evidence: dict[str, Any]
) -> tuple[float | None, PromptPart | None]:
    """Mean TTFT of this model's calls in tail requests, how far it lies above floor + prompt,
    and the part of it (and of its excess over the median requests' calls) the prompt explains."""
    slope = fit.ms_per_1k_input_tokens
    tail = set(analysis.groups.tail)
    tail_calls = [c for c in calls if c.request_index in tail]
    if not tail_calls:
        return None, None
    mean_ttft = sum(c.ttft_ms for c in tail_calls) / len(tail_calls)
    evidence["tail_calls"] = len(tail_calls)
    evidence["tail_ttft_mean_ms"] = round(mean_ttft, 3)
    prompt_ms = 0.0
    part: PromptPart | None = None
    if slope is not None:
        known = [c.input_tokens for c in tail_calls if c.input_tokens is not None]
        if known:
            prompt_ms = slope * sum(known) / len(known) / 1000
            evidence["tail_prompt_part_ms"] = round(prompt_ms, 3)
            evidence["tail_prompt_share_of_ttft"] = round(prompt_ms / mean_ttft, 4) if mean_ttft > 0 else None
        line = PromptLine(slope, fit.intercept_ms or 0.0, fit.r_squared, fit.robust_r_squared, fit.fitted_calls)
        part = prompt_part(analysis, calls, {calls[0].model: line}, per_request=False)
    if part is not None and part.median_ttft_ms > 0:
        evidence["median_ttft_mean_ms"] = round(part.median_ttft_ms, 3)
        evidence["tail_ttft_excess_ms"] = round(part.excess_ms, 3)
        evidence["tail_excess_from_prompt_ms"] = round(part.excess_from_prompt_ms, 3)
        evidence["tail_excess_share_from_prompt"] = round(part.excess_share_from_prompt, 4)
    above = mean_ttft - fit.floor_ms - prompt_ms
    evidence["tail_ttft_above_floor_and_prompt_ms"] = round(above, 3)
    return above, part


def _tail_setup_per_call(analysis: Analysis, timed: Sequence[NetCall]) -> float:
    """Mean connection set-up (DNS, connect, TLS) of the tail requests' calls among `timed` (`net_calls`); 0 without."""
    tail = set(analysis.groups.tail)
    setups = [c.setup_ms for c in timed if c.request_index in tail]
    return sum(setups) / len(setups) if setups else 0.0


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
