"""`latprof demo --traces stock`: the demo's fault services traced with the stock OpenTelemetry SDK
and instrumentations only (no latprof in the service), their spans sent to `latprof receive`.

What stock spans can tell: the pool (SQLAlchemy's `connect` spans measure the checkout) is named
as `latprof run` names it. The LLM calls leave no span (openai 3.x sends on httpx2, which the httpx
instrumentation does not see), the thread pool's queue and a held event loop have none either:
there the verdict must be honest (no layer or `unattributed`), never another layer named with
confidence (the `long` test runs every scenario).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from services import PG_DSN, require_pg

from latprof.demo.run import run_demo
from latprof.demo.scenarios import SCENARIOS
from latprof.layers import UNATTRIBUTED
from report_schema import assert_valid

pytest.importorskip("opentelemetry.instrumentation.fastapi")
DEMO_SECONDS = float(os.environ.get("LATPROF_TEST_DEMO_SECONDS", "10"))
#: What stock spans name for each scenario: the fault's layer where spans measure it, else None (honest).
STOCK_RIGHT = {"pool-held-across-llm": "db.pool", "provider-floor": None, "healthy": None}


@pytest.mark.slow
def test_a_stock_traced_demo_names_the_pool_as_latprof_run_does(tmp_path: Path) -> None:
    require_pg()
    result = run_demo("pool-held-across-llm", dsn=PG_DSN, capture=tmp_path / "traces.jsonl", duration_s=DEMO_SECONDS,
                      progress=None, traces="stock")  # fmt: skip
    report = result.report
    assert_valid(report.to_dict())
    assert result.load.errors == 0, result.load.error_samples
    assert report.source["kind"] == "receive" and report.source["method"] == "receive"
    assert (report.verdict.layer, report.verdict.rule) == ("db.pool", "db-pool-exhaustion"), report.verdict
    assert report.verdict.confidence >= 0.8
    assert report.window["requests"] >= 60


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_stock_traced_demo_is_right_or_honest(tmp_path: Path, name: str) -> None:
    require_pg()
    scenario = SCENARIOS[name]
    result = run_demo(name, dsn=PG_DSN, capture=tmp_path / "traces.jsonl", duration_s=DEMO_SECONDS, progress=None, traces="stock")
    verdict = result.report.verdict
    print(f"{name}: {verdict.layer} ({verdict.status}) {verdict.confidence} {verdict.rule}")
    if name in STOCK_RIGHT:
        assert verdict.layer == STOCK_RIGHT[name], verdict
    else:  # the fault's layer has no span: honest, or its own layer if an inference finds it
        assert verdict.layer in (None, UNATTRIBUTED, scenario.expected_layer), verdict


def test_demo_takes_one_way_of_collecting() -> None:
    done = subprocess.run([sys.executable, "-m", "latprof", "demo", "--attach", "--traces", "stock"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "choose one" in done.stderr and "Traceback" not in done.stderr
