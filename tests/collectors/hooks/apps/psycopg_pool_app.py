"""A FastAPI service for the psycopg_pool hook's end-to-end test: an async endpoint on an AsyncConnectionPool of 2.

`GET /work?ms=N` checks a connection out of the pool and holds it for a `pg_sleep` of N ms;
more concurrent requests than connections queue in the pool. Settings from the environment:
APP_PG_CONNINFO (a libpq conninfo or URL) and APP_POOL_MAX (connections, default 2).
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI
from psycopg_pool import AsyncConnectionPool

CONNINFO = os.environ.get("APP_PG_CONNINFO", "postgresql://postgres@127.0.0.1:5432/test")
POOL_MAX = int(os.environ.get("APP_POOL_MAX", "2"))
POOL_NAME = "app-pool"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Made and opened on the server's loop; full before the first request.
    pool = AsyncConnectionPool(
        CONNINFO, min_size=POOL_MAX, max_size=POOL_MAX, open=False, name=POOL_NAME, timeout=30,
        kwargs={"connect_timeout": 5},
    )  # fmt: skip
    await pool.open(wait=True, timeout=20)
    app.state.pool = pool
    try:
        yield
    finally:
        await pool.close()


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health() -> dict[str, str]:
    return {"ok": "yes"}


@app.get("/work")
async def work(ms: float = 150) -> dict[str, float]:
    pool: AsyncConnectionPool = app.state.pool
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_sleep(%s)", (ms / 1000,))
    return {"held_ms": ms}
