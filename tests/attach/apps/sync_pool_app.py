"""A FastAPI service with sync endpoints on a small SQLAlchemy pool, for `latprof attach` tests.

`GET /db?ms=N` runs in anyio's worker thread pool (a sync endpoint), checks a connection out of
a QueuePool of `APP_POOL_SIZE` (default 2, no overflow) and holds it for a `pg_sleep` of N ms.
More concurrent requests than connections wait in the pool's checkout. `APP_PG` is the
PostgreSQL URL (psycopg 3).
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from sqlalchemy import create_engine, text

engine = create_engine(
    os.environ.get("APP_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    pool_size=int(os.environ.get("APP_POOL_SIZE", "2")), max_overflow=0, pool_timeout=60,
)  # fmt: skip
app = FastAPI()


@app.get("/health")
def health() -> str:
    return "ok"


@app.get("/db")
def db(ms: float = 80) -> dict[str, float]:
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_sleep(:s)"), {"s": ms / 1000})
    return {"held_ms": ms}
