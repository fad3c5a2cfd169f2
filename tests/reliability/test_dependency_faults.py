"""Faults in what the service depends on: the hooks keep working, and the service sees what it would without latprof.

- PostgreSQL and Redis go away mid-run and come back: a Starlette service on SQLAlchemy's
  QueuePool, psycopg_pool, asyncpg's pool and redis-py reaches them through proxies the test
  cuts for a few seconds under load (the shared servers are never touched). The same outage is
  played against the service without latprof, then under `latprof run`: the errors the service
  caught while the outage was steady must be the same, the capture must mark them (503 roots,
  `error.type` on segments), the pool gauges must come back to where they were, and requests
  after recovery must be recorded as before.
- The provider resets the connection mid-stream: the openai client's exception is the same
  with and without the hooks, and the LLM call's segment ends with `error.type`.
- The target of `latprof attach` exits mid-attach: a report of what was seen, exit code 0, no
  traceback, the exit said, the capture written to --out.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest
from _proxy import CutProxy
from attach.procs import ROOT, free_port, start_server
from services import PG_DSN, missing, require_pg

from latprof.capture.reader import read_captures
from latprof.layers import DB_POOL, DB_QUERY
from latprof.semconv import ERROR_TYPE, GAUGE_POOL_IN_USE, GAUGE_POOL_WAITERS, NOTE_ERROR

pytestmark = [pytest.mark.slow, pytest.mark.long]

APP = "tests.reliability._dependency_app:app"
ENDPOINTS = ("/sqlalchemy", "/psycopg_pool", "/asyncpg", "/redis")
#: How long PostgreSQL and Redis are gone.
OUTAGE_S = 4.0
#: Errors of requests sent this long after the cut (and answered before the restore) are the
#: outage's steady ones: the same in every run. Earlier ones depend on what was in flight.
STEADY_AFTER_S = 1.2
#: Every endpoint must answer again within this long of the restore (psycopg_pool reconnects with a backoff).
RECOVERY_TIMEOUT_S = 30.0
CLIENTS_PER_ENDPOINT = 2
#: A request that began this soon after the cut was begun was in flight when it happened (cutting takes a few ms).
IN_FLIGHT_MARGIN_NS = 50_000_000
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


# --- the load and its answers -------------------------------------------------------------------


@dataclass
class Answer:
    endpoint: str
    sent: float  # time.time()
    done: float
    status: int
    body: dict[str, Any]


@dataclass
class Load:
    """CLIENTS_PER_ENDPOINT threads per endpoint, each requesting it again and again while `running`."""

    port: int
    answers: list[Answer] = field(default_factory=list)
    running: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    inflight: list[int] = field(default_factory=lambda: [0])
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        for endpoint in ENDPOINTS:
            for _ in range(CLIENTS_PER_ENDPOINT):
                thread = threading.Thread(target=self._client, args=(endpoint,), daemon=True)
                thread.start()
                self.threads.append(thread)
        return self

    def _client(self, endpoint: str) -> None:
        while not self.stopped.is_set():
            with self.lock:
                go = self.running.is_set()
                if go:
                    self.inflight[0] += 1
            if not go:
                self.running.wait(0.1)
                continue
            try:
                self.answers.append(request(self.port, endpoint))
            finally:
                with self.lock:
                    self.inflight[0] -= 1
            time.sleep(0.02)

    def pause(self) -> None:
        """Stop sending and wait for the requests in flight to be answered."""
        with self.lock:
            self.running.clear()
        deadline = time.monotonic() + 40
        while self.inflight[0] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not self.inflight[0], "requests still in flight 40 s after the load paused"
        time.sleep(0.3)  # past the gauge limiter (100 ms): the probe's first checkouts read the gauges

    def close(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(30)


def request(port: int, endpoint: str) -> Answer:
    sent = time.time()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{endpoint}", timeout=30) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except OSError as exc:  # the service itself did not answer: a failure of the test's subject
        return Answer(endpoint, sent, time.time(), 0, {"error": f"client: {type(exc).__name__}", "message": str(exc)})
    try:
        body = json.loads(raw)
    except ValueError:
        body = {"error": "not json", "message": raw[:200].decode(errors="replace")}
    return Answer(endpoint, sent, time.time(), status, body)


def probe(port: int, rounds: int = 2) -> tuple[float, float, list[Answer]]:
    """Each endpoint once per round, one at a time, with nothing else running: (start, end, answers)."""
    start = time.time()
    answers = []
    for _ in range(rounds):
        for endpoint in ENDPOINTS:
            answers.append(request(port, endpoint))
        time.sleep(0.25)  # past the gauge limiter (100 ms): the next round's checkouts read them
    return start, time.time(), answers


@dataclass
class Outage:
    """What one run saw: the answers, the probes around the outage, the times."""

    answers: list[Answer]
    before: tuple[float, float, list[Answer]]
    after: tuple[float, float, list[Answer]]
    cut_at: float
    restored_at: float
    recovered_at: dict[str, float]  # endpoint -> first success sent after the restore

    def during(self, endpoint: str) -> list[Answer]:
        return [a for a in self.answers if a.endpoint == endpoint and self.cut_at <= a.sent < self.restored_at]

    def steady_errors(self, endpoint: str) -> set[tuple[str, str]]:
        """(exception, message) the service answered with for requests of the steady outage."""
        return {
            (a.body.get("error", ""), a.body.get("message", ""))
            for a in self.during(endpoint)
            if a.sent >= self.cut_at + STEADY_AFTER_S and a.done < self.restored_at and a.status != 200
        }

    def first_failure_s(self, endpoint: str) -> float | None:
        failed = [a.done for a in self.answers if a.endpoint == endpoint and a.done >= self.cut_at and a.status != 200]
        return round(min(failed) - self.cut_at, 3) if failed else None


def play_outage(command: list[str], port: int, proxies: list[CutProxy], workdir: Path, env: dict[str, str]) -> Outage:
    """Start the service, load it, cut `proxies` for OUTAGE_S, restore them, wait for recovery, stop it."""
    log = workdir / "server.log"
    proc = start_server(command, port, env=env, log=log)
    load = Load(port).start()
    try:
        load.running.set()
        time.sleep(1.0)  # every pool warm
        load.pause()
        before = probe(port)
        load.running.set()
        time.sleep(1.0)
        cut_at = time.time()
        for proxy in proxies:
            proxy.cut()
        time.sleep(OUTAGE_S)
        restored_at = time.time()
        for proxy in proxies:
            proxy.restore()
        recovered: dict[str, float] = {}
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while len(recovered) < len(ENDPOINTS) and time.monotonic() < deadline:
            for a in list(load.answers):
                if a.status == 200 and a.sent >= restored_at and a.endpoint not in recovered:
                    recovered[a.endpoint] = a.sent
            time.sleep(0.05)
        time.sleep(1.0)  # served again for a while
        load.pause()
        after = probe(port)
    finally:
        load.close()
        stop(proc)
    assert proc.returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM), (proc.returncode, log.read_text(errors="replace")[-3000:])
    # The service logs its pools' tracebacks itself (their calls pass through the hooks' wrappers):
    # none may have been raised in latprof's own code.
    assert not raised_in_latprof(log.read_text(errors="replace")), raised_in_latprof(log.read_text(errors="replace"))
    return Outage(load.answers, before, after, cut_at, restored_at, recovered)


def raised_in_latprof(log: str) -> list[str]:
    """The innermost frame of each traceback in `log` that is latprof's code."""
    found, innermost = [], None
    for line in log.splitlines() + ["(end)"]:
        if line.lstrip().startswith("File "):
            innermost = line
        elif innermost is not None and not line.startswith(" "):  # the exception line ends the traceback
            if "/latprof/" in innermost or "/collectors/" in innermost:
                found.append(innermost)
            innermost = None
    return found


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process we started (latprof passes it on to the service), by its pid."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
        raise


