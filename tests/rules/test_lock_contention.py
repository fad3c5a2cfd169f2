"""lock-contention: fires when waits for locks own the tail; names the lock; numbers checked by hand."""

from __future__ import annotations

from timelines import analysed, assert_min_tail_excess_is_the_boundary, req, seg

from latprof.layers import LOCK, PROVIDER
from latprof.rules.lock_contention import LockContention, Thresholds
from latprof.semconv import LOCK_KIND, LOCK_SITE
from latprof.analysis.timeline import RequestTimeline

N = 200  # requests, 100 ms apart; every 20th (i = 19, 39, ..., 199) is slow


def service(slow_lock_ms: float = 600.0, other_lock_ms: float = 0.0) -> list[RequestTimeline]:
    """20 ms of app, a lock wait (slow requests), a 200 ms LLM call; typical requests wait 1 ms on the cache lock."""
    out = []
    for i in range(N):
        slow = i % 20 == 19
        t0 = i * 100.0
        segs = []
        cursor = t0 + 20
        wait = slow_lock_ms if slow else 1.0
        segs.append(seg(LOCK, cursor, cursor + wait, name="lock wait", **{LOCK_KIND: "threading.Lock", LOCK_SITE: "rag/cache.py:41"}))
        cursor += wait
        if other_lock_ms and slow:
            segs.append(
                seg(LOCK, cursor, cursor + other_lock_ms, name="lock wait", **{LOCK_KIND: "asyncio.Semaphore", LOCK_SITE: "rag/llm.py:9"})
            )
            cursor += other_lock_ms
        segs.append(seg(PROVIDER, cursor, cursor + 200, name="chat"))
        cursor += 200
        out.append(req(t0, cursor, *segs, id=f"r{i}"))
    return out


def test_fires_when_lock_waits_own_the_tail_and_names_the_lock_that_was_waited_on_most():
    analysis = analysed(service(other_lock_ms=100.0))
    [finding] = LockContention().check(analysis)
    # Tail = the 3 slowest: each waited 600 + 100 ms on locks; the median cohort 1 ms.
    assert finding.impact_ms == 699.0
    assert finding.severity == "critical" and finding.confidence == 1.0
    locks = finding.evidence["locks"]
    assert locks[0] == {"site": "rag/cache.py:41", "kind": "threading.Lock", "tail_wait_ms": 1800.0, "waits": 200}
    assert locks[1] == {"site": "rag/llm.py:9", "kind": "asyncio.Semaphore", "tail_wait_ms": 300.0, "waits": 10}
    assert "rag/cache.py:41" in finding.summary and "rag/cache.py:41" in finding.fix
    assert finding.evidence["example_request_ids"] == ["r199", "r179", "r159"]


def test_quiet_when_locks_do_not_own_the_tail():
    assert list(LockContention().check(analysed(service(slow_lock_ms=1.0)))) == []


def test_min_tail_excess_is_the_boundary():
    assert_min_tail_excess_is_the_boundary(LockContention, Thresholds, analysed(service()))


# --- every request waits: the lock dominates the median request, with no tail ----------------------


def line_up(n: int = 200, wait_ms: float = 200.0, hold_ms: float = 30.0) -> list[RequestTimeline]:
    """8 clients on one lock held `hold_ms` at a time: each request waits ~7 holds (`wait_ms`,
    plus 0-18 ms of jitter), then holds it itself. p99 is barely above p50: no tail."""
    out = []
    for i in range(n):
        t0 = i * 300.0
        wait = wait_ms + (i % 19)
        segs = [
            seg(LOCK, t0, t0 + wait, name="lock wait", **{LOCK_KIND: "threading.Lock", LOCK_SITE: "app/main.py:12"}),
            seg("app", t0 + wait, t0 + wait + hold_ms),
        ]
        out.append(req(t0, t0 + wait + hold_ms, *segs, id=f"r{i}"))
    return out


def test_fires_without_a_tail_when_every_request_waits_for_the_lock():
    analysis = analysed(line_up())
    assert not analysis.has_tail and analysis.latency.p99_ms < 1.1 * analysis.latency.p50_ms
    [finding] = LockContention().check(analysis)
    ev = finding.evidence
    # The median cohort (p40-p60 by latency) waits 207-211 ms for the lock and holds it 30 ms.
    assert ev["dominates_median"] is True
    assert 207 <= ev["median_ms"] <= 211
    assert ev["median_latency_ms"] == round(ev["median_ms"] + 30, 3)
    assert ev["share_of_median_latency"] == round(ev["median_ms"] / ev["median_latency_ms"], 4)
    assert 0.87 <= ev["share_of_median_latency"] <= 0.88
    assert ev["p99_over_p50"] < 1.1
    assert finding.severity == "critical"  # 87% of every request, >= 75%
    assert finding.confidence == 1.0  # the share, plus 0.2 for knowing the lock, capped
    assert finding.impact_ms < 20  # the tail barely differs from the median: no tail excess to speak of
    assert finding.summary.startswith(f"Every request waits for a lock: {ev['median_ms']:.0f} ms of the median request's")
    assert "threading.Lock created at app/main.py:12" in finding.summary and "app/main.py:12" in finding.fix
    assert ev["locks"][0]["site"] == "app/main.py:12" and ev["locks"][0]["waits"] == 200


