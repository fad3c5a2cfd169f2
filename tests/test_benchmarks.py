"""The benchmarks still run against today's code (tiny sizes: what they measure is in docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def bench(tmp_path: Path, name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.slow
def test_writer_and_locks_benchmarks_run(tmp_path):
    assert "emit(), buffer has room" in bench(tmp_path, "bench_writer", "--events", "2000", "--rounds", "1")
    assert "threading.Lock" in bench(tmp_path, "bench_locks", "--n", "2000", "--trials", "1")


@pytest.mark.slow
def test_hook_benchmarks_run(tmp_path):
    assert "segment" in bench(tmp_path, "bench_hook_cost", "--segments", "200", "--trials", "1")
    out = bench(tmp_path, "bench_hook_ops", "--ops", "20", "--trials", "1", "--only", "sqlalchemy,sleeps,threads")
    for hook in ("sqlalchemy", "sleeps", "threads"):
        line = next(line for line in out.splitlines() if line.startswith(hook))
        assert "skipped" not in line, out
    out = bench(tmp_path, "bench_net_timings", "--calls", "5", "--trials", "1")
    assert "async streamed, keep-alive" in out and "sync, TLS, new connection per call" in out, out


@pytest.mark.slow
def test_engine_scrape_benchmark_runs(tmp_path):
    out = bench(tmp_path, "bench_engine_scrape", "--scrapes", "3", "--trials", "1")
    assert "vllm-v1.prom" in out and "demo engine over HTTP" in out and " 0 failed" in out, out


@pytest.mark.slow
def test_analyze_benchmarks_run(tmp_path):
    out = bench(tmp_path, "bench_analyze", "--requests", "2000", "--rounds", "1", "--capture", str(tmp_path / "c.jsonl"))
    assert "median round" in out and "--exact" in out
    out = bench(tmp_path, "bench_otlp", "--spans", "5000", "--rounds", "1", "--file", str(tmp_path / "spans.json"))
    assert "ratio" in out


@pytest.mark.slow
def test_the_scoreboard_scores_a_run_and_writes_it_between_its_markers(tmp_path):
    """`benchmarks/accuracy.py` on one demo scenario for a few seconds: the healthy service, attached to."""
    page = tmp_path / "accuracy.md"
    page.write_text("before\n<!-- scoreboard:begin -->\nold\n<!-- scoreboard:end -->\nafter\n")
    out = bench(tmp_path, "accuracy", "--modes", "attach", "--scenarios", "healthy", "--seconds", "4", "--write", str(page))
    assert "| healthy | none (no tail) | not saturated: right |" in out, out
    assert "- **attach**: right 1 of 1, honest 0, wrong 0, confidently wrong 0" in out
    text = page.read_text()
    assert text.startswith("before\n<!-- scoreboard:begin -->\nMeasured ") and text.endswith("<!-- scoreboard:end -->\nafter\n")
    assert "old" not in text and "| healthy |" in text
