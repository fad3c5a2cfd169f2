"""An event loop blocked by one request's own code, inferred from stock OpenTelemetry spans alone: a real
service, `latprof analyze FILE` as a user runs it, and its negative.

The service is tests/collectors/traces/apps/stock_blocking.py (FastAPI, asyncpg and httpx, stock
instrumentations only), recorded by `otlp_harness.record_otlp`, the LLM being latprof's demo provider.
Every request runs a query (`pg_sleep`, a different length per request so that the clients do not move
in lock-step) and then, for most, an LLM call; one in `EVERY` instead answers "from a cache" with a
sync client inside `async def` - a 300 ms `time.sleep` on the loop (the fault) - or, in the negative,
awaits the same 300 ms (`asyncio.sleep`) while the loop serves more clients. Without the inference the
fault reads as slow queries (`slow-query`, confidence up to 0.96 in the recordings), or unattributed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import otlp_harness
from test_otlp_e2e import report_of
from test_stock_faults_e2e import finding_of

#: Each records a real service for seconds: run by `.ci/run` after the README's command (`pytest -m long`).
pytestmark = [pytest.mark.slow, pytest.mark.long]

#: Provider settings: an answer in ~95 ms.
LLM = {"ttft_ms": 80, "tpot_ms": 2, "output_tokens": 5}
STALL_MS = 300
#: 2 s of warm-up, which the analysis leaves out, then ~8 s: 10 to 20 stalls analysed.
DURATION_S = 10.0
#: One request in this many holds the loop (or, in the negative, awaits as long).
EVERY = 20
#: Each request's query and LLM call take one of these (cycled, coprime lengths), so that the clients do
#: not move in lock-step and the requests in flight at a stall await different layers.
DB_MS = (20, 50, 80, 110, 35)
LLM_MS = (60, 140, 90, 40, 120, 75, 100)


def record_blocking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, clients: int) -> Path:
    """Record apps/stock_blocking.py for `DURATION_S` under a closed-loop load of `clients`: `/chat` with a query
    of `DB_MS` and an LLM call of `LLM_MS`, and one request in `EVERY` with `fault` (`block_ms` or `wait_ms`) of
    `STALL_MS` instead of the LLM call."""
    monkeypatch.setattr(otlp_harness, "APP", "tests.collectors.traces.apps.stock_blocking:app")
    paths = [f"/chat?db_ms={DB_MS[i % len(DB_MS)]}&llm_ms={LLM_MS[i % len(LLM_MS)]}"
             + (f"&{fault}={STALL_MS}" if i % EVERY == EVERY - 1 else "") for i in range(EVERY * len(LLM_MS))]  # fmt: skip
    # the "slow_query" scenario's defaults (PostgreSQL, no tools) with this service's load; its pool above the clients
    return otlp_harness.record_otlp(tmp_path, "slow_query", db="asyncpg", paths=paths, clients=clients,
                                    duration_s=DURATION_S, pool_size=clients + 4, provider=LLM,
                                    env={"OTEL_SERVICE_NAME": "stock-blocking"})  # fmt: skip


def no_wrong_layer(verdict: dict[str, Any], *right: str | None) -> bool:
    """True when the verdict names one of the `right` layers, or another only below confidence 0.5."""
    return verdict["layer"] in right or verdict["confidence"] < 0.5


@pytest.mark.slow  # records a real service
def test_a_sync_call_in_an_async_endpoint_is_event_loop_inferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = report_of(record_blocking(tmp_path, monkeypatch, "block_ms", clients=8))
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("event_loop", "event-loop-blocked"), verdict
    assert "inferred" in verdict["summary"] and 0 < verdict["confidence"] <= 0.6, verdict
    found = finding_of(report, "event-loop-blocked")
    assert found is not None and found["confidence"] <= 0.6
    evidence = found["evidence"]
    assert evidence["inferred"] is True and evidence["stalls"] >= 3, evidence
    assert list(evidence["blocked_by"]) == ["GET /chat"], evidence
    assert STALL_MS * 0.9 <= evidence["stall_p50_ms"] <= STALL_MS * 1.5, evidence
    assert "GET /chat" in found["fix"] and "asyncio.to_thread" in found["fix"]
    # the queries the stalls stretched are not the tail's owner any more
    assert all(f["confidence"] < 0.5 for f in report["findings"] if f["layer"] == "db.query"), report["findings"]


@pytest.mark.slow  # records a real service
def test_a_busy_loop_awaiting_as_long_is_not_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = report_of(record_blocking(tmp_path, monkeypatch, "wait_ms", clients=10))
    assert finding_of(report, "event-loop-blocked") is None
    assert all(layer["layer"] != "event_loop" for layer in report["layers"])
    verdict = report["verdict"]
    # the awaited 300 ms lies between spans: `unattributed` is the honest answer; on a loaded machine the
    # process is also stopped now and then, which stretches the queries and LLM calls it awaits - spans
    # that then read as slow (`db.query`, `provider`), as they were
    assert verdict["layer"] != "event_loop", verdict
    assert no_wrong_layer(verdict, "unattributed", "db.query", "provider", None), verdict
