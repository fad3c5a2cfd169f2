"""A Flask service that serves without hooks until the test loads them (`late`), under gunicorn sync or gthread workers.

Its PostgreSQL pools (a psycopg_pool `ConnectionPool` named `late-pool`, a SQLAlchemy engine)
and its redis client are made when the worker imports it, long before the hooks come.
`LATE_PG`: the PostgreSQL URL (default the tests' own).
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import redis
from flask import Flask, jsonify, request
from psycopg_pool import ConnectionPool
from sqlalchemy import create_engine, text

from tests.collectors.hooks.apps import late

PG = os.environ.get("LATE_PG", "postgresql://postgres@127.0.0.1:5432/test")
POOL_NAME = "late-pool"

app = Flask(__name__)
pool = ConnectionPool(PG, min_size=2, max_size=2, name=POOL_NAME, open=True, timeout=20)
engine = create_engine(PG.replace("postgresql://", "postgresql+psycopg://", 1), pool_size=2, max_overflow=0)
cache = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=5)


def _ms() -> float:
    return float(request.args.get("ms", "0")) / 1000


@app.get("/health")
def health() -> str:
    return "ok"


@app.get("/chat/<int:chat_id>")
def chat(chat_id: int) -> Any:
    time.sleep(_ms())
    return jsonify(chat=chat_id)


@app.get("/inflight")
def inflight() -> str:
    """What runs while the hooks come: it began before them, and must not be recorded."""
    with pool.connection() as conn:
        conn.execute("SELECT 1")
    time.sleep(_ms())
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    return "done"


@app.get("/db")
def db() -> str:
    with pool.connection() as conn:
        conn.execute("SELECT pg_sleep(%s)", (_ms(),))
    return "done"


@app.get("/orm")
def orm() -> str:
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_sleep(:s)"), {"s": _ms()})
    return "done"


@app.get("/cache")
def cache_get() -> str:
    cache.set("latprof-late", "1")
    return str(cache.get("latprof-late"))


@app.get("/after")
def after() -> str:
    return "ok"


def probe(phase: str) -> dict[str, Any]:
    """The running gunicorn workers' applications, found without the hooks' help (the garbage collector)."""
    from gunicorn.workers.base import Worker

    workers = [o for o in gc.get_objects() if isinstance(o, Worker)]
    return {"workers": [{"wsgi": id(w.wsgi), "wraps": id(getattr(w.wsgi, "__latprof_original__", None))} for w in workers]}


late.start(probe)
