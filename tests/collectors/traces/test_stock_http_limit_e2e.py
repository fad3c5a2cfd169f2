"""An outbound HTTP connection limit latprof infers from stock OpenTelemetry spans alone: a real FastAPI service whose
LLM calls go through `httpx.AsyncClient(limits=httpx.Limits(max_connections=N))`, `latprof analyze FILE` as a user runs it.

The service is tests/collectors/traces/apps/stock_http_limit.py, recorded by `otlp_harness.record_otlp` (stock
FastAPI and httpx instrumentations only, OTLP/JSON as the Collector writes it), the LLM being latprof's demo
provider. The fault: N steady clients that the limit serves without a wait, and every 2 s a burst of 8 more
requests whose calls wait for one of the N connections. The negative: the same limit under a closed loop of N
clients - the limit is always busy, yet no call ever waits - with a provider whose latency spikes now and then.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import otlp_harness
from test_otlp_e2e import report_of

#: Each records a real service for seconds: run by `.ci/run` after the README's command (`pytest -m long`).
pytestmark = [pytest.mark.slow, pytest.mark.long]

#: The client's limit (httpx max_connections) and the provider: ~150 ms a call, not streamed.
LIMIT = 2
LLM = {"ttft_ms": 120, "tpot_ms": 5, "output_tokens": 6}


def record_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, burst: int, **settings: Any) -> Path:
    """Record apps/stock_http_limit.py with `max_connections=LIMIT` under `LIMIT` closed-loop clients for 9 s,
    plus `burst` more requests at once every 2 s."""
    monkeypatch.setattr(otlp_harness, "APP", "tests.collectors.traces.apps.stock_http_limit:app")
    return otlp_harness.record_otlp(tmp_path, "agent_loop", paths=["/chat"], clients=LIMIT, burst=burst, burst_every_s=2.0,
                                    duration_s=9.0, env={"HTTP_LIMIT": str(LIMIT)}, **settings)  # fmt: skip


def finding_of(report: dict[str, Any], rule: str) -> dict[str, Any] | None:
    return next((f for f in report["findings"] if f["rule"] == rule), None)


@pytest.mark.slow  # records a real service
def test_calls_waiting_for_a_small_httpx_pool_are_http_pool_inferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = report_of(record_limited(tmp_path, monkeypatch, burst=8, provider=LLM))
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("http.pool", "http-pool-exhaustion"), verdict
    # below 0.5: a provider that serves LIMIT calls at a time would look the same from the client's spans
    assert "inferred" in verdict["summary"] and 0 < verdict["confidence"] <= 0.4, verdict
    found = finding_of(report, "http-pool-exhaustion")
    assert found is not None and 0 < found["confidence"] <= 0.4, found
    evidence = found["evidence"]
    assert evidence["inferred"] is True and evidence["connection_ceiling"] == LIMIT, evidence
    assert evidence["host"].startswith("127.0.0.1:"), evidence
    summary = found["summary"]
    assert f"a client connection limit of {LIMIT}" in summary and f"a provider that serves {LIMIT} at a time" in summary
    assert "latprof run" in summary, summary


@pytest.mark.slow  # records a real service
def test_a_closed_loop_of_as_many_clients_as_the_limit_is_not_a_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never more requests in flight than connections: no call waits, whatever the provider's spikes do."""
    spiky = {**LLM, "spike_probability": 0.04, "spike_ms": 400}
    report = report_of(record_limited(tmp_path, monkeypatch, burst=0, provider=spiky))
    assert finding_of(report, "http-pool-exhaustion") is None, report["findings"]
    assert all(layer["layer"] != "http.pool" for layer in report["layers"]), report["layers"]
    verdict = report["verdict"]
    assert verdict["layer"] != "http.pool", verdict
    assert verdict["layer"] in ("provider", "unattributed", None) or verdict["confidence"] < 0.5, verdict
