"""Faults latprof infers from stock OpenTelemetry spans alone: real services, `latprof analyze FILE` as a user runs it.

Each fault has its negative, a service whose spans look alike but where the pattern must not
fire. The services are tests/collectors/traces/apps/stock_*.py, recorded by
`otlp_harness.record_otlp` (stock instrumentations only, OTLP/JSON as the Collector writes it),
the LLM being latprof's demo provider.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import otlp_harness
from latprof.demo.provider import Provider
from test_otlp_e2e import report_of

#: Each records a real service for seconds: run by `.ci/run` after the README's command (`pytest -m long`).
pytestmark = [pytest.mark.slow, pytest.mark.long]

#: Provider settings: a short answer (~150 ms), so a 300 ms backoff stands out.
LLM = {"ttft_ms": 120, "tpot_ms": 5, "output_tokens": 6}
RETRY_AFTER_MS = 300
#: 1 request in 10 goes to the rate-limited provider: the tail, not the median.
TAIL_EVERY = 10


def record_stock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, app: str, endpoint: str, clients: int = 3) -> Path:
    """Record `apps/<app>.py` under a closed-loop load of `clients` for 7 s: `endpoint?limited=1`
    one request in `TAIL_EVERY`, `endpoint?limited=0` the others."""
    monkeypatch.setattr(otlp_harness, "APP", f"tests.collectors.traces.apps.{app}:app")
    paths = [f"{endpoint}?limited={int(i == TAIL_EVERY - 1)}" for i in range(TAIL_EVERY)]
    with Provider(**LLM, fail_first=1, retry_after_ms=RETRY_AFTER_MS) as limited:
        return otlp_harness.record_otlp(tmp_path, "agent_loop", paths=paths, clients=clients, duration_s=7.0, provider=LLM,
                                        env={"LIMITED_URL": limited.url})  # fmt: skip


def finding_of(report: dict[str, Any], rule: str) -> dict[str, Any] | None:
    return next((f for f in report["findings"] if f["rule"] == rule), None)


@pytest.mark.slow  # records a real service
def test_retries_after_429s_behind_plain_httpx_are_retry_inferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = report_of(record_stock(tmp_path, monkeypatch, "stock_retry", "/chat"))
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("retry", "retry-backoff"), verdict
    assert "inferred" in verdict["summary"] and verdict["confidence"] <= 0.6
    found = finding_of(report, "retry-backoff")
    assert found is not None
    evidence = found["evidence"]
    assert evidence["inferred"] is True and list(evidence["after"]) == ["429"], evidence
    assert evidence["retry_p99_ms"] >= RETRY_AFTER_MS * 0.9, evidence


@pytest.mark.slow  # records a real service
def test_an_agent_calling_a_failing_search_twice_around_an_llm_call_is_not_a_retry(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    report = report_of(record_stock(tmp_path, monkeypatch, "stock_retry", "/agent", clients=8))  # 3 LLM calls each: more clients for a verdict
    assert finding_of(report, "retry-backoff") is None
    assert all(layer["layer"] != "retry" for layer in report["layers"])
    verdict = report["verdict"]
    assert verdict["layer"] != "retry"
    assert verdict["confidence"] < 0.5 or verdict["layer"] in ("provider", "unattributed", None), verdict


def record_sync_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, paths: list[str], **settings: Any) -> Path:
    """Record apps/stock_sync_pool.py (FastAPI `def` endpoints, sync psycopg_pool) in the "pool_held"
    load: 2 steady clients and a burst of 8 every 2 s, for 7 s."""
    monkeypatch.setattr(otlp_harness, "APP", "tests.collectors.traces.apps.stock_sync_pool:app")
    return otlp_harness.record_otlp(tmp_path, "pool_held", db="psycopg_pool", paths=paths, duration_s=7.0, **settings)


@pytest.mark.slow  # records a real service
def test_a_pool_taken_at_the_top_of_sync_endpoints_is_db_pool_inferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = report_of(record_sync_pool(tmp_path, monkeypatch, ["/chat?llm_first=1"]))
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("db.pool", "db-pool-exhaustion"), verdict
    # below 0.5: a worker thread pool of 3 would leave the same gap before each request's first step
    assert "inferred" in verdict["summary"] and 0 < verdict["confidence"] <= 0.4
    found = finding_of(report, "db-pool-exhaustion")
    assert found is not None and found["evidence"]["inferred"] is True
    assert found["evidence"]["connection_ceiling"] == 3, found["evidence"]  # the pool's size
    assert "thread pool of 3" in found["summary"]


@pytest.mark.slow  # records a real service
def test_slow_own_code_before_the_first_step_of_sync_endpoints_is_not_a_pool(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A pool larger than the load, and 1 request in 30 that works 400 ms before its first step."""
    paths = ["/chat?llm_first=1&pre_ms=400" if i == 25 else "/chat?llm_first=1" for i in range(30)]
    report = report_of(record_sync_pool(tmp_path, monkeypatch, paths, pool_size=20, burst=0, clients=4))
    assert finding_of(report, "db-pool-exhaustion") is None
    verdict = report["verdict"]
    assert verdict["layer"] != "db.pool", verdict
    assert verdict["layer"] in ("unattributed", None) or verdict["confidence"] < 0.5, verdict
