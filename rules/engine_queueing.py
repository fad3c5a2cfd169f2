"""Rule engine-queueing: a self-hosted engine's scheduler queue owns the tail, not the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from latprof.analysis.engine import INFERRED_FROM, EngineView, DEFAULT_LIMITS, QueueLimits, engine_views, judge_queue
from latprof.analysis.inference import INFERRED_CONFIDENCE
from latprof.analysis.requests import Analysis
from latprof.engine import Finding, Rule, fmt_ms, owns_tail, severity_for_share
from latprof.layers import PROVIDER


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0
    #: Around the tail's LLM calls (from a second before each to a second after its first token), at
    #: least this many requests waited in the engine's queue at its fullest, on average ...
    min_waiting_requests: float = DEFAULT_LIMITS.min_waiting_requests
    #: ... and, where the engine times its stages, at least this share of the tail's extra time before
    #: the first token inside the engine (queue and prefill, over the median's calls) is its queue.
    min_queue_share: float = DEFAULT_LIMITS.min_queue_share
    #: The running batch is at its cap when it ran at this share of its peak during the tail's calls.
    flat_running_share_of_peak: float = DEFAULT_LIMITS.flat_running_share_of_peak
    #: The KV cache counts as full from this share in use.
    kv_cache_full: float = DEFAULT_LIMITS.kv_cache_full


_Thresholds = Thresholds


class EngineQueueing(Rule):
    """A self-hosted engine's scheduler queue owns the tail: add capacity or cap concurrency, not a new model.

    What it detects:
        The `provider` layer owns the tail, and the inference engine's own Prometheus metrics
        (recorded with `--engine-metrics URL`: vLLM, SGLang, TGI, llama.cpp's server) show why:
        while the tail's LLM calls waited for their first token, requests queued in the
        engine's scheduler (its `waiting` gauge) while its running batch stayed at its cap, and
        where the engine times each request's stages, the tail's requests spent their extra
        time in the engine's queue, not in prefill or decode. A full KV cache and preemptions
        (requests evicted from the batch and recomputed) are named when they happen.

    Why it matters for p99:
        A GPU dashboard can read 60% while the engine's queue grows and time to first token
        reaches seconds: the batch is capped by `max_num_seqs` or by KV-cache memory, not by
        compute. Every request beyond the cap waits for a slot, and a burst makes the last ones
        wait for several whole generations. A smaller prompt or another model does not move a
        queue; capacity or admission does.

    Evidence:
        The engine, its endpoint and model, and how the tail's calls were matched to it; for
        the tail's and the median's LLM calls: requests waiting and running, KV-cache use,
        preemptions, and the mean time per request in the engine's queue, prefill and decode
        (`tail`, `median`); the peaks of the capture; the provider layer's tail excess and the
        part of it the engine's queue explains. Always `inferred: true`: the engine's metrics
        name no request, they are lined up with the calls by time.

    How to fix:
        Add capacity (replicas behind a load balancer that routes by queue length), or cap
        concurrency in front of the engine (a gateway or client-side semaphore at what the
        batch serves) so excess requests wait where they can be shed or routed elsewhere. With
        a full KV cache or preemptions: lower `max_num_seqs` or `max_model_len`, enable prefix
        caching for shared prompt prefixes, or give the model more memory (tensor parallelism,
        a quantised KV cache). Raising `max_num_seqs` helps only when the KV cache has room.

    Example:
        A vLLM server with `max_num_seqs=8` serves a chat API. Under a burst, 30 requests wait
        in its scheduler, `vllm:num_requests_running` stays at 8 and the KV cache at 97%;
        TTFT p99 reaches 6 s while prefill stays at 80 ms. The engine's queue time explains
        90% of the provider layer's tail excess: a second replica, not a smaller model.
    """

    id = "engine-queueing"
    layer = PROVIDER
    Thresholds = Thresholds

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(PROVIDER)
        if not stats.seen or not owns_tail(analysis, stats, min_share=t.min_share_of_tail_excess, min_excess_ms=t.min_tail_excess_ms):
            return
        for view in engine_views(analysis):
            finding = self._judge(analysis, view, t)
            if finding is not None:
                yield finding

    def _judge(self, analysis: Analysis, view: EngineView, t: _Thresholds) -> Finding | None:
        tail, median = view.tail, view.median
        provider_excess = analysis.layer(PROVIDER).tail_excess_ms
        judged = judge_queue(view, provider_excess, QueueLimits(t.min_waiting_requests, t.min_queue_share,
                                                                t.flat_running_share_of_peak, t.kv_cache_full))  # fmt: skip
        if judged is None:
            return None
        impact, share_of_stages = judged.impact_ms, judged.queue_share
        at_cap, kv_full, preempted = judged.at_cap, judged.kv_full, judged.preempted
        share = impact / analysis.tail_excess_ms if analysis.tail_excess_ms > 0 else 0.0
        evidence: dict[str, Any] = {
            "inferred": True,
            "inferred_from": INFERRED_FROM,
            "engine": view.instance.engine,
            "endpoint": view.instance.endpoint,
            "model": view.instance.model or None,
            "matched_by": view.matched_by,
            "provider_tail_excess_ms": round(provider_excess, 3),
            "queue_share_of_engine_excess": None if share_of_stages is None else round(share_of_stages, 4),
            "tail": tail.to_dict(),
            "median": median.to_dict(),
            "peak_waiting": view.peak_waiting,
            "peak_running": view.peak_running,
            "running_at_cap": at_cap,
            "peak_kv_cache_usage": None if view.peak_kv_cache_usage is None else round(view.peak_kv_cache_usage, 4),
            "preemptions": round(view.preemptions_total, 3),
        }
        stages = tail.stages_ms
        split = ", ".join(f"{stage} {fmt_ms(stages[stage])}" for stage in ("queue", "prefill", "decode") if stage in stages)
        summary = (
            f"Inferred from the engine's metrics: the tail's LLM calls waited in the scheduler queue of {view.label}"
            f" (up to {tail.waiting_peak:.1f} requests waiting around them, on average"
            + (f"; {median.waiting_peak:.1f} around the median request's" if median.waiting_peak is not None else "")
            + (f"; running batch at {tail.running:.0f} of a peak {view.peak_running:.0f}" if at_cap and tail.running is not None
               and view.peak_running is not None else "")  # fmt: skip
            + (f"; KV cache up to {tail.kv_cache_usage_max:.0%}" if kv_full and tail.kv_cache_usage_max is not None else "")
            + (f"; {view.preemptions_total:.0f} preemptions" if preempted else "")
            + ")"
            + (f". Inside the engine, the tail's requests took {split} (median's queue"
               f" {fmt_ms(median.stages_ms.get('queue', 0.0))})" if split else "")  # fmt: skip
            + f": the engine's queue explains {fmt_ms(impact)} of the tail, not the model."
        )
        fixes = []
        if kv_full or preempted:
            fixes.append("The KV cache is full: requests wait for cache blocks and preempted ones are computed again."
                         " Lower `max_num_seqs` or `max_model_len`, enable prefix caching for shared prompt prefixes,"
                         " or give the model more memory (tensor parallelism, a quantised KV cache), or more replicas.")  # fmt: skip
        if at_cap:
            fixes.append("The running batch is at its cap: add capacity (replicas, routed by queue length), or cap"
                         " concurrency in front of the engine at what its batch serves so excess requests wait where"
                         " they can be shed or routed; raise `max_num_seqs` only if the KV cache has room.")  # fmt: skip
        fixes.append("Changing the model or the prompt does not move a queue.")
        return self.finding(
            severity=severity_for_share(share),
            confidence=round(min(1.0, 0.4 + share) * INFERRED_CONFIDENCE, 4),
            impact_ms=impact,
            summary=summary,
            evidence=evidence,
            fix=" ".join(fixes),
            subject=f"{view.instance.engine}:{view.instance.endpoint}:{view.instance.model}",
        )
