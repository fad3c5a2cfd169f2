"""The engine scraper against a real Prometheus exporter (prometheus_client's HTTP server on loopback)."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from latprof.collectors.scrape.prometheus import EngineScrape, EngineScraper, check_url, parse, scraping_into
from latprof.capture.reader import read_captures
from latprof.errors import InputError
from latprof.events import Gauge as GaugeEvent
from latprof.events import QualityRecord
from latprof.semconv import ENGINE_KIND, GEN_AI_REQUEST_MODEL, NOTE_ENGINE_METRICS, SERVER_PORT


class VllmLike:
    """A registry publishing a few of vLLM v1's metrics under their names, served over HTTP."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "running", labels, registry=self.registry)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "kv", labels, registry=self.registry)
        self.preemptions = Counter("vllm:num_preemptions", "preemptions", labels, registry=self.registry)
        self.success = Counter("vllm:request_success", "finished", [*labels, "finished_reason"], registry=self.registry)
        self.queue = Histogram("vllm:request_queue_time_seconds", "queue", labels, registry=self.registry,
                               buckets=(0.1, 0.5, 1, 5))  # fmt: skip
        self.server, self.thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def vllm() -> Iterator[VllmLike]:
    exporter = VllmLike()
    try:
        yield exporter
    finally:
        exporter.close()


def by_name(events: list) -> dict[tuple[str, str], float]:
    return {(e.name, e.attrs.get(GEN_AI_REQUEST_MODEL, "")): e.value for e in events if isinstance(e, GaugeEvent)}


def scrape(state: EngineScrape) -> dict[tuple[str, str], float]:
    import urllib.request

    with urllib.request.urlopen(state.url, timeout=5) as response:
        text = response.read().decode()
    return by_name(state.events(parse(text), time.time_ns()))


def test_gauges_are_read_and_counters_and_histograms_become_deltas(vllm: VllmLike) -> None:
    for engine in ("0", "1"):  # a data-parallel engine: summed over `engine`, the KV share the fullest
        vllm.waiting.labels("m", engine).set(3)
        vllm.running.labels("m", engine).set(8)
    vllm.kv.labels("m", "0").set(0.5)
    vllm.kv.labels("m", "1").set(0.97)
    vllm.preemptions.labels("m", "0").inc(5)
    state = EngineScrape(vllm.url, pid=1)
    first = scrape(state)
    assert first[("engine.requests.waiting", "m")] == 6
    assert first[("engine.requests.running", "m")] == 16
    assert first[("engine.kv_cache.usage", "m")] == pytest.approx(0.97)
    assert ("engine.preemptions", "m") not in first  # the baseline: 5 happened before latprof looked
    vllm.preemptions.labels("m", "0").inc(2)
    vllm.preemptions.labels("m", "1").inc(1)
    vllm.success.labels("m", "0", "stop").inc(4)
    vllm.success.labels("m", "0", "length").inc(1)
    for seconds in (0.2, 0.4, 3.0):
        vllm.queue.labels("m", "0").observe(seconds)
    second = scrape(state)
    assert second[("engine.preemptions", "m")] == 3
    assert second[("engine.requests.finished", "m")] == 5  # both finished_reasons, first published now: from zero
    assert second[("engine.queue_ms.sum", "m")] == pytest.approx(3600)
    assert second[("engine.queue_ms.count", "m")] == 3
    third = scrape(state)
    assert third[("engine.preemptions", "m")] == 0 and third[("engine.queue_ms.count", "m")] == 0
    assert state.summary.engine == "vllm" and state.summary.models == ["m"]
    events = state.events(parse(f"vllm:num_requests_waiting{{model_name=\"m\"}} 2\n"), 1)
    assert all(e.attrs[ENGINE_KIND] == "vllm" and e.attrs[SERVER_PORT] == vllm.server.server_port for e in events)


