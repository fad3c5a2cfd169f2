"""A continuous-batching scheduler with vLLM's semantics and metrics, behind the demo provider's engine mode."""

# How it runs (one `Engine.run()` task per provider):
#
# - a running batch of at most `max_running` requests (vLLM's `max_num_seqs`) and a FIFO
#   waiting queue; each step admits waiting requests while the batch has room (and, with a KV
#   budget, while their prompt fits), then takes `step_ms + step_ms_per_running x running`,
#   plus `prefill_ms_per_1k_tokens x tokens / 1000` for every request that starts (or
#   restarts) its prefill in it;
# - at the end of a step every running request gets one output token; a request's first
#   token comes at the end of the step that completes its prefill;
# - with `kv_tokens` a request holds input + generated tokens of KV; when the batch's next
#   step would not fit, the most recently admitted request is preempted (vLLM's recompute
#   preemption): back to the front of the queue, its KV freed, its prefill (input + generated)
#   done again once readmitted; no request is admitted in a step that preempted. A lone
#   request is never preempted and is admitted into an empty batch whatever its size, so a
#   request larger than the budget still runs (alone);
# - the timestamps and histograms are vLLM's: queue = first scheduled - arrival, prefill =
#   first token - first scheduled, decode = last token - first token, inference = last token -
#   first scheduled, e2e = finish - arrival, TTFT = first token - arrival, time per output
#   token = decode / (output tokens - 1), all observed when a request finishes (TTFT at its
#   first token); an aborted request only counts in `vllm:request_success{finished_reason="abort"}`.

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

#: vLLM v1's histogram bounds (vllm/v1/metrics/loggers.py), in seconds.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                 160.0, 640.0, 2560.0)
_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                    960.0, 1920.0, 7680.0)
#: The request-level histograms: vLLM's name, its help, its bounds.
_HISTOGRAMS = {
    "queue": ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _LATENCY_BUCKETS),
    "prefill": ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", _LATENCY_BUCKETS),
    "decode": ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", _LATENCY_BUCKETS),
    "inference": ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", _LATENCY_BUCKETS),
    "e2e": ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _LATENCY_BUCKETS),
    "ttft": ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS),
    "tpot": ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", _TPOT_BUCKETS),
}
FINISHED_REASONS = ("stop", "length", "abort")


class MetricsUnavailable(Exception):
    """`/metrics` cannot be served (prometheus_client is not installed)."""


@dataclass(eq=False)
class EngineRequest:
    """One request in the engine: its size, its vLLM timestamps (loop time), and its progress."""

    input_tokens: int
    output_tokens: int
    #: Reported when all output tokens are out: "stop" or "length".
    finish_reason: str = "stop"
    #: Asked before every step: True when the client has left (the request is then aborted).
    gone: Callable[[], bool] | None = None
    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    generated: int = 0
    preempted: int = 0
    #: stop, length or abort once done; None while waiting or running.
    outcome: str | None = None
    prefilling: bool = False
    _progress: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def kv_tokens(self) -> int:
        return self.input_tokens + self.generated

    async def until(self, tokens: int | None) -> bool:
        """Wait until `tokens` output tokens are out (None: until the request is done); False when it was aborted."""
        while self.outcome is None and (tokens is None or self.generated < tokens):
            self._progress.clear()
            await self._progress.wait()
        return self.outcome != "abort"


