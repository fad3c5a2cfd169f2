"""The faults `latprof demo` can show: how the provider answers, how the service behaves, the load.

Each scenario is decisive on a loaded 2-core machine within ~10-20 s of load: the fault owns
the tail by a wide margin, and every other layer stays flat.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from latprof.errors import ConfigError

DEFAULT_SCENARIO = "pool-held-across-llm"


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    #: The verdict layer the demo should end with (None: no layer owns the tail).
    expected_layer: str | None
    #: Requests per second, Poisson arrivals (open loop).
    rate_rps: float
    #: `latprof.demo.provider.ProviderConfig` settings.
    provider: dict[str, Any] = field(default_factory=dict)
    #: Service settings, passed as LATPROF_DEMO_* environment variables.
    pool_size: int = 5
    threadpool_tokens: int = 40
    #: The service's route the load calls.
    path: str = "/chat"
    #: Other routes the load calls instead, with their share of the requests.
    mix: tuple[tuple[str, float], ...] = ()
    #: How long the service's `/export` blocks its event loop.
    export_block_ms: float = 300.0
    #: A finding the demo should also produce (rule id), beyond the verdict.
    expected_finding: str | None = None
    #: The provider serves HTTPS with a certificate of a CA made for the run, which the service trusts.
    tls: bool = False
    #: The most connections the service's shared LLM client opens (httpx `max_connections`; 0: httpx's default).
    llm_max_connections: int = 0
    #: Changes of the arrival rate: (from second, requests per second) pairs, in time order; before the
    #: first, `rate_rps`.
    rate_steps: tuple[tuple[float, float], ...] = ()


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="pool-held-across-llm",
            summary=(
                "Each request checks a database connection out of a 3-connection pool (max_overflow=0),"
                " runs a SELECT and keeps the connection while it streams the LLM answer"
            ),
            expected_layer="db.pool",
            rate_rps=11.0,
            provider={"ttft_ms": 150.0, "tpot_ms": 10.0, "output_tokens": 8},
            pool_size=3,
            path="/chat",
        ),
        Scenario(
            name="threadpool-queueing",
            summary=(
                "A sync endpoint calls the LLM (blocking) on anyio's thread pool, limited to 2 threads:"
                " requests queue for a worker thread"
            ),
            expected_layer="queue",
            rate_rps=16.0,
            provider={"ttft_ms": 60.0, "tpot_ms": 5.0, "output_tokens": 8},
            pool_size=10,
            threadpool_tokens=2,
            path="/chat-sync",
        ),
        Scenario(
            name="provider-floor",
            summary=(
                "Every LLM call waits a uniform 600 ms for its first token: slow for everyone,"
                " but no tail - no layer owns p99, the provider floor is a finding"
            ),
            expected_layer=None,
            rate_rps=10.0,
            provider={"ttft_ms": 600.0, "tpot_ms": 5.0, "output_tokens": 8},
            pool_size=20,
            path="/chat-released",
            expected_finding="provider-floor",
        ),
        Scenario(
            name="provider-spikes",
            summary=(
                "The service releases its connection before the LLM call, but 5% of calls wait 1.8 s"
                " longer for their first token: provider-side queueing owns the tail"
            ),
            expected_layer="provider",
            rate_rps=16.0,
            provider={
                "ttft_ms": 100.0,
                "spike_probability": 0.05,
                "spike_ms": 1800.0,
                "tpot_ms": 5.0,
                "output_tokens": 8,
            },
            pool_size=10,
            path="/chat-released",
            expected_finding="provider-floor",
        ),
        Scenario(
            name="long-outputs",
            summary=(
                "Most answers are 8 tokens, 5% are 240 tokens at 10 ms per token:"
                " decode after the first token owns the tail"
            ),
            expected_layer="model",
            rate_rps=16.0,
            provider={
                "ttft_ms": 100.0,
                "tpot_ms": 10.0,
                "output_tokens": 8,
                "long_output_probability": 0.05,
                "long_output_tokens": 240,
            },
            pool_size=10,
            path="/chat-released",
            expected_finding="long-decode",
        ),
        Scenario(
            name="healthy",
            summary=(
                "The fixed route with a modest, uniform 120 ms to the first token and short answers:"
                " no tail, nothing to fix"
            ),
            expected_layer=None,
            rate_rps=10.0,
            provider={"ttft_ms": 120.0, "tpot_ms": 5.0, "output_tokens": 8},
            pool_size=10,
            path="/chat-released",
        ),
        Scenario(
            name="blocking-call",
            summary=(
                "3% of requests go to an async endpoint that makes a 300 ms blocking call on the"
                " event loop; every other request in flight waits for the loop meanwhile, whatever"
                " it was awaiting"
            ),
            expected_layer="event_loop",
            rate_rps=16.0,
            provider={"ttft_ms": 80.0, "tpot_ms": 5.0, "output_tokens": 8},
            pool_size=10,
            path="/chat-released",
            mix=(("/export", 0.03),),
            export_block_ms=300.0,
            expected_finding="event-loop-blocked",
        ),
        Scenario(
            name="network-bound",
            summary=(
                "The service makes an openai client per request, so every call opens a new TLS connection"
                " to a far provider: 120 ms of set-up each, and 4% of handshakes lose a packet and wait"
                " 1 s more: connection set-up owns the tail"
            ),
            expected_layer="provider",
            rate_rps=12.0,
            provider={"ttft_ms": 100.0, "tpot_ms": 5.0, "output_tokens": 8, "connect_delay_ms": 120.0,
                      "connect_spike_probability": 0.04, "connect_spike_ms": 1000.0},  # fmt: skip
            pool_size=10,
            path="/chat-new-client",
            expected_finding="connection-setup",
            tls=True,
        ),
        Scenario(
            name="growing-context",
            summary=(
                "An agent loop resends its whole history each turn, adding the last answer and a 3k-character"
                " tool result; 6% of requests run 10 turns instead of 2, and TTFT grows 60 ms per 1k input"
                " tokens: the long conversations own the tail"
            ),
            expected_layer="provider",
            rate_rps=10.0,
            provider={"ttft_ms": 60.0, "ttft_ms_per_1k_input_tokens": 60.0, "tpot_ms": 2.0, "output_tokens": 6},
            pool_size=10,
            path="/agent",
            expected_finding="context-growth",
        ),
        Scenario(
            name="engine-queueing",
            summary=(
                "A self-hosted engine (the provider runs vLLM's scheduler and publishes vLLM's metrics) batches"
                " at most 2 requests; at 12 requests/s bursts of arrivals wait in its queue while the batch"
                " stays full: the engine's queue owns the tail, not the model"
            ),
            expected_layer="provider",
            rate_rps=12.0,
            provider={"ttft_ms": 0.0, "output_tokens": 8, "engine_max_running": 2, "engine_step_ms": 15.0,
                      "engine_step_ms_per_running": 1.0, "engine_prefill_ms_per_1k_tokens": 20.0},  # fmt: skip
            pool_size=10,
            path="/chat-released",
            expected_finding="engine-queueing",
        ),
    )
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        close = difflib.get_close_matches(name, SCENARIOS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"no demo scenario {name!r}{hint}; known: {', '.join(SCENARIOS)}"
        ) from None
