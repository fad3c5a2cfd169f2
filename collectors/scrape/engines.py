"""Which Prometheus families of vLLM, SGLang, TGI and llama.cpp's server hold each measure latprof records.

A table, no I/O. `--engine-metrics URL` scrapes an engine's `/metrics` once a second and parses it with
`prometheus_client.parser.text_string_to_metric_families`; this module says which engine that page came
from (`detect`) and, per measure, which family to read (`Engine.metric_for`) and how to scale it.

Family names are the parser's: a counter family drops `_total` (family `vllm:num_preemptions`, sample
`vllm:num_preemptions_total`); a histogram family's samples are `<family>_bucket`, `_sum` and `_count`;
a family without a `# TYPE` line comes back typed `unknown` under its full sample name, and an `unknown`
family matches any kind (an untyped counter shows as `<family>_total` and so is not matched).

Names changed between engine versions, so a measure may have several `EngineMetric`s: the first one
present in a scrape wins. A measure is listed only where the engine publishes it with latprof's
meaning (`MEASURES`); the evidence (repository, path, commit) is in the comment above each engine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

GAUGE = "gauge"
COUNTER = "counter"
HISTOGRAM = "histogram"
UNKNOWN = "unknown"

#: What latprof records from an engine. Gauges: `waiting` (requests in the engine's scheduler queue),
#: `running` (requests in the running batch), `kv_cache_usage` (share 0..1 of the KV cache in use).
#: Counters, recorded as the delta since the previous scrape: `preemptions`, `finished` (requests
#: finished, any reason). Per-request histograms in ms, recorded as sum/count deltas: `queue` (arrival
#: to first scheduled), `prefill` (scheduled to first token), `decode` (first to last token),
#: `inference` (scheduled to last token), `ttft`, `e2e`.
MEASURES: tuple[str, ...] = (
    "waiting",
    "running",
    "kv_cache_usage",
    "preemptions",
    "finished",
    "queue",
    "prefill",
    "decode",
    "inference",
    "ttft",
    "e2e",
)

_SECONDS_TO_MS = 1000.0


@dataclass(frozen=True, slots=True)
class EngineMetric:
    """One engine family that holds one measure, and the factor from the engine's unit to latprof's."""

    family: str  # the family name as prometheus_client's parser reports it (counters without _total)
    kind: str  # "gauge" | "counter" | "histogram"
    measure: str  # one of MEASURES
    scale: float = 1.0  # engine value * scale = latprof's unit (seconds -> ms: 1000; a 0-100 percent -> 0.01)

    def present_in(self, families: Mapping[str, str]) -> bool:
        """Whether a scrape (family name -> type) holds this family with a compatible type."""
        return families.get(self.family) in (self.kind, UNKNOWN)


@dataclass(frozen=True, slots=True)
class Engine:
    """An inference engine: how to recognise its page and where each measure it publishes lives."""

    name: str  # "vllm", "sglang", "tgi", "llamacpp"
    title: str  # "vLLM", "SGLang", "TGI", "llama.cpp server"
    prefixes: tuple[str, ...]  # family-name prefixes that identify it
    metrics: tuple[EngineMetric, ...]  # alternatives for one measure across versions: the first present wins
    model_label: str | None  # the label naming the model, if the engine sets one

    def metric_for(self, measure: str, families: Mapping[str, str]) -> EngineMetric | None:
        """The first listed family for `measure` that `families` (name -> type of one scrape) holds."""
        for metric in self.metrics:
            if metric.measure == measure and metric.present_in(families):
                return metric
        return None

    def measures(self) -> list[str]:
        """The measures this engine can publish (those it has a mapping for), in `MEASURES` order."""
        mapped = {metric.measure for metric in self.metrics}
        return [measure for measure in MEASURES if measure in mapped]

    def missing(self, families: Mapping[str, str]) -> list[str]:
        """Measures this engine can publish but this scrape lacks (an older version, a feature off)."""
        return [measure for measure in self.measures() if self.metric_for(measure, families) is None]

    def owns(self, family: str) -> bool:
        """Whether a family name carries one of this engine's prefixes."""
        return family.startswith(self.prefixes)


