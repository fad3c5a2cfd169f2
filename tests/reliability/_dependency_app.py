"""A Starlette service on four pools (SQLAlchemy, psycopg_pool, asyncpg, redis-py) for the dependency-fault tests.

Not a test module: `uvicorn tests.reliability._dependency_app:app` from the repository root.
PostgreSQL and Redis are reached through the ports in $APP_PG_PORT and $APP_REDIS_PORT (the
tests' cuttable proxies). Each endpoint runs one statement or command; when its dependency
fails, it answers 503 with the exception it caught (`{"error": "module.Class", "message":
str(exc)}`), so a test can compare what the service saw with and without latprof.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, AsyncIterator

import asyncpg
import psycopg_pool
import redis
import sqlalchemy
from redis.backoff import NoBackoff
from redis.retry import Retry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

PG_PORT = int(os.environ["APP_PG_PORT"])
REDIS_PORT = int(os.environ["APP_REDIS_PORT"])
PG_DSN = f"postgresql://postgres@127.0.0.1:{PG_PORT}/test"
#: How long a checkout waits for a connection before the pool gives up (psycopg_pool, SQLAlchemy).
POOL_TIMEOUT_S = 0.5

engine = sqlalchemy.create_engine(
    PG_DSN.replace("postgresql://", "postgresql+psycopg://"),
    pool_size=2, max_overflow=2, pool_timeout=POOL_TIMEOUT_S, connect_args={"connect_timeout": 2},
)  # fmt: skip
cache = redis.Redis(
    connection_pool=redis.BlockingConnectionPool(
        host="127.0.0.1", port=REDIS_PORT, max_connections=4, timeout=POOL_TIMEOUT_S,
        socket_connect_timeout=2, socket_timeout=2, retry=Retry(NoBackoff(), 0),
    )
)  # fmt: skip
state: dict[str, Any] = {}


def failed(exc: BaseException) -> JSONResponse:
    kind = type(exc)
    return JSONResponse({"error": f"{kind.__module__}.{kind.__qualname__}", "message": str(exc)}, status_code=503)


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def sa(request: Request) -> JSONResponse:  # sync: runs in a worker thread
    try:
        with engine.connect() as conn:
            value = conn.execute(sqlalchemy.text("SELECT 1")).scalar()
    except Exception as exc:
        return failed(exc)
    return JSONResponse({"value": value})


async def pgpool(request: Request) -> JSONResponse:
    try:
        async with state["pgpool"].connection(timeout=POOL_TIMEOUT_S) as conn:
            cursor = await conn.execute("SELECT 1")
            value = (await cursor.fetchone())[0]
    except Exception as exc:
        return failed(exc)
    return JSONResponse({"value": value})


async def apg(request: Request) -> JSONResponse:
    try:
        async with state["asyncpg"].acquire(timeout=5) as conn:
            value = await conn.fetchval("SELECT 1")
    except Exception as exc:
        return failed(exc)
    return JSONResponse({"value": value})


def cached(request: Request) -> JSONResponse:  # sync: runs in a worker thread
    try:
        value = cache.incr("latprof:reliability:hits")
    except Exception as exc:
        return failed(exc)
    return JSONResponse({"value": value})


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    pool = psycopg_pool.AsyncConnectionPool(PG_DSN, min_size=2, max_size=4, name="reliability", open=False,
                                            kwargs={"connect_timeout": 2})  # fmt: skip
    await pool.open(wait=True, timeout=10)
    state["pgpool"] = pool
    state["asyncpg"] = await asyncpg.create_pool(PG_DSN, min_size=2, max_size=4, timeout=2)
    try:
        yield
    finally:
        await state["asyncpg"].close()
        await pool.close()
        engine.dispose()
        cache.close()


app = Starlette(
    routes=[
        Route("/health", health),
        Route("/sqlalchemy", sa),
        Route("/psycopg_pool", pgpool),
        Route("/asyncpg", apg),
        Route("/redis", cached),
    ],
    lifespan=lifespan,
)
