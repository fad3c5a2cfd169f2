"""`latprof demo` end to end: real provider, real uvicorn under `latprof run`, open-loop load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from latprof.demo.run import normalize_dsn, run_demo
from latprof.demo.scenarios import SCENARIOS, get_scenario
from latprof.errors import ConfigError

PG_DSN = os.environ.get("LATPROF_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
DEMO_SECONDS = float(os.environ.get("LATPROF_TEST_DEMO_SECONDS", "10"))


def _pg_unreachable() -> str | None:
    """Why PostgreSQL at PG_DSN cannot be used, or None when it can."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed: {exc}"
    try:
        with psycopg.connect(PG_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure means: not usable here
        return f"PostgreSQL at {PG_DSN} is unreachable: {type(exc).__name__}: {str(exc).strip()[:200]}"
    return None


def _require_pg() -> None:
    reason = _pg_unreachable()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: PostgreSQL is required)")
    pytest.skip(reason)


def test_normalize_dsn() -> None:
    assert normalize_dsn("postgresql://u@h:5432/d") == "postgresql+psycopg://u@h:5432/d"
    assert normalize_dsn("postgres://u@h/d") == "postgresql+psycopg://u@h/d"
    assert normalize_dsn("postgresql+psycopg2://u@h/d") == "postgresql+psycopg://u@h/d"
    assert normalize_dsn("sqlite:////tmp/x.db") == "sqlite+aiosqlite:////tmp/x.db"
    with pytest.raises(ConfigError):
        normalize_dsn("mysql://u@h/d")
    with pytest.raises(ConfigError):
        normalize_dsn("not a url")


def test_unknown_scenario_suggests() -> None:
    with pytest.raises(ConfigError, match="did you mean pool-held-across-llm"):
        get_scenario("pool-held-across-lm")
    assert "pool-held-across-llm" in SCENARIOS


def _check_pool_verdict(tmp_path: Path, dsn: str | None) -> None:
    capture = tmp_path / "demo.jsonl"
    result = run_demo(
        "pool-held-across-llm",
        dsn=dsn,
        capture=capture,
        duration_s=DEMO_SECONDS,
        progress=None,
    )
    report = result.report
    assert result.capture == capture.resolve() and capture.exists()
    assert result.load.errors == 0, result.load.error_samples
    assert report.verdict.layer == "db.pool", report.verdict
    assert report.verdict.rule == "db-pool-exhaustion"
    (finding,) = [f for f in report.findings if f.rule == "db-pool-exhaustion"]
    assert finding.evidence["held_across_llm_share"] >= 0.9
    assert finding.evidence["pool_max"] == 3


@pytest.mark.slow
def test_demo_pool_held_across_llm_sqlite(tmp_path: Path) -> None:
    _check_pool_verdict(tmp_path, None)


@pytest.mark.slow
def test_demo_pool_held_across_llm_postgresql(tmp_path: Path) -> None:
    _require_pg()
    _check_pool_verdict(tmp_path, PG_DSN)


@pytest.mark.slow
def test_demo_threadpool_queueing(tmp_path: Path) -> None:
    result = run_demo(
        "threadpool-queueing",
        capture=tmp_path / "demo.jsonl",
        duration_s=DEMO_SECONDS,
        progress=None,
    )
    assert result.load.errors == 0, result.load.error_samples
    assert result.report.verdict.layer == "queue", result.report.verdict


@pytest.mark.slow
def test_demo_provider_floor(tmp_path: Path) -> None:
    result = run_demo(
        "provider-floor",
        capture=tmp_path / "demo.jsonl",
        duration_s=DEMO_SECONDS,
        progress=None,
    )
    assert result.load.errors == 0, result.load.error_samples
    assert result.report.verdict.layer is None, result.report.verdict
    assert "provider-floor" in {f.rule for f in result.report.findings}