class _Metrics:
    """vLLM's Prometheus metrics in a registry of their own."""

    def __init__(self) -> None:
        import prometheus_client as prom

        self.registry = prom.CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        reg = self.registry
        self.running = prom.Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=reg)
        self.waiting = prom.Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=reg)
        self.kv_usage = prom.Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=reg)
        self.preemptions = prom.Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=reg)
        self.prompt_tokens = prom.Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=reg)
        self.generation_tokens = prom.Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=reg)
        self.success = prom.Counter("vllm:request_success", "Count of successfully processed requests.", [*labels, "finished_reason"],
                                    registry=reg)
        self.histograms = {key: prom.Histogram(name, help_text, labels, buckets=buckets, registry=reg)
                           for key, (name, help_text, buckets) in _HISTOGRAMS.items()}
        self._generate = prom.generate_latest
        self.content_type: str = prom.CONTENT_TYPE_LATEST

    def text(self) -> bytes:
        return self._generate(self.registry)

    def relabel(self, old: dict[str, str], new: dict[str, str]) -> None:
        """Drop the series labelled `old` (never recorded into: the label is known before the first request) and make `new`'s."""
        plain: list[Any] = [self.running, self.waiting, self.kv_usage, self.preemptions, self.prompt_tokens, self.generation_tokens,
                            *self.histograms.values()]
        for metric in plain:
            if old:
                metric.remove(*old.values())
            metric.labels(**new)
        for reason in FINISHED_REASONS:
            if old:
                self.success.remove(*old.values(), reason)
            self.success.labels(**new, finished_reason=reason)


def _metrics_or_reason() -> tuple[_Metrics | None, str]:
    try:
        return _Metrics(), ""
    except ImportError:
        return None, "the engine's /metrics needs prometheus_client: pip install 'latprof[demo]'"