def test_the_verdict_stays_null_without_a_tail_and_names_the_lock_as_typical():
    from latprof.report.verdict import decide_verdict

    analysis = analysed(line_up())
    verdict = decide_verdict(analysis, list(LockContention().check(analysis)))
    assert verdict.layer is None and verdict.rule is None and verdict.status == "no_tail"
    assert "typical latency is dominated by lock (" in verdict.summary


def test_does_not_fire_when_lock_waits_are_under_half_the_median_request():
    # 100 ms waiting of ~339 ms: 30%.
    assert list(LockContention().check(analysed(line_up(wait_ms=100.0, hold_ms=230.0)))) == []


def test_min_share_of_median_latency_is_the_boundary():
    analysis = analysed(line_up())
    share = analysis.share_of_median(LOCK)
    assert list(LockContention(Thresholds(min_share_of_median_latency=share + 0.001)).check(analysis)) == []
    assert len(list(LockContention(Thresholds(min_share_of_median_latency=share - 0.001)).check(analysis))) == 1


def test_does_not_fire_when_the_median_wait_is_under_min_median_wait_ms():
    # 5-23 ms waiting of 6-24 ms: the lock is most of the request, but a few ms is not worth a finding.
    analysis = analysed(line_up(wait_ms=5.0, hold_ms=1.0))
    assert analysis.share_of_median(LOCK) > 0.8
    assert list(LockContention().check(analysis)) == []
    assert len(list(LockContention(Thresholds(min_median_wait_ms=5.0)).check(analysis))) == 1


def test_does_not_fire_on_the_median_with_fewer_requests_than_a_verdict_needs():
    assert list(LockContention().check(analysed(line_up(n=49)))) == []


# --- end to end: a real FastAPI service under `latprof run`, 8 real clients -----------------------------


def _harness():
    """tests/collectors/hooks/apps/harness.py (starts servers under `latprof run`), whatever the import mode."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "latprof_test_hooks_harness"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "collectors" / "hooks" / "apps" / "harness.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_a_global_lock_every_request_waits_for_fails_the_check_without_a_tail(tmp_path):
    """uvicorn + FastAPI, a sync endpoint holding one global threading.Lock for 30 ms, 8 clients in a loop:
    p50 ~240 ms of which ~210 ms is lock, p99/p50 ~1.0, so no verdict - but lock-contention fires and `check` fails."""
    import json
    import subprocess
    import sys
    import time
    from concurrent.futures import ThreadPoolExecutor

    harness = _harness()
    server = harness.Server("tests.rules.apps.lock_app:app", "asyncio", "h11", tmp_path).start()
    try:
        stop = time.monotonic() + 7.0  # the first 2 s are warm-up: ~5 s of ~33 requests/s are analysed

        def client() -> int:
            sent = 0
            while time.monotonic() < stop:
                assert harness.get(server.port, "/locked?ms=30").status == 200
                sent += 1
            return sent

        with ThreadPoolExecutor(8) as pool:
            sent = sum(pool.map(lambda _: client(), range(8)))
        server.stop()  # SIGTERM: latprof forwards it and the capture is flushed
    finally:
        server.kill()
    capture = str(server.capture_path)
    out = subprocess.run([sys.executable, "-m", "latprof", "analyze", "--format", "json", capture],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    lat, verdict = report["latency_ms"], report["verdict"]
    print(f"{sent} sent; latency {lat}; verdict {verdict}")
    assert verdict["layer"] is None and verdict["status"] == "no_tail", verdict
    assert "typical latency is dominated by lock (" in verdict["summary"]
    assert lat["p99"] < 2 * lat["p50"] and 150 <= lat["p50"] <= 400
    (finding,) = [f for f in report["findings"] if f["rule"] == "lock-contention"]
    ev = finding["evidence"]
    print(f"lock-contention: {finding['summary']}")
    assert ev["dominates_median"] is True and ev["share_of_median_latency"] >= 0.6, ev
    assert finding["severity"] in ("critical", "warning")
    top = ev["locks"][0]
    assert top["kind"] == "threading.Lock" and top["site"].startswith("apps/lock_app.py:"), top

    check = subprocess.run([sys.executable, "-m", "latprof", "check", "--format", "json", capture],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode == 1, (check.stdout, check.stderr)
    results = json.loads(check.stdout)
    print(json.dumps(results)[:600])
    failed = [r for r in results["checks"] if r["outcome"] == "fail"]
    assert any(r["id"] == "rule.lock-contention" for r in failed), failed
