"""Connection set-up end to end: the async openai client against a far provider over TLS, a client per call or one warm pool.

The provider runs in its own process over TLS (a certificate of a CA made by trustme) and holds
every new connection for 100 ms before its handshake, 5% of them for 800 ms more (a lost
handshake packet). Each call is a request recorded by the openai and httpx hooks into a real
capture, which the whole pipeline reads. A client made per call pays a handshake every time:
connection-setup names the tail. The negative is one client whose pool stays warm, against a
provider whose own queueing spikes 5% of first tokens: the tail is the provider's, and no
connection set-up is named. About 12 s in all on a quiet machine.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("trustme")

from latprof.analysis.network import net_calls
from latprof.capture.writer import CaptureWriter
from latprof.collectors.hooks import httpx as httpx_hook
from latprof.collectors.hooks import openai as openai_hook
from latprof.collectors.hooks import runtime
from latprof.demo.provider import LocalCertificate, Provider
from latprof.layers import PROVIDER
from latprof.pipeline import Diagnosis, run_diagnosis

pytestmark = pytest.mark.slow

CALLS, CONCURRENCY = 120, 4
MESSAGES = [{"role": "user", "content": "Which layer owns the p99?"}]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, dict[str, str]]:
    certificate = LocalCertificate.make(tmp_path_factory.mktemp("tls"))
    return certificate.client_context(), certificate.settings()


async def _load(url: str, context: ssl.SSLContext, client_per_call: bool) -> None:
    shared = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, http_client=openai.DefaultAsyncHttpxClient(verify=context))
    slots = asyncio.Semaphore(CONCURRENCY)

    async def call() -> None:
        async with slots:
            token = runtime.begin_request("POST /chat", runtime.now_ns())
            try:
                client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0,
                                            http_client=openai.DefaultAsyncHttpxClient(verify=context)) if client_per_call else shared  # fmt: skip
                stream = await client.chat.completions.create(model="demo", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
                async for _ in stream:
                    pass
                if client_per_call:
                    await client.close()
            finally:
                runtime.end_request(token)

    await asyncio.gather(*(call() for _ in range(CALLS)))
    await shared.close()


def _diagnose(tmp_path: Path, tls: tuple[ssl.SSLContext, dict[str, str]], client_per_call: bool, **settings: Any) -> Diagnosis:
    context, files = tls
    path = tmp_path / "capture.jsonl"
    with Provider(subprocess=True, ttft_ms=80, tpot_ms=2, output_tokens=4, connect_delay_ms=100, **files, **settings) as provider:
        writer = CaptureWriter(path, flush_interval_s=0.2)
        for hook in (openai_hook, httpx_hook):
            hook.install()
        runtime.start(writer)
        try:
            asyncio.run(_load(provider.url, context, client_per_call))
        finally:
            runtime.stop()
            for hook in (openai_hook, httpx_hook):
                hook.uninstall()
            writer.close()
    return run_diagnosis([path], warmup_s=0.0)


def test_a_client_per_call_pays_a_handshake_each_time_and_the_slow_ones_own_the_tail(tmp_path: Path, tls: Any) -> None:
    diagnosis = _diagnose(tmp_path, tls, True, connect_spike_probability=0.05, connect_spike_ms=800)
    verdict = diagnosis.report.verdict
    assert (verdict.layer, verdict.rule) == (PROVIDER, "connection-setup"), (verdict, [(f.rule, f.impact_ms) for f in diagnosis.findings])
    (finding,) = [f for f in diagnosis.findings if f.rule == "connection-setup"]
    evidence = finding.evidence
    assert evidence["new_connection_share"] == 1.0 and evidence["calls_with_network_timings"] == CALLS, evidence
    assert 95 <= evidence["tls_p50_ms"] <= 600, evidence  # the provider's 100 ms, inside the handshake
    assert evidence["tail_setup_mean_ms"] >= 800, evidence
    assert evidence["cause"] == "slow_setup", evidence
    (floor,) = [f for f in diagnosis.findings if f.rule == "provider-floor"]
    assert "queueing" not in floor.summary and floor.impact_ms < finding.impact_ms / 2, (floor.summary, floor.impact_ms)


def test_a_warm_pool_pays_almost_no_handshake_and_the_providers_own_spikes_are_not_called_set_up(tmp_path: Path, tls: Any) -> None:
    diagnosis = _diagnose(tmp_path, tls, False, spike_probability=0.05, spike_ms=800)
    verdict = diagnosis.report.verdict
    assert verdict.layer == PROVIDER and verdict.rule == "provider-floor", verdict
    assert "connection-setup" not in {f.rule for f in diagnosis.findings}
    assert diagnosis.analysis is not None
    calls = net_calls(diagnosis.analysis)
    assert len(calls) == CALLS and sum(c.new_connection for c in calls) <= 2 * CONCURRENCY  # the pool's first connections