def test_a_counter_that_went_down_was_reset_and_counts_from_zero(vllm: VllmLike) -> None:
    vllm.preemptions.labels("m", "0").inc(10)
    state = EngineScrape(vllm.url, pid=1)
    scrape(state)
    restarted = VllmLike()  # the engine restarted: its counters start again
    try:
        restarted.preemptions.labels("m", "0").inc(4)
        state.url = restarted.url
        assert scrape(state)[("engine.preemptions", "m")] == 4
    finally:
        restarted.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_failed_scrapes_and_pages_of_no_engine_are_counted_and_said_never_raised(vllm: VllmLike) -> None:
    events: list = []
    plain = CollectorRegistry()
    Counter("process_requests", "not an engine", registry=plain).inc()
    other, _ = start_http_server(0, addr="127.0.0.1", registry=plain)
    try:
        scraper = EngineScraper([f"http://127.0.0.1:{free_port()}/metrics", f"http://127.0.0.1:{other.server_port}/metrics",
                                 vllm.url], events.append, timeout_s=0.5)  # fmt: skip
        for _ in range(2):
            scraper.scrape_once()
        summaries = scraper.stop()
    finally:
        other.shutdown()
        other.server_close()
    refused, not_engine, engine = summaries
    assert refused.failed == 2 and refused.scrapes == 0 and "2 of 2 scrapes failed" in refused.problems()[0]
    assert not_engine.scrapes == 2 and not_engine.engine is None and "no known engine" in not_engine.problems()[0]
    assert engine.scrapes == 2 and engine.engine == "vllm"
    records = [e for e in events if isinstance(e, QualityRecord)]
    assert [r.attrs["endpoint"] for r in records if r.kind == NOTE_ENGINE_METRICS] == [s.endpoint for s in summaries]
    warnings = [r.message for r in records if r.kind == "warning"]
    assert len(warnings) == 3 and "has no prefill" in warnings[2]  # the vLLM-like page publishes a few metrics only


def test_scraping_into_a_capture_every_second_is_read_back(tmp_path, vllm: VllmLike) -> None:
    capture = tmp_path / "capture.jsonl"
    vllm.waiting.labels("m", "0").set(4)
    with scraping_into(capture, [vllm.url], "run"):
        time.sleep(2.6)
    data = read_captures([capture])
    waiting = [g for g in data.gauges if g.name == "engine.requests.waiting"]
    assert 2 <= len(waiting) <= 4 and {g.value for g in waiting} == {4}
    gaps = [b.ts_ns - a.ts_ns for a, b in zip(waiting, waiting[1:])]
    assert all(0.8e9 < gap < 1.5e9 for gap in gaps)
    assert data.headers[0]["role"] == "engine-metrics"
    assert [q.kind for q in data.quality if q.kind == NOTE_ENGINE_METRICS] == [NOTE_ENGINE_METRICS]


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/metrics", "127.0.0.1:8000/metrics", "http:///metrics", "http://h:99999/"])
def test_a_bad_url_is_one_line(url: str) -> None:
    with pytest.raises(InputError, match="--engine-metrics"):
        check_url(url)


def test_a_bad_url_stops_run_before_the_command_starts(tmp_path) -> None:
    marker = tmp_path / "ran"
    proc = subprocess.run([sys.executable, "-m", "latprof", "run", "--out", str(tmp_path / "c.jsonl"), "--engine-metrics",
                           "ftp://127.0.0.1/x", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--engine-metrics" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists()


FIXTURES = Path(__file__).parent / "fixtures"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_pages_are_a_counted_failure_or_gauges_never_an_exception(data: st.DataObject) -> None:
    """Each engine's real page, cut, spliced with junk or with a line duplicated: `take` gives events or counts a failure."""
    pages = sorted(FIXTURES.glob("*.prom"))
    text = data.draw(st.sampled_from(pages)).read_text()
    way = data.draw(st.sampled_from(["cut", "junk", "repeat", "value"]))
    at = data.draw(st.integers(0, len(text)))
    if way == "cut":
        text = text[:at]
    elif way == "junk":
        text = text[:at] + data.draw(st.text(max_size=40)) + text[at:]
    elif way == "repeat":
        lines = text.splitlines(keepends=True)
        line = lines[at % len(lines)]
        text = text + line + line
    else:
        text = text.replace(" 0.0\n", f" {data.draw(st.sampled_from(['NaN', '-Inf', '+Inf', '-1e308', '1e400', 'x']))}\n", 1)
    state = EngineScrape("http://127.0.0.1:9/metrics", pid=1)
    for ts in (1, 2):  # twice: the deltas too
        before = state.summary.scrapes + state.summary.failed
        events = state.take(text, ts)
        assert state.summary.scrapes + state.summary.failed == before + 1
        assert all(isinstance(e, GaugeEvent) and math.isfinite(e.value) for e in events)


def test_a_token_in_the_url_never_reaches_the_capture(tmp_path: Path, vllm: VllmLike) -> None:
    capture = tmp_path / "capture.jsonl"
    vllm.waiting.labels("m", "0").set(1)
    with scraping_into(capture, [vllm.url + "?token=CANARY-7d1f&user=secret-user"], "run"):
        time.sleep(1.5)
    raw = capture.read_bytes()
    assert b"engine.requests.waiting" in raw
    assert b"CANARY-7d1f" not in raw and b"secret-user" not in raw and b"token" not in raw