# vLLM. v1 engine: vllm-project/vllm vllm/v1/metrics/loggers.py @ 005a810bc40faa25b8870fbc8559c3462581eee3
# (PrometheusStatLogger; labels model_name, engine). v0 engine: vllm/engine/metrics.py
# @ f0afa0c28a3160de7a2ece6eeda2afc8abba8b39 (labels model_name). Both pass names to prometheus_client,
# so `vllm:num_preemptions_total` (v0) and `vllm:num_preemptions` (v1) are the same family
# `vllm:num_preemptions`, and likewise `vllm:request_success`. `vllm:gpu_cache_usage_perc` (v0, and v1
# until its deprecation in 0.9) became `vllm:kv_cache_usage_perc`; both are a 0..1 fraction despite
# `perc` ("1 means 100 percent usage"), so scale 1. `vllm:request_success` is split by `finished_reason`
# (stop, length, abort): the scraper sums it over that label. The interval histograms
# (request_queue/prefill/decode/inference_time_seconds) define latprof's own `queue`, `prefill`,
# `decode`, `inference` (docs/design/metrics.md: QUEUED -> SCHEDULED -> first NEW_TOKENS -> last).
VLLM = Engine(
    name="vllm",
    title="vLLM",
    prefixes=("vllm:",),
    metrics=(
        EngineMetric("vllm:num_requests_waiting", GAUGE, "waiting"),
        EngineMetric("vllm:num_requests_running", GAUGE, "running"),
        EngineMetric("vllm:kv_cache_usage_perc", GAUGE, "kv_cache_usage"),
        EngineMetric("vllm:gpu_cache_usage_perc", GAUGE, "kv_cache_usage"),
        EngineMetric("vllm:num_preemptions", COUNTER, "preemptions"),
        EngineMetric("vllm:request_success", COUNTER, "finished"),  # summed over finished_reason
        EngineMetric("vllm:request_queue_time_seconds", HISTOGRAM, "queue", _SECONDS_TO_MS),
        EngineMetric("vllm:request_prefill_time_seconds", HISTOGRAM, "prefill", _SECONDS_TO_MS),
        EngineMetric("vllm:request_decode_time_seconds", HISTOGRAM, "decode", _SECONDS_TO_MS),
        EngineMetric("vllm:request_inference_time_seconds", HISTOGRAM, "inference", _SECONDS_TO_MS),
        EngineMetric("vllm:time_to_first_token_seconds", HISTOGRAM, "ttft", _SECONDS_TO_MS),
        EngineMetric("vllm:e2e_request_latency_seconds", HISTOGRAM, "e2e", _SECONDS_TO_MS),
    ),
    model_label="model_name",
)

# SGLang: sgl-project/sglang python/sglang/srt/metrics/collector.py @ 00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538.
# `sglang:num_queue_reqs` is "The number of requests in the waiting queue" (the scheduler's waiting
# queue; grammar and disaggregation queues have their own gauges). `sglang:token_usage` is the used
# share (0..1) of the KV-cache token pool (num_used_tokens / max_total_num_tokens). A retraction is
# SGLang's preemption (a running request sent back to the queue when the KV cache runs out); the
# counter `sglang:num_retracted_requests_total` is recent, the older `sglang:num_retracted_reqs` is a
# gauge of the last interval and is not mapped. `sglang:num_requests_total` is incremented once per
# finished request (TokenizerMetricsCollector.observe_one_finished_request). `sglang:queue_time_seconds`
# is wait-queue entry to forward entry. SGLang publishes no per-request prefill/decode/inference
# histogram with latprof's meaning (`per_stage_req_latency_seconds` is split by a `stage` label).
SGLANG = Engine(
    name="sglang",
    title="SGLang",
    prefixes=("sglang:",),
    metrics=(
        EngineMetric("sglang:num_queue_reqs", GAUGE, "waiting"),
        EngineMetric("sglang:num_running_reqs", GAUGE, "running"),
        EngineMetric("sglang:token_usage", GAUGE, "kv_cache_usage"),
        EngineMetric("sglang:num_retracted_requests", COUNTER, "preemptions"),
        EngineMetric("sglang:num_requests", COUNTER, "finished"),
        EngineMetric("sglang:queue_time_seconds", HISTOGRAM, "queue", _SECONDS_TO_MS),
        EngineMetric("sglang:time_to_first_token_seconds", HISTOGRAM, "ttft", _SECONDS_TO_MS),
        EngineMetric("sglang:e2e_request_latency_seconds", HISTOGRAM, "e2e", _SECONDS_TO_MS),
    ),
    model_label="model_name",
)

