"""Real processes parked in specific blocking states, for `latprof attach` tests.

Usage::

    python tests/attach/scenarios.py NAME     # enter state NAME
    python tests/attach/scenarios.py --list   # print the scenario names

Puts a thread named ``target`` of this process into state NAME, checks the state
was really reached, prints one line ``READY <native tid of target>`` and stays in
the state >= 60 s (waits last 120 s; the process exits by itself after LIFETIME
s). Helper servers run in daemon threads on 127.0.0.1, port 0. PostgreSQL and
Redis on 127.0.0.1 are needed (env LATPROF_TEST_PG as the other tests, LATPROF_TEST_REDIS_PORT).

Scenarios (what the target thread is doing; every wait lasts 120 s):

- sqlalchemy_pool_wait: engine.connect(), the only pooled connection held by a holder
- psycopg_pool_wait: psycopg_pool ConnectionPool.connection(), max_size=1, held
- redis_pool_wait: client.get() waiting for BlockingConnectionPool(max_connections=1)
  whose only connection a holder thread uses for a BLPOP
- redis_command: BLPOP on an empty key
- psycopg_query / sqlalchemy_query: SELECT pg_sleep(120), plain psycopg 3 / SQLAlchemy
- psycopg2_query: the same through SQLAlchemy on psycopg2 (no psycopg2 Python frame)
- sqlite_query: a long recursive count in SQLite through SQLAlchemy (in C, no frame)
- httpx_pool_wait: client.get() waiting for the httpx pool (max_connections=1)
- httpx_headers: httpx.get() to a server that sends no headers for 120 s
- openai_first_token: chat.completions.create(stream=True), the provider is silent
- openai_stream_stall: iterating the stream after one SSE chunk, the provider stalls
- openai_retry_sleep: create() sleeping in the client's backoff after 429 retry-after: 120
- tenacity_sleep / backoff_sleep: the library's retry sleep after a first failure
- lock_wait: lock.acquire() on a threading.Lock a holder keeps
- cpu: a pure-Python busy loop
- plain_sleep: time.sleep(120) called from app code
- future_wait: future.result() on a ThreadPoolExecutor task
- semaphore_wait: Semaphore.acquire on a threading.Semaphore(1) a holder keeps
- backoff_predicate_sleep: backoff.on_predicate sleeping after a falsy result
- httpx2_headers: httpx2.get (no openai) to a server that sends no headers
- asyncio_idle: an event loop with nothing to do
- anyio_worker_idle: anyio's worker thread waiting for its next call (the target)
- executor_idle: an idle ThreadPoolExecutor worker after one trivial task; the
  target is that worker (thread name ``target_0``)
"""

from __future__ import annotations

import http.server
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

PG_DSN = os.environ.get("LATPROF_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test").replace("+psycopg", "")
SA_URL = PG_DSN.replace("postgresql://", "postgresql+psycopg://", 1)
REDIS_HOST = "127.0.0.1"
REDIS_PORT = int(os.environ.get("LATPROF_TEST_REDIS_PORT", "6379"))
BLOCK_S = 120  # how long every blocking call lasts
SETTLE_S = 0.3  # time given to the target to reach its blocking call
LIFETIME = 600  # the process exits by itself after this many seconds
TAG = f"latprof-attach-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # unique key / app name

SCENARIOS: dict[str, Callable[[], Target]] = {}
_keep: list[object] = []  # objects (connections, clients) that must stay alive


@dataclass
class Target:
    """What a scenario returns: the target body, plus how to tell it arrived."""

    body: Callable[[], object] | None  # run in the thread named "target"
    reached: Callable[[], bool] | None = None  # polled until true after the start
    tid: int | None = None  # set instead of body when the target already exists


def scenario(fn: Callable[[], Target]) -> Callable[[], Target]:
    SCENARIOS[fn.__name__] = fn
    return fn


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            sys.exit(f"scenario setup failed: {what} not reached in {timeout} s")
        time.sleep(0.05)


