"""Real captures for the check tests: `latprof demo` scenarios recorded once per test session.

Each recording is a real FastAPI service under `latprof run`, real PostgreSQL (`$LATPROF_TEST_PG`)
and the demo's local OpenAI-compatible provider, ~15 s per (scenario, seconds). Without
PostgreSQL a test that asks for one skips on a developer box and fails in CI.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import pytest
from services import PG_DSN, require_pg


class DemoCapture(NamedTuple):
    """What one `latprof demo` run wrote: the capture and its report (`--format json`)."""

    capture: Path
    report_json: Path


@pytest.fixture(scope="session")
def demo_capture(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., DemoCapture]:
    """`demo_capture(scenario, seconds=12)`: record the scenario (once per session) and return its files."""
    cache: dict[tuple[str, float], DemoCapture] = {}

    def get(scenario: str, seconds: float = 12) -> DemoCapture:
        key = (scenario, float(seconds))
        if key in cache:
            return cache[key]
        require_pg()
        folder = tmp_path_factory.mktemp(f"demo-{scenario}")
        recorded = DemoCapture(folder / f"{scenario}.jsonl", folder / f"{scenario}.report.json")
        cmd = [
            sys.executable, "-m", "latprof", "demo", "--scenario", scenario, "--dsn", PG_DSN,
            "--seconds", str(seconds), "--out", str(recorded.capture), "--format", "json", "-o", str(recorded.report_json),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, cwd=folder)
        assert done.returncode == 0, f"`{' '.join(cmd)}` exited with {done.returncode}:\n{done.stderr[-4000:]}"
        assert recorded.capture.exists() and recorded.report_json.exists(), done.stderr[-4000:]
        cache[key] = recorded
        return recorded

    return get
