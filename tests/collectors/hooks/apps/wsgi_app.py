"""A Flask application for the WSGI hook's tests, served by gunicorn under `latprof run`."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from flask import Flask, Response, jsonify, request, send_file

app = Flask(__name__)
_lock = threading.Lock()
_pool = None  # a psycopg_pool ConnectionPool of WSGI_APP_POOL_MAX connections, made on first use
_pool_lock = threading.Lock()
_lookups = ThreadPoolExecutor(8, thread_name_prefix="lookups")  # what /fanout hands its lookups to
_FILE = os.path.join(tempfile.gettempdir(), f"latprof-wsgi-test-{os.getpid()}.txt")


def _ms() -> float:
    return float(request.args.get("ms", "0")) / 1000


@app.get("/health")
def health():
    return "ok"


@app.get("/pid")
def pid():
    return str(os.getpid())


@app.route("/chat/<int:chat_id>", methods=["GET", "POST"])
def chat(chat_id: int):
    time.sleep(_ms())
    return jsonify(chat=chat_id), (201 if request.method == "POST" else 200)


@app.get("/boom")
def boom():
    raise RuntimeError("boom")


@app.get("/stream")
def stream():
    def chunks():
        for i in range(3):
            time.sleep(0.05)
            yield f"chunk {i}\n"

    return Response(chunks(), mimetype="text/plain")


@app.get("/cpu")
def cpu():
    deadline = time.thread_time() + _ms()
    n = 0
    while time.thread_time() < deadline:
        n += 1
    return jsonify(n=n)


@app.get("/file")
def file():
    with open(_FILE, "w") as f:
        f.write("x" * 10_000)
    return send_file(_FILE)


@app.get("/locked")
def locked():
    with _lock:
        time.sleep(_ms())
    return "done"


def _db_pool():
    """The process's small psycopg_pool pool of WSGI_APP_POOL_MAX connections, made on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            from psycopg_pool import ConnectionPool

            _pool = ConnectionPool(
                os.environ["WSGI_APP_PG"], min_size=int(os.environ.get("WSGI_APP_POOL_MAX", "2")),
                max_size=int(os.environ.get("WSGI_APP_POOL_MAX", "2")), name="wsgi-app", open=True,
            )  # fmt: skip
    return _pool


@app.get("/db")
def db():
    """Check a connection out of the pool and hold it for `ms`."""
    with _db_pool().connection() as conn:
        conn.execute("SELECT pg_sleep(%s)", (_ms(),))
    return "done"


@app.get("/fanout")
def fanout():
    """`n` lookups of `ms` each, run in parallel on the process's thread pool, all on the small pool."""
    pool = _db_pool()
    seconds = _ms()

    def lookup(i: int) -> int:
        with pool.connection() as conn:
            conn.execute("SELECT pg_sleep(%s)", (seconds,))
        return i

    return jsonify(done=len(list(_lookups.map(lookup, range(int(request.args.get("n", "4")))))))
