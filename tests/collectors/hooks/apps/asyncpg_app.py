"""A Starlette service on an asyncpg pool of 2 connections, for the asyncpg hook's end-to-end test.

`GET /db?ms=N` checks a connection out, looks a (secret) name up and keeps the connection for
a statement that sleeps N ms in PostgreSQL: with more than 2 such requests in flight, the
others wait for a connection. `$APP_PG_DSN` is the database (`postgresql://...`).
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import AsyncIterator

import asyncpg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

DSN = os.environ.get("APP_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
POOL_SIZE = 2
#: A parameter value that must never reach the capture.
SECRET = "latprof-secret-parameter-4711"


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # Both connections opened up front: requests wait for a free one, never for a connect.
    async with asyncpg.create_pool(DSN, min_size=POOL_SIZE, max_size=POOL_SIZE) as pool:
        app.state.pool = pool
        yield


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def db(request: Request) -> JSONResponse:
    seconds = float(request.query_params.get("ms", "200")) / 1000
    async with request.app.state.pool.acquire() as conn:
        found = await conn.fetchval("SELECT count(*) FROM pg_class WHERE relname = $1", SECRET)
        await conn.execute("SELECT pg_sleep($1)", seconds)
    return JSONResponse({"found": found})


app = Starlette(routes=[Route("/health", health), Route("/db", db)], lifespan=lifespan)