def uvicorn(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            "--no-access-log"]  # fmt: skip


@pytest.fixture
def proxies() -> Iterator[tuple[CutProxy, CutProxy]]:
    require_pg(PG_DSN)
    try:
        import redis

        redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_connect_timeout=3).ping()
    except Exception as exc:
        missing(f"Redis at {REDIS_HOST}:{REDIS_PORT} is unreachable: {exc}", "Redis is")
    pg = CutProxy("127.0.0.1", int(PG_DSN.rsplit(":", 1)[1].split("/")[0])).start()
    cache = CutProxy(REDIS_HOST, REDIS_PORT).start()
    try:
        yield pg, cache
    finally:
        pg.close()
        cache.close()


def _level(gauges: list[Any], name: str, pool: str, at_ns: int) -> float | None:
    """The value of gauge `name` of `pool` at `at_ns`: its last reading at or before it."""
    readings = [g for g in gauges if g.name == name and g.attrs.get("db.client.connection.pool.name") == pool and g.ts_ns <= at_ns]
    return max(readings, key=lambda g: g.ts_ns).value if readings else None


def test_postgresql_and_redis_going_away_and_coming_back(tmp_path: Path, proxies: tuple[CutProxy, CutProxy]) -> None:
    pg, cache = proxies
    env = {"APP_PG_PORT": str(pg.port), "APP_REDIS_PORT": str(cache.port)}

    # 1. Without latprof: what the service itself raises while its dependencies are gone.
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    plain_port = free_port()
    plain = play_outage(uvicorn(plain_port), plain_port, [pg, cache], plain_dir, env)

    # 2. The same outage under `latprof run`.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    port = free_port()
    capture_path = run_dir / "capture.jsonl"
    command = [sys.executable, "-m", "latprof", "run", "--out", str(capture_path), "--no-report", "--max-rate", "0", "--",
               *uvicorn(port)]  # fmt: skip
    hooked = play_outage(command, port, [pg, cache], run_dir, env)

    figures: dict[str, Any] = {"outage_s": OUTAGE_S, "endpoints": {}}
    for outage, label in ((plain, "plain"), (hooked, "latprof")):
        for endpoint in ENDPOINTS:
            during = outage.during(endpoint)
            failed = [a for a in during if a.status != 200]
            row = figures["endpoints"].setdefault(endpoint, {})
            row[label] = {
                "requests_during_outage": len(during),
                "failed": len(failed),
                "served": len(during) - len(failed),
                "first_failure_after_cut_s": outage.first_failure_s(endpoint),
                "recovered_after_restore_s": round(outage.recovered_at[endpoint] - outage.restored_at, 3)
                if endpoint in outage.recovered_at else None,
                "errors": sorted({a.body.get("error", "") for a in failed}),
                "steady": sorted(outage.steady_errors(endpoint)),
            }

    _note("dependency outage: the service's answers", figures)

    for outage in (plain, hooked):
        # the service never stopped answering; it recovered; the probes around the outage all succeeded
        assert all(a.status in (200, 503) for a in outage.answers), [a for a in outage.answers if a.status not in (200, 503)][:5]
        assert set(outage.recovered_at) == set(ENDPOINTS), (outage.recovered_at, figures)
        for answer in outage.before[2] + outage.after[2]:
            assert answer.status == 200, answer
    for endpoint in ENDPOINTS:
        # the outage was felt by each endpoint, and in its steady part it raised the same as without latprof
        assert plain.steady_errors(endpoint), (endpoint, figures)
        assert hooked.steady_errors(endpoint) == plain.steady_errors(endpoint), (endpoint, figures)

    data = read_captures([capture_path])
    assert not [q for q in data.quality if q.kind == NOTE_ERROR], [q for q in data.quality if q.kind == NOTE_ERROR]
    route = {f"GET {e}": e for e in ENDPOINTS}
    segments = data.segments_by_request

    # 3. Every failed request is in the capture as the service answered it, its failure on a segment.
    by_endpoint: dict[str, list[Any]] = defaultdict(list)
    for r in data.requests:
        if r.route in route:
            by_endpoint[route[r.route]].append(r)
    marked: dict[str, dict[str, int]] = {}
    cut_ns, restored_ns = int(hooked.cut_at * 1e9), int(hooked.restored_at * 1e9)
    for endpoint in ENDPOINTS:
        failed = [a for a in hooked.answers if a.endpoint == endpoint and a.status == 503]
        roots = [r for r in by_endpoint[endpoint] if r.status_code == 503]
        assert len(roots) == len(failed), (endpoint, len(roots), len(failed))
        types: dict[str, int] = defaultdict(int)
        unmarked = []
        for root in roots:
            errors = [s.attrs[ERROR_TYPE] for s in segments.get(root.request_id, []) if ERROR_TYPE in s.attrs]
            if not errors:
                unmarked.append(root)
            for error in set(errors):
                types[error] += 1
        # A request in flight at the cut can fail in a step no hook times (SQLAlchemy's ROLLBACK when
        # the connection closes, asyncpg's reset when it is released): its root says 503, no segment
        # says why. Every request sent after the cut has its failure on a segment.
        in_flight = [r for r in unmarked if r.start_ns <= cut_ns + IN_FLIGHT_MARGIN_NS <= r.end_ns + IN_FLIGHT_MARGIN_NS]
        assert in_flight == unmarked and len(unmarked) <= CLIENTS_PER_ENDPOINT, (endpoint, unmarked, [segments.get(r.request_id) for r in unmarked])
        marked[endpoint] = dict(types) | ({"(none: in flight at the cut)": len(unmarked)} if unmarked else {})
        # each exception class the service saw is named on a segment (SQLAlchemy wraps the driver's under the same name);
        # a request in flight at the cut may have failed unmarked, as above: at most that many answers name a class no
        # segment names (asyncpg's ConnectionDoesNotExistError, raised when the cut connection is released)
        def error_class(answer: Answer) -> str:
            return str(answer.body["error"]).rsplit(".", 1)[-1]

        at_cut = hooked.cut_at + IN_FLIGHT_MARGIN_NS / 1e9
        in_flight_at_cut = [a for a in failed if a.sent <= at_cut]
        seen_after = {error_class(a) for a in failed if a.sent > at_cut}
        assert seen_after <= set(types), (endpoint, seen_after, types)
        unnamed = [a for a in in_flight_at_cut if error_class(a) not in types]
        assert len(unnamed) <= len(unmarked), (endpoint, [a.body for a in unnamed], types, len(unmarked))
    figures["error_types_on_segments"] = marked

    # 4. After recovery: the probe's requests are recorded with their normal segments, no error.
    after_start, after_end = int(hooked.after[0] * 1e9), int(hooked.after[1] * 1e9)
    for endpoint in ENDPOINTS:
        probed = [r for r in by_endpoint[endpoint] if after_start <= r.start_ns <= after_end]
        assert len(probed) == 2, (endpoint, probed)
        for r in probed:
            assert r.status_code == 200
            found = segments.get(r.request_id, [])
            assert not [s for s in found if ERROR_TYPE in s.attrs], found
            assert [s for s in found if s.layer == DB_QUERY], (endpoint, found)
            if endpoint != "/redis":  # a redis checkout under 100 us is part of its command's segment
                assert [s for s in found if s.layer == DB_POOL], (endpoint, found)

    # 5. The pool gauges come back to their level before the outage: nothing stuck, no count leaked.
    # (A reading is emitted only when it changed: a level that stayed is the last reading, and a
    # count left behind would have made the probe's readings differ from it.)
    pools = sorted({g.attrs.get("db.client.connection.pool.name") for g in data.gauges if g.name == GAUGE_POOL_IN_USE})
    assert len(pools) == 4, pools
    levels: dict[str, Any] = {}
    for pool in pools:
        row = {}
        for name in (GAUGE_POOL_IN_USE, GAUGE_POOL_WAITERS):
            before_level = _level(data.gauges, name, pool, int(hooked.before[1] * 1e9))
            after_level = _level(data.gauges, name, pool, after_end)
            during = [g.value for g in data.gauges if g.name == name and g.attrs.get("db.client.connection.pool.name") == pool
                      and cut_ns <= g.ts_ns <= restored_ns]  # fmt: skip
            row[name] = {"before": before_level, "max_during": max(during, default=None), "after": after_level}
            assert before_level is not None and after_level == before_level, (pool, name, row)
        levels[pool] = row
    figures["gauges"] = levels

    # 6. The report of the capture shows a failed request as the service answered it.
    failed_root = next(r for r in by_endpoint["/sqlalchemy"] if r.status_code == 503)
    out = subprocess.run([sys.executable, "-m", "latprof", "analyze", str(capture_path), "--trace", failed_root.request_id,
                          "--format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    (explained,) = json.loads(out.stdout)["requests"]
    assert explained["status_code"] == 503, explained
    figures["report_of_a_failed_request"] = {k: explained[k] for k in ("route", "status_code", "latency_ms")} | {
        "findings": [f["kind"] for f in explained.get("findings", [])]}
    _note("dependency outage: the capture", {k: figures[k] for k in ("error_types_on_segments", "gauges", "report_of_a_failed_request")})


def _note(title: str, figures: dict[str, Any]) -> None:
    """Print a run's figures (shown with -rP, and on failure): outage, failures, recovery, gauges."""
    print(json.dumps({"test": title, **figures}, indent=1, default=str))


# --- the provider resets the connection mid-stream -----------------------------------------------

MESSAGES = [{"role": "user", "content": "Which layer owns the p99?"}]
#: The provider resets the connection in place of this event of the stream (the role chunk, two tokens, then RST).
RESET_AT_EVENT = 4


# The service's code: read a stream to its end, counting the events in `read`.


def _stream_chat_sync(client: Any, read: list[int]) -> None:
    stream = client.chat.completions.create(model="demo", messages=MESSAGES, stream=True,
                                            extra_body={"latprof": {"reset_after_events": RESET_AT_EVENT}})  # fmt: skip
    for _ in stream:
        read[0] += 1


def _stream_responses_sync(client: Any, read: list[int]) -> None:
    # (response.created, .in_progress, .output_item.added, .content_part.added come at once, then the deltas)
    stream = client.responses.create(model="demo", input="Which layer owns the p99?", stream=True,
                                     extra_body={"latprof": {"reset_after_events": RESET_AT_EVENT + 3}})  # fmt: skip
    for _ in stream:
        read[0] += 1


async def _stream_chat_async(client: Any, read: list[int]) -> None:
    stream = await client.chat.completions.create(model="demo", messages=MESSAGES, stream=True,
                                                  extra_body={"latprof": {"reset_after_events": RESET_AT_EVENT}})  # fmt: skip
    async for _ in stream:
        read[0] += 1


CALLS = {"chat-sync": (_stream_chat_sync, False), "responses-sync": (_stream_responses_sync, False),
         "chat-async": (_stream_chat_async, True)}  # fmt: skip


def _outcome(call: str, base_url: str) -> tuple[str, str, list[str], int]:
    """Run the call's client code against the provider: (exception class, message, its causes
    (class and message, outermost first), how many events the service had read when it failed)."""
    import openai

    fn, is_async = CALLS[call]
    read = [0]
    try:
        if is_async:
            import asyncio

            async def run() -> None:
                async with openai.AsyncOpenAI(base_url=base_url, api_key="unused") as client:
                    await fn(client, read)

            asyncio.run(run())
        else:
            with openai.OpenAI(base_url=base_url, api_key="unused") as client:
                fn(client, read)
    except Exception as exc:
        causes, cause = [], exc.__cause__ or exc.__context__
        while cause is not None and len(causes) < 5:
            causes.append(f"{type(cause).__module__}.{type(cause).__qualname__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        return f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), causes, read[0]
    return "", "", [], read[0]


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_provider_resetting_the_connection_mid_stream(call: str) -> None:
    pytest.importorskip("openai")
    from recording import recording

    from latprof.collectors.hooks import httpx as httpx_hook
    from latprof.collectors.hooks import openai as openai_hook
    from latprof.collectors.hooks import runtime
    from latprof.demo.provider import Provider
    from latprof.layers import PROVIDER
    from latprof.semconv import LAST_ERROR

    with Provider(ttft_ms=50, tpot_ms=30, output_tokens=20) as provider:
        openai_hook.uninstall()
        httpx_hook.uninstall()
        without = _outcome(call, provider.url)
        openai_hook.install()
        httpx_hook.install()
        try:
            with recording() as events:
                token = runtime.begin_request("POST /chat", runtime.now_ns())
                try:
                    started = time.monotonic()
                    hooked = _outcome(call, provider.url)
                    failed_after_s = time.monotonic() - started
                finally:
                    runtime.end_request(token)
                swallowed = runtime.errors()
        finally:
            openai_hook.uninstall()
            httpx_hook.uninstall()
        resets = provider.stats()["reset"]

    # the fault happened, mid-stream, both times; the service's exception is exactly the same
    assert resets == 2, resets
    assert without[0], without
    assert hooked == without, (hooked, without)
    # the hooks recorded the call, ended with the error, and swallowed nothing of their own
    assert not swallowed, swallowed
    assert not [e for e in events if getattr(e, "kind", None) == "error"], [e.attrs.get(LAST_ERROR) for e in events if getattr(e, "kind", None) == "error"]
    calls = [e for e in events if getattr(e, "layer", None) in (PROVIDER, "model")]
    assert calls, events
    provider_segment = [s for s in calls if s.layer == PROVIDER]
    assert len(provider_segment) == 1, calls
    ended = max(calls, key=lambda s: s.end_ns)
    assert ended.attrs.get(ERROR_TYPE) == without[0].rsplit(".", 1)[-1], [s.attrs for s in calls]
    _note(f"provider reset mid-stream ({call})", {
        "exception": without[0], "message": without[1], "causes": without[2], "events_read_before": without[3],
        "failed_after_s": round(failed_after_s, 3),
        "segments": [(s.name, s.layer, round((s.end_ns - s.start_ns) / 1e6, 1), dict(s.attrs)) for s in calls],
    })  # fmt: skip


# --- the target exits during `latprof attach` ----------------------------------------------------

#: How long attach is asked to sample, and when (after it started) the target is made to exit.
ATTACH_S = 10.0
EXIT_AFTER_S = 4.0


def _services(port: int) -> dict[str, list[str]]:
    from attach.procs import gunicorn

    return {
        # a gunicorn master and its 2 workers: attach follows the workers; SIGTERM ends them all
        "gunicorn": gunicorn(port, "-w", "2"),
        # one uvicorn process, killed outright
        "uvicorn": [sys.executable, "-m", "uvicorn", "tests.collectors.hooks.apps.app:app", "--host", "127.0.0.1",
                    "--port", str(port), "--log-level", "warning", "--no-access-log"],
    }  # fmt: skip


@pytest.mark.parametrize(("service", "how"), [("gunicorn", signal.SIGTERM), ("uvicorn", signal.SIGKILL)],
                         ids=["gunicorn-sigterm", "uvicorn-sigkill"])  # fmt: skip
def test_the_target_exiting_during_attach(tmp_path: Path, service: str, how: signal.Signals) -> None:
    from attach.procs import load

    port = free_port()
    target = start_server(_services(port)[service], port)
    workers = [p.pid for p in psutil.Process(target.pid).children(recursive=True)]
    capture = tmp_path / "attach.jsonl"
    attach: subprocess.Popen[str] | None = None
    try:
        with load(port, "/chat/1?ms=20", 3):
            started = time.monotonic()
            attach = subprocess.Popen(
                [sys.executable, "-m", "latprof", "attach", "--pid", str(target.pid), "--duration", f"{ATTACH_S:g}",
                 "--format", "json", "--out", str(capture)],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            time.sleep(EXIT_AFTER_S)
            target.send_signal(how)  # by its pid: the process this test started
            target.wait(30)
            exited_at, exited_wall_ns = time.monotonic(), time.time_ns()
            out, err = attach.communicate(timeout=60)
            ended_at = time.monotonic()
    finally:
        for pid in [target.pid, *workers]:  # whatever is left of what this test started
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        if target.poll() is None:
            target.wait(10)
        if attach is not None and attach.poll() is None:
            attach.kill()
            attach.communicate()

    assert attach.returncode == 0, err
    assert "Traceback" not in err + out, err
    assert f"PID {target.pid} exited" in err, err
    report = json.loads(out)
    assert report["source"]["kind"] == "attach"
    assert report["collection"]["samples"] > 0, report["collection"]
    assert any(f"PID {target.pid} exited" in w for w in report["collection"]["warnings"]), report["collection"]["warnings"]
    # the capture was written where asked, and reads back to the same report
    assert capture.exists() and capture.stat().st_size > 0
    data = read_captures([capture])
    assert data.samples and any(f"PID {target.pid} exited" in q.message for q in data.quality)
    again = subprocess.run([sys.executable, "-m", "latprof", "analyze", "--format", "json", str(capture)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["verdict"] == report["verdict"]
    # sampled up to the exit, nothing after it (a sample's time is the start of its one-second window)
    last_window_ns = max(s.ts_ns for s in data.samples)
    assert last_window_ns <= exited_wall_ns, (last_window_ns - exited_wall_ns) / 1e9
    _note(f"target exits during attach ({service}, {how.name})", {
        "attach_s": ATTACH_S, "exit_after_s": round(exited_at - started, 2),
        "attach_ended_after_exit_s": round(ended_at - exited_at, 2), "samples": report["collection"]["samples"],
        "processes": len({s.pid for s in data.samples}), "workers": workers,
        "last_window_started_before_exit_s": round((exited_wall_ns - last_window_ns) / 1e9, 2),
        "warnings": report["collection"]["warnings"], "verdict": report["verdict"]["summary"],
    })  # fmt: skip


# --- regression: SQLAlchemy reopens an invalidated connection after `_do_get` -------------------


def test_a_sqlalchemy_checkout_that_reopens_an_invalidated_connection_is_timed_and_marked(proxies: tuple[CutProxy, CutProxy]) -> None:
    """After PostgreSQL went away, the pool's records are invalidated; the next checkout reopens the
    record's connection in `_ConnectionRecord.checkout`, after `_do_get` returned. That reopening
    (its failure while the database is still away, its time once it is back) is the checkout's."""
    import sqlalchemy
    from recording import recording

    from latprof.collectors.hooks import runtime
    from latprof.collectors.hooks import sqlalchemy as hook
    from latprof.events import Segment
    from latprof.semconv import CONNECT_MS

    pg, _ = proxies
    hook.install()
    engine = sqlalchemy.create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/test", pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:  # the pool's one record, open
            conn.execute(sqlalchemy.text("SELECT 1"))
        outcomes = []
        with recording() as events:
            for phase in ("in flight", "away", "back"):
                token = runtime.begin_request(f"GET /{phase}", runtime.now_ns())
                try:
                    with engine.connect() as conn:
                        if phase == "in flight":
                            pg.cut()  # the connection dies under the statement: the record is invalidated
                        conn.execute(sqlalchemy.text("SELECT 1"))
                    outcomes.append((phase, None))
                except sqlalchemy.exc.OperationalError as exc:
                    outcomes.append((phase, type(exc).__name__))
                finally:
                    runtime.end_request(token)
                if phase == "away":
                    pg.restore()
        swallowed = runtime.errors()
    finally:
        engine.dispose()
        hook.uninstall()
        pg.restore()
    assert outcomes == [("in flight", "OperationalError"), ("away", "OperationalError"), ("back", None)], outcomes
    assert not swallowed, swallowed
    checkouts = {s.request_id: s for s in events if isinstance(s, Segment) and s.name == hook.SEGMENT_CHECKOUT}
    roots = {e.route: e.request_id for e in events if type(e).__name__ == "Request"}
    away, back = checkouts[roots["GET /away"]], checkouts[roots["GET /back"]]
    assert away.attrs.get(ERROR_TYPE) == "OperationalError", away  # the reopening failed inside the checkout
    assert CONNECT_MS in back.attrs and back.attrs[CONNECT_MS] > 0, back  # the reopening's time is the checkout's
    assert (back.end_ns - back.start_ns) / 1e6 >= back.attrs[CONNECT_MS]