# TGI (HuggingFace text-generation-inference): router/src/server.rs (describe_* calls; every `*duration`
# histogram gets 35 buckets, 0.00015 s upward, in seconds) and the list in docs/source/reference/metrics.md
# @ 53fdbe617d4f3cc358842ad96914393ad6b6e4ca; the gauges are set in the batching loop
# (backends/v3/src/backend.rs `tgi_batch_current_size`) and the queue (`tgi_queue_size`). Rendered by
# metrics-exporter-prometheus: no labels naming the model, counters without `_total` (the parser still
# reports family `tgi_request_success`). `tgi_request_success` counts successful requests only (failures
# go to `tgi_request_failure{err}`). `tgi_request_queue_duration` is queued to batched;
# `tgi_request_inference_duration` batched to last token; `tgi_request_duration` includes validation.
# No KV-cache, preemption, TTFT or per-phase (prefill/decode) request metric.
TGI = Engine(
    name="tgi",
    title="TGI",
    prefixes=("tgi_",),
    metrics=(
        EngineMetric("tgi_queue_size", GAUGE, "waiting"),
        EngineMetric("tgi_batch_current_size", GAUGE, "running"),
        EngineMetric("tgi_request_success", COUNTER, "finished"),
        EngineMetric("tgi_request_queue_duration", HISTOGRAM, "queue", _SECONDS_TO_MS),
        EngineMetric("tgi_request_inference_duration", HISTOGRAM, "inference", _SECONDS_TO_MS),
        EngineMetric("tgi_request_duration", HISTOGRAM, "e2e", _SECONDS_TO_MS),
    ),
    model_label=None,
)

# llama.cpp server (`--metrics`): ggml-org/llama.cpp tools/server/server.cpp, `server_routes::get_metrics`
# (late-2025 layout), and the older examples/server/server.cpp @ 61e588abcc3e418681e9528b46d61f5b23225fe2
# (`handle_metrics`). `llamacpp:requests_processing` counts slots processing a task (the running batch);
# `llamacpp:requests_deferred` counts tasks deferred for want of a free slot (the queue).
# `llamacpp:kv_cache_usage_ratio` (used KV cells / n_ctx, 0..1) exists in the older handler only; the
# tools/server handler no longer publishes it. Plain gauges and counters only: no labels, no histograms,
# no per-request latency, no finished or preemption counter.
LLAMACPP = Engine(
    name="llamacpp",
    title="llama.cpp server",
    prefixes=("llamacpp:",),
    metrics=(
        EngineMetric("llamacpp:requests_deferred", GAUGE, "waiting"),
        EngineMetric("llamacpp:requests_processing", GAUGE, "running"),
        EngineMetric("llamacpp:kv_cache_usage_ratio", GAUGE, "kv_cache_usage"),
    ),
    model_label=None,
)

ENGINES: tuple[Engine, ...] = (VLLM, SGLANG, TGI, LLAMACPP)


def detect(family_names: Iterable[str]) -> Engine | None:
    """The engine whose prefix most family names carry (the first listed on a tie); None when none does."""
    counts: Counter[str] = Counter()
    for family in family_names:
        for engine in ENGINES:
            if engine.owns(family):
                counts[engine.name] += 1
    best: Engine | None = None
    for engine in ENGINES:
        if counts[engine.name] and (best is None or counts[engine.name] > counts[best.name]):
            best = engine
    return best
