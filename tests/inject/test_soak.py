"""Soak: the demo service (FastAPI, SQLAlchemy on PostgreSQL, the openai client against a local
provider) started plainly, injected under steady load for `LATPROF_SOAK_SECONDS` (60 s here and
in CI; the 10-minute run is documented in docs/inject.md), then detached.

What must hold: the service's RSS grows by at most 10 MB from its warmed-up size to after the
detach; no exception and no latprof error in its log; no request fails; the capture holds every
request the client sent while the hooks were in (none is sampled out at this rate); every
patched attribute is back.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from attach.procs import free_port, start_server
from services import PG_DSN, require_pg

from latprof.collectors.hooks.bootstrap import hook_names
from latprof.demo.load import drive
from latprof.demo.provider import Provider, ProviderConfig
from latprof.demo.run import normalize_dsn
from latprof.inject.session import InjectSession
from latprof.semconv import DEFAULT_MAX_RATE

pytestmark = [pytest.mark.slow, pytest.mark.long]

SOAK_S = float(os.environ.get("LATPROF_SOAK_SECONDS", "60"))
RATE_RPS = 40.0
RSS_GROWTH_MB = 10.0


def _rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def test_soak_injected_under_steady_load_then_detached(tmp_path: Path) -> None:
    require_pg()
    with Provider(ProviderConfig(ttft_ms=30.0, tpot_ms=2.0, output_tokens=8)) as provider:
        port = free_port()
        env = {"LATPROF_DEMO_DSN": normalize_dsn(PG_DSN), "LATPROF_DEMO_POOL_SIZE": "10",
               "LATPROF_DEMO_PROVIDER_URL": provider.url}  # fmt: skip
        log = tmp_path / "service.log"
        service = start_server([sys.executable, "-m", "uvicorn", "latprof.demo.service:app", "--port", str(port),
                                "--log-level", "warning", "--no-access-log"], port, env, log)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            warm = drive(base, "/chat-released", RATE_RPS, 10, progress=None)  # warm-up: pools, imports, caches
            assert warm.errors == 0, warm.error_samples
            rss_before = _rss_mb(service.pid)
            session = InjectSession(service.pid, str(tmp_path / "c.jsonl"), duration_s=SOAK_S + 60, hooks=hook_names(),
                                    max_rate=DEFAULT_MAX_RATE)  # fmt: skip
            runner = threading.Thread(target=session.run)
            runner.start()
            while not session.recording and runner.is_alive():  # wait for the hooks to be in
                time.sleep(0.05)
            assert session.recording, session.results
            load = drive(base, "/chat-released", RATE_RPS, SOAK_S, progress=None)
            time.sleep(1.5)  # the last requests' roots reach the writer
            session.stop()
            runner.join(60)
            assert not runner.is_alive()
            after = drive(base, "/chat-released", RATE_RPS, 3, progress=None)  # still serving, unchanged
            rss_after = _rss_mb(service.pid)
        finally:
            service.terminate()
            service.wait(30)
    (result,) = session.results
    print(f"soak {SOAK_S:g} s: {load.done} requests, RSS {rss_before:.1f} -> {rss_after:.1f} MB; detach {result.detach}")
    assert load.errors == 0 and after.errors == 0, load.error_samples + after.error_samples
    assert result.outcome == "recorded" and result.detach["restored"] == result.detach["patched"] > 0
    assert rss_after - rss_before <= RSS_GROWTH_MB, (rss_before, rss_after)
    text = log.read_text()
    assert "Traceback" not in text and "latprof" not in text, text[-3000:]
    roots = sum(1 for line in (tmp_path / "c.jsonl").read_text().splitlines() if line.startswith('{"type":"request"'))
    assert roots == load.done, (roots, load.done)  # every request, none sampled out at this rate