def start_holder(body: Callable[[threading.Event], object]) -> None:
    """Run body(has_it) in a daemon thread; return once it set has_it."""
    has_it = threading.Event()
    threading.Thread(target=body, args=(has_it,), name="holder", daemon=True).start()
    wait_until(has_it.is_set, "holder owns its resource")


# ---------------------------------------------------------------- local servers

SSE_CHUNK = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
)


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /slow: headers after BLOCK_S.  POST /v1/chat/completions: per `mode`."""

    mode = "delay"  # delay | stall | 429
    seen = threading.Event()  # set when a request arrived (429: once answered)

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).seen.set()
        time.sleep(BLOCK_S)
        self._send(200, b"ok", "text/plain")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.mode == "429":  # `seen` only once the 429 has been served
            body = b'{"error": {"message": "slow down", "type": "rate_limit"}}'
            self._send(429, body, "application/json", {"retry-after": "120"})
            type(self).seen.set()
            return
        type(self).seen.set()
        if self.mode == "stall":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            self.wfile.write(SSE_CHUNK)
            self.wfile.flush()
            time.sleep(BLOCK_S)
        else:
            time.sleep(BLOCK_S)
            self._send(200, b"{}", "application/json")

    def _send(
        self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


def start_server(mode: str = "delay") -> str:
    """Start the local server in a daemon thread; return its base URL."""
    _Handler.mode = mode
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="server", daemon=True).start()
    _keep.append(server)
    return f"http://127.0.0.1:{server.server_address[1]}"


# ---------------------------------------------------------------- state probes


def pg_query_active(app_name: str) -> Callable[[], bool]:
    """A probe: is a backend with this application_name running pg_sleep?"""
    import psycopg

    def probe() -> bool:
        with psycopg.connect(PG_DSN, autocommit=True) as c:
            row = c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND state = 'active' AND query ILIKE '%%pg_sleep%%'",
                (app_name,),
            ).fetchone()
        return bool(row and row[0])

    return probe


def redis_in_blpop(client_name: str) -> Callable[[], bool]:
    """A probe: is the redis client with this name blocked in BLPOP?"""
    import redis

    r = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)

    def probe() -> bool:
        return any(
            c.get("name") == client_name and c.get("cmd") == "blpop"
            for c in r.client_list()
        )

    return probe


# ---------------------------------------------------------------- scenarios


@scenario
def sqlalchemy_pool_wait() -> Target:
    import sqlalchemy as sa

    engine = sa.create_engine(SA_URL, pool_size=1, max_overflow=0, pool_timeout=BLOCK_S)

    def hold(has_it: threading.Event) -> None:
        conn = engine.connect()
        conn.exec_driver_sql("SELECT 1")
        _keep.append(conn)
        has_it.set()

    start_holder(hold)
    return Target(lambda: engine.connect())


@scenario
def psycopg_pool_wait() -> Target:
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(PG_DSN, min_size=1, max_size=1, timeout=BLOCK_S, open=True)
    pool.wait()
    _keep.append(pool)

    def hold(has_it: threading.Event) -> None:
        _keep.append(pool.getconn())
        has_it.set()

    def body() -> None:
        with pool.connection() as conn:
            conn.execute("SELECT 1")

    start_holder(hold)
    return Target(body)


@scenario
def redis_pool_wait() -> Target:
    import redis

    pool = redis.BlockingConnectionPool(
        host=REDIS_HOST,
        port=REDIS_PORT,
        max_connections=1,
        timeout=BLOCK_S,
        client_name=TAG,
    )
    client = redis.Redis(connection_pool=pool)
    threading.Thread(
        target=client.blpop, args=(TAG, BLOCK_S), name="holder", daemon=True
    ).start()
    wait_until(redis_in_blpop(TAG), "holder in BLPOP")
    return Target(lambda: client.get(TAG + ":other"))


@scenario
def redis_command() -> Target:
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, client_name=TAG)
    return Target(lambda: client.blpop(TAG, BLOCK_S), reached=redis_in_blpop(TAG))


@scenario
def psycopg_query() -> Target:
    import psycopg

    def body() -> None:
        psycopg.connect(PG_DSN, application_name=TAG).execute(
            f"SELECT pg_sleep({BLOCK_S})"
        )

    return Target(body, reached=pg_query_active(TAG))


@scenario
def sqlalchemy_query() -> Target:
    import sqlalchemy as sa

    engine = sa.create_engine(SA_URL, connect_args={"application_name": TAG})

    def body() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text(f"SELECT pg_sleep({BLOCK_S})"))

    return Target(body, reached=pg_query_active(TAG))


@scenario
def psycopg2_query() -> Target:
    """SELECT pg_sleep through SQLAlchemy on psycopg2, whose execute has no Python frame."""
    import sqlalchemy as sa

    engine = sa.create_engine(SA_URL.replace("+psycopg://", "+psycopg2://", 1), connect_args={"application_name": TAG})

    def body() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text(f"SELECT pg_sleep({BLOCK_S})"))

    return Target(body, reached=pg_query_active(TAG))


@scenario
def sqlite_query() -> Target:
    """A long SQLite statement (a recursive count) through SQLAlchemy: C code, no Python frame."""
    import sqlalchemy as sa

    engine = sa.create_engine("sqlite://")
    count = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000000) SELECT max(x) FROM c"

    def body() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text(count))

    return Target(body)


@scenario
def httpx_pool_wait() -> Target:
    import httpx

    url = start_server() + "/slow"
    client = httpx.Client(timeout=None, limits=httpx.Limits(max_connections=1))
    threading.Thread(target=client.get, args=(url,), name="holder", daemon=True).start()
    wait_until(_Handler.seen.is_set, "holder's request at the server")
    return Target(lambda: client.get(url))


@scenario
def httpx_headers() -> Target:
    import httpx

    url = start_server() + "/slow"
    return Target(lambda: httpx.get(url, timeout=None), reached=_Handler.seen.is_set)


def _chat_stream(mode: str, max_retries: int = 2) -> Callable[[], Any]:
    """Start the fake provider in `mode`; return a call of create(stream=True)."""
    from openai import OpenAI

    base = start_server(mode)
    client = OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=max_retries)
    return lambda: client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )


@scenario
def openai_first_token() -> Target:
    return Target(_chat_stream("delay"), reached=_Handler.seen.is_set)


@scenario
def openai_stream_stall() -> Target:
    create = _chat_stream("stall")
    first_chunk = threading.Event()

    def body() -> None:
        for _chunk in create():
            first_chunk.set()

    return Target(body, reached=first_chunk.is_set)


@scenario
def openai_retry_sleep() -> Target:
    return Target(_chat_stream("429", max_retries=5), reached=_Handler.seen.is_set)


def _flaky(decorator: Callable[[Callable[[], None]], Callable[[], None]]) -> Target:
    """A target running decorator(flaky), where flaky fails on its first call."""
    failed = threading.Event()

    @decorator
    def flaky() -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("first attempt fails")

    return Target(flaky, reached=failed.is_set)


@scenario
def tenacity_sleep() -> Target:
    from tenacity import retry, stop_after_attempt, wait_fixed

    return _flaky(retry(wait=wait_fixed(BLOCK_S), stop=stop_after_attempt(3)))


@scenario
def backoff_sleep() -> Target:
    import backoff

    return _flaky(
        backoff.on_exception(
            backoff.constant, Exception, interval=BLOCK_S, jitter=None, max_tries=3
        )
    )


@scenario
def lock_wait() -> Target:
    lock = threading.Lock()

    def hold(has_it: threading.Event) -> None:
        lock.acquire()
        has_it.set()
        threading.Event().wait()  # keep the lock forever

    def body() -> None:
        lock.acquire()

    start_holder(hold)
    return Target(body)


@scenario
def cpu() -> Target:
    def spin() -> None:
        n = 0
        while True:
            n = (n * 31 + 7) % 1_000_003

    return Target(spin)


@scenario
def plain_sleep() -> Target:
    def body() -> None:
        time.sleep(BLOCK_S)

    return Target(body)


@scenario
def future_wait() -> Target:
    pool = ThreadPoolExecutor(1)
    _keep.append(pool)
    return Target(lambda: pool.submit(time.sleep, BLOCK_S).result())


@scenario
def executor_idle() -> Target:
    # The target is the pool's own idle worker (named target_0), not a thread of ours.
    pool = ThreadPoolExecutor(1, thread_name_prefix="target")
    _keep.append(pool)
    return Target(None, tid=pool.submit(threading.get_native_id).result())


@scenario
def semaphore_wait() -> Target:
    """A threading.Semaphore(1) a holder keeps: Semaphore.acquire is Python, Condition.wait inside."""
    sem = threading.Semaphore(1)

    def hold(has_it: threading.Event) -> None:
        sem.acquire()
        has_it.set()
        threading.Event().wait()

    start_holder(hold)
    return Target(sem.acquire)


@scenario
def backoff_predicate_sleep() -> Target:
    """backoff.on_predicate sleeping after a falsy first result."""
    import backoff

    answered = threading.Event()

    @backoff.on_predicate(backoff.constant, interval=BLOCK_S, jitter=None, max_tries=3)
    def poll() -> bool:
        first = not answered.is_set()
        answered.set()
        return not first

    return Target(poll, reached=answered.is_set)


@scenario
def httpx2_headers() -> Target:
    """httpx2 (what openai 3.x runs on), used without openai: an HTTP read is a tool call."""
    import httpx2

    url = start_server() + "/slow"
    return Target(lambda: httpx2.get(url, timeout=None), reached=_Handler.seen.is_set)


@scenario
def asyncio_idle() -> Target:
    """An event loop with nothing to do, parked in its selector."""
    import asyncio

    return Target(lambda: asyncio.run(asyncio.sleep(BLOCK_S)))


@scenario
def anyio_worker_idle() -> Target:
    """anyio's worker thread (FastAPI's sync endpoints run there) waiting for its next call."""
    import anyio
    import anyio.to_thread

    tids: list[int] = []
    started = threading.Event()

    async def main() -> None:
        tids.append(await anyio.to_thread.run_sync(threading.get_native_id))
        started.set()
        await anyio.sleep(BLOCK_S)  # the worker idles until the loop ends

    threading.Thread(target=lambda: anyio.run(main), name="loop", daemon=True).start()
    wait_until(started.is_set, "anyio worker ran one call")
    return Target(None, tid=tids[0])


# ---------------------------------------------------------------- main


def run(name: str) -> int:
    """Enter state `name`; return the native tid of the target thread."""
    target = SCENARIOS[name]()
    if target.body is None:
        time.sleep(SETTLE_S)
        return target.tid  # type: ignore[return-value]
    tid: list[int] = []
    failed: list[BaseException] = []

    def main() -> None:
        tid.append(threading.get_native_id())
        try:
            target.body()  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001  # reported instead of READY
            failed.append(exc)

    thread = threading.Thread(target=main, name="target", daemon=True)
    thread.start()
    if target.reached is not None:
        wait_until(lambda: target.reached() or bool(failed), f"{name} state")  # type: ignore[misc]
    time.sleep(SETTLE_S)
    if failed or not thread.is_alive():
        sys.exit(f"scenario {name}: target left its state early: {failed[:1]!r}")
    return tid[0]


def cli(argv: list[str]) -> int:
    if argv == ["--list"]:
        print("\n".join(SCENARIOS))
        return 0
    if len(argv) != 1 or argv[0] not in SCENARIOS:
        print(f"usage: {sys.argv[0]} NAME | --list", file=sys.stderr)
        return 2
    tid = run(argv[0])
    print(f"READY {tid}", flush=True)
    time.sleep(LIFETIME)
    os._exit(0)  # do not wait for blocked daemon threads / pool finalizers


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
