"""The sleeps hook: sleeps of a request, retry libraries' backoff, and a hand-written retry loop's verdict."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import backoff
import pytest
import tenacity
from recording import recording

from apps.harness import ROOT, Server, get

from latprof.collectors.hooks import runtime, sleeps
from latprof.events import Segment
from latprof.layers import RETRY
from latprof.semconv import RETRY_LIBRARY, SLEEP_SEGMENT


@pytest.fixture
def hooked():
    with recording() as events:
        sleeps.install()
        if "asyncio" in sys.modules:
            sleeps._patch_asyncio(sys.modules["asyncio"])  # imported long before install() here
        try:
            yield events
        finally:
            sleeps.uninstall()


def recorded_sleeps(events) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and e.name == SLEEP_SEGMENT]


def in_request(fn):
    token = runtime.begin_request("GET /x", runtime.now_ns())
    try:
        return fn()
    finally:
        runtime.end_request(token)


def test_sleeps_in_a_request_are_recorded_without_a_layer_others_not(hooked):
    time.sleep(0.02)  # outside a request
    in_request(lambda: (time.sleep(0.05), time.sleep(0), time.sleep(0.0005)))

    async def main() -> None:
        await asyncio.sleep(0.02)  # outside
        token = runtime.begin_request("GET /a", runtime.now_ns())
        assert await asyncio.sleep(0.05, result="kept") == "kept"
        await asyncio.sleep(0)
        runtime.end_request(token)

    asyncio.run(main())
    found = recorded_sleeps(hooked)
    assert [s.layer for s in found] == [None, None]
    for s in found:
        assert 45e6 <= s.end_ns - s.start_ns <= 150e6


def test_retry_libraries_sleep_as_retry(hooked):
    calls = {"tenacity": 0, "backoff": 0, "async": 0}

    @tenacity.retry(wait=tenacity.wait_fixed(0.05), stop=tenacity.stop_after_attempt(3))
    def flaky_tenacity() -> str:
        calls["tenacity"] += 1
        if calls["tenacity"] < 3:
            raise ConnectionError("refused")
        return "ok"

    @backoff.on_exception(backoff.constant, ConnectionError, interval=0.05, max_tries=2, jitter=None)
    def flaky_backoff() -> str:
        calls["backoff"] += 1
        if calls["backoff"] < 2:
            raise ConnectionError("refused")
        return "ok"

    @tenacity.retry(wait=tenacity.wait_fixed(0.05), stop=tenacity.stop_after_attempt(2))
    async def flaky_async() -> str:
        calls["async"] += 1
        if calls["async"] < 2:
            raise ConnectionError("refused")
        return "ok"

    assert in_request(flaky_tenacity) == "ok" and in_request(flaky_backoff) == "ok"

    async def main() -> str:
        token = runtime.begin_request("GET /a", runtime.now_ns())
        try:
            return await flaky_async()
        finally:
            runtime.end_request(token)

    assert asyncio.run(main()) == "ok"
    found = recorded_sleeps(hooked)
    assert [(s.layer, s.attrs.get(RETRY_LIBRARY)) for s in found] == [
        (RETRY, "tenacity"), (RETRY, "tenacity"), (RETRY, "backoff"), (RETRY, "tenacity")
    ]  # fmt: skip


def test_uninstall_restores_the_originals():
    original_sleep, original_async = time.sleep, asyncio.sleep
    sleeps.install()
    sleeps._patch_asyncio(sys.modules["asyncio"])
    assert time.sleep is not original_sleep and asyncio.sleep is not original_async
    sleeps.uninstall()
    assert time.sleep is original_sleep and asyncio.sleep is original_async and asyncio.tasks.sleep is original_async


@pytest.mark.slow
def test_a_hand_written_retry_loop_after_429s_gives_the_retry_verdict(tmp_path):
    """A FastAPI service calls the provider with the openai client (max_retries=0) and retries by hand after a 429."""
    from latprof.demo.provider import Provider

    with Provider(ttft_ms=60, tpot_ms=2, output_tokens=10) as provider:
        server = Server(
            "tests.collectors.hooks.apps.retry_app:app", "asyncio", "h11", tmp_path, env={"RETRY_APP_PROVIDER": provider.url}
        ).start()
        try:
            # The process's first LLM calls block its event loop for a while (imports, the client's
            # connection pool and TLS context): on a busy machine that is the slowest 1%. Warm up,
            # and let the analysis's default warm-up (2 s from the first request) leave it out.
            for k in range(3):
                get(server.port, f"/answer?key=warm{k}&fail=0")
            time.sleep(2.1)
            sent = 0
            with ThreadPoolExecutor(4) as pool:
                for k in range(120):  # 1 in 12 requests is rate limited once and backs off 600 ms
                    fail = 1 if k % 12 == 11 else 0
                    pool.submit(get, server.port, f"/answer?key=k{k}&fail={fail}")
                    sent += 1
                    time.sleep(0.05)
            server.stop()
        finally:
            server.kill()
    out = subprocess.run(
        [sys.executable, "-m", "latprof", "analyze", "--format", "json", str(server.capture_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    verdict = report["verdict"]
    print(f"{sent} sent; verdict {verdict}; latency {report['latency_ms']}")
    assert verdict["layer"] == "retry" and verdict["rule"] == "retry-backoff", verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "retry-backoff"]
    assert finding["evidence"]["after"] == {"429": 10}
    assert finding["evidence"]["retried_by"] == {"hand-written loop": 10}
