"""A Starlette service on a small redis.asyncio BlockingConnectionPool, for the redis hook's end-to-end test.

`GET /reserve/{seat}?ms=N` reserves a seat with redis's optimistic (lock-free) transaction:
WATCH the seat's key, read it, do the slow part of the critical section (N ms, standing for
the LLM or HTTP call a service makes while deciding), then MULTI / SET / EXEC. WATCH checks a
connection out of the pool and keeps it until EXEC has run, so each request holds a pooled
connection for N ms, and with more requests in flight than connections the others wait in
the pool. Settings come from the environment: LATPROF_TEST_REDIS (URL),
LATPROF_TEST_REDIS_POOL (max_connections), LATPROF_TEST_REDIS_PREFIX (every key starts with
it; keys expire after a minute) and LATPROF_TEST_REDIS_SECRET (written into keys and values,
so that a test can check that none reaches the capture).
"""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from typing import AsyncIterator

from redis.asyncio import BlockingConnectionPool, Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

URL = os.environ.get("LATPROF_TEST_REDIS", "redis://127.0.0.1:6379/0")
POOL_SIZE = int(os.environ.get("LATPROF_TEST_REDIS_POOL", "2"))
PREFIX = os.environ.get("LATPROF_TEST_REDIS_PREFIX", "latprof-test:redis-app")
SECRET = os.environ.get("LATPROF_TEST_REDIS_SECRET", "not-a-secret")

pool = BlockingConnectionPool.from_url(URL, max_connections=POOL_SIZE, timeout=30)
client = Redis(connection_pool=pool)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
    await client.aclose()
    await pool.disconnect()


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def reserve(request: Request) -> JSONResponse:
    ms = float(request.query_params.get("ms", "200"))
    key = f"{PREFIX}:seat:{request.path_params['seat']}:{SECRET}"
    async with client.pipeline(transaction=True) as pipe:
        await pipe.watch(key)
        taken = await pipe.get(key)
        await asyncio.sleep(ms / 1000)  # the slow part of the critical section, connection held
        pipe.multi()
        pipe.set(key, f"reserved-by-{SECRET}", ex=60)
        await pipe.execute()
    return JSONResponse({"reserved": taken is None})


app = Starlette(routes=[Route("/health", health), Route("/reserve/{seat}", reserve)], lifespan=lifespan)