class Engine:
    """The scheduler: `submit()` requests, `run()` it as a task, read `metrics_text()`."""

    def __init__(self, max_running: int, *, kv_tokens: int = 0, step_ms: float = 10.0, step_ms_per_running: float = 0.0,
                 prefill_ms_per_1k_tokens: float = 0.0, model_name: str = "") -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, not {max_running!r}")
        self.max_running = max_running
        self.kv_tokens = kv_tokens
        self.step_ms = step_ms
        self.step_ms_per_running = step_ms_per_running
        self.prefill_ms_per_1k_tokens = prefill_ms_per_1k_tokens
        #: The `model_name` label; "" takes the model of the first request submitted.
        self.model_name = model_name
        self.running: list[EngineRequest] = []  # in order of admission
        self.waiting: deque[EngineRequest] = deque()
        self.preemptions = 0
        self.steps = 0
        self.crashes = 0  # steps that raised (their requests were aborted)
        self._wake = asyncio.Event()
        self._metrics, self.metrics_unavailable = _metrics_or_reason()
        self._exposed: dict[str, str] = {}

    # --- what the provider calls -----------------------------------------------------------------

    def submit(self, input_tokens: int, output_tokens: int, *, model: str = "", finish_reason: str = "stop",
               gone: Callable[[], bool] | None = None) -> EngineRequest:
        """Queue a request (arriving now) for `output_tokens` tokens."""
        if not self.model_name:
            self.model_name = model or "latprof-demo-1"
        request = EngineRequest(max(1, input_tokens), max(0, output_tokens), "length" if finish_reason == "length" else "stop", gone)
        request.arrival = asyncio.get_running_loop().time()
        self.waiting.append(request)
        self._wake.set()
        return request

    def abort(self, request: EngineRequest) -> None:
        """Free a request that is not done yet (a client that left); nothing for one that is done."""
        if request.outcome is not None:
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.outcome = "abort"
        request.finished = asyncio.get_running_loop().time()
        self._count("success", finished_reason="abort")
        request._progress.set()

    @property
    def kv_usage(self) -> float:
        """Share of the KV budget in use (0..1; 0 without a budget)."""
        if not self.kv_tokens:
            return 0.0
        return min(1.0, sum(r.kv_tokens for r in self.running) / self.kv_tokens)

    @property
    def content_type(self) -> str:
        return self._metrics.content_type if self._metrics is not None else "text/plain; charset=utf-8"

    def metrics_text(self) -> bytes:
        """The Prometheus exposition of the metrics; MetricsUnavailable without prometheus_client."""
        if self._metrics is None:
            raise MetricsUnavailable(self.metrics_unavailable)
        metrics, labels = self._metrics, self._labels()
        if labels != self._exposed:  # every metric exposed from the start, at 0, as vLLM does; under the first request's model once known
            metrics.relabel(self._exposed, labels)
            self._exposed = labels
        metrics.running.labels(**labels).set(len(self.running))
        metrics.waiting.labels(**labels).set(len(self.waiting))
        metrics.kv_usage.labels(**labels).set(self.kv_usage)
        return metrics.text()

    # --- the scheduler ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Step forever (cancel the task to stop)."""
        loop = asyncio.get_running_loop()
        while True:
            for request in [r for r in (*self.running, *self.waiting) if r.gone is not None and r.gone()]:
                self.abort(request)
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                prefill = self.schedule(loop.time())
                await asyncio.sleep(self.step_seconds(prefill))
                self.finish_step(loop.time())
            except Exception:  # a bug here must not leave every client waiting forever: abort what is in flight
                self.crashes += 1
                for request in (*self.running, *self.waiting):
                    self.abort(request)

    def step_seconds(self, prefill_tokens: int) -> float:
        """How long the next step takes with the running batch as it is and `prefill_tokens` to prefill."""
        running_ms = self.step_ms + self.step_ms_per_running * len(self.running)
        return (running_ms + self.prefill_ms_per_1k_tokens * prefill_tokens / 1000) / 1000

    def schedule(self, now: float) -> int:
        """Preempt what no longer fits, admit what does; the tokens to prefill in this step."""
        preempted = False
        if self.kv_tokens:
            while len(self.running) > 1 and sum(r.kv_tokens + 1 for r in self.running) > self.kv_tokens:
                victim = self.running.pop()
                victim.prefilling = False
                victim.preempted += 1
                self.waiting.appendleft(victim)
                self.preemptions += 1
                self._count("preemptions")
                preempted = True
        if not preempted:
            used = sum(r.kv_tokens + 1 for r in self.running)
            while self.waiting and len(self.running) < self.max_running:
                head = self.waiting[0]
                if self.kv_tokens and self.running and used + head.kv_tokens + 1 > self.kv_tokens:
                    break
                self.waiting.popleft()
                self.running.append(head)
                head.prefilling = True
                if head.first_scheduled is None:
                    head.first_scheduled = now
                used += head.kv_tokens + 1
        return sum(r.kv_tokens for r in self.running if r.prefilling)

    def finish_step(self, now: float) -> None:
        """The end of a step: one token for every running request, and the finished ones leave."""
        self.steps += 1
        for request in list(self.running):
            first = request.prefilling
            request.prefilling = False
            if request.output_tokens:
                request.generated += 1
                request.last_token = now
                self._count("generation_tokens")
                if request.first_token is None:
                    request.first_token = now
                    self._observe("ttft", now - request.arrival)
                    self._count("prompt_tokens", request.input_tokens)
            elif first:  # nothing to generate: done once its prompt is in
                request.first_token = request.last_token = now
            if request.generated >= request.output_tokens:
                self._finish(request, now)
            request._progress.set()

    def _finish(self, request: EngineRequest, now: float) -> None:
        self.running.remove(request)
        request.outcome = request.finish_reason
        request.finished = now
        self._count("success", finished_reason=request.outcome)
        scheduled, first, last = request.first_scheduled, request.first_token, request.last_token
        assert scheduled is not None and first is not None and last is not None
        self._observe("queue", scheduled - request.arrival)
        self._observe("prefill", first - scheduled)
        self._observe("decode", last - first)
        self._observe("inference", last - scheduled)
        self._observe("e2e", now - request.arrival)
        if request.generated > 1:
            self._observe("tpot", (last - first) / (request.generated - 1))

    # --- metrics -----------------------------------------------------------------------------------

    def _labels(self) -> dict[str, str]:
        return {"model_name": self.model_name or "latprof-demo-1", "engine": "0"}

    def _count(self, name: str, amount: float = 1, **extra: str) -> None:
        if self._metrics is not None:
            counter: Any = getattr(self._metrics, name)
            counter.labels(**self._labels(), **extra).inc(amount)

    def _observe(self, name: str, seconds: float) -> None:
        if self._metrics is not None:
            self._metrics.histograms[name].labels(**self._labels()).observe(max(0.0, seconds))
