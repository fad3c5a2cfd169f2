"""`latprof run --max-rate`: a real uvicorn service driven well above the rate records a weighted sample."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from apps.harness import ROOT, Server

from latprof.semconv import SAMPLE_WEIGHT

pytestmark = pytest.mark.slow  # a real server in a subprocess

APP = "tests.collectors.hooks.apps.plain:app"
MAX_RATE = 20
LOAD_S = 4.0
CLIENTS = 6


def drive(port: int) -> int:
    """Closed-loop clients on keep-alive connections for LOAD_S; how many requests were answered."""
    stop = time.monotonic() + LOAD_S
    counts = [0] * CLIENTS
    errors: list[BaseException] = []

    def client(k: int) -> None:
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as http:
                while time.monotonic() < stop:
                    assert http.get(f"/chat/{k}", params={"ms": 0}).status_code == 200
                    counts[k] += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return sum(counts)


@pytest.mark.parametrize(("loop", "http"), [("uvloop", "httptools")])
def test_above_the_max_rate_a_weighted_sample_stands_for_every_request(tmp_path, loop, http):
    server = Server(APP, loop, http, tmp_path, max_rate=MAX_RATE).start()
    try:
        sent = drive(server.port)
        assert server.stop() != 0  # SIGTERM: uvicorn re-raises it
        capture = server.capture()
    finally:
        server.kill()
    chats = capture.routes("GET /chat/{chat_id:int}")
    weights = [int(r.attrs.get(SAMPLE_WEIGHT, 1)) for r in chats]
    rate = sent / LOAD_S
    print(f"{sent} requests at {rate:.0f}/s; {len(chats)} recorded, weights {min(weights)}-{max(weights)}, sum {sum(weights)}")
    assert rate >= 5 * MAX_RATE, "the client did not drive the server fast enough for this test to mean anything"
    # About MAX_RATE a second are recorded (a burst may record up to twice a window's budget)...
    assert len(chats) <= 2.5 * MAX_RATE * LOAD_S + 16
    assert max(weights) >= rate / MAX_RATE / 2
    # ... and their weights add up to the requests served: an unbiased estimate, here within
    # 35% (the sample's standard error is about 10%).
    assert 0.65 * sent <= sum(weights) <= 1.35 * sent

    out = subprocess.run(
        [sys.executable, "-m", "latprof", "analyze", "--format", "json", "--skip-warmup", "0", str(server.capture_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    health = len(capture.routes("GET /health"))  # the harness's readiness probes, recorded one by one
    assert report["window"]["requests"] == sum(weights) + health
    assert report["collection"]["recorded_requests"] == len(chats) + health
    assert [w for w in report["collection"]["warnings"] if w.startswith("sampled:")]
