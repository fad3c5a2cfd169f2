"""An async FastAPI service for `latprof attach` tests: blocking calls, healthy awaits, and pooled
PostgreSQL connections held across a slow LLM call.

- `GET /block?ms=N`: a blocking `time.sleep` inside `async def` (holds the event loop).
- `GET /ok?ms=N`: `await asyncio.sleep` (a healthy request: the loop is free meanwhile).
- `GET /gate?ms=N`: one request at a time through an `asyncio.Semaphore`, each holding it for N
  ms of `asyncio.sleep`: the others wait inside the process on nothing a socket shows.
- `GET /chat?ms=N`: checks a connection out of a pool of `APP_POOL_SIZE` (default 3), runs a
  query, calls the LLM (the official openai client, streamed, against `APP_PROVIDER`) *while
  holding the connection*, then stores the answer with a second query — the fault that starves
  the pool. `APP_DB=sqlalchemy` uses an SQLAlchemy asyncio engine on asyncpg (autobegin: the
  connection sits `idle in transaction` during the LLM call); `APP_DB=asyncpg` an asyncpg pool
  without a transaction (the connection sits `idle`). `APP_PG` is the PostgreSQL URL.
- `GET /llm`: the LLM call alone; with `APP_HTTP_LIMIT=N` the openai client's HTTP pool opens
  at most N connections, and the requests beyond them wait for one inside the process.
- `GET /ask`: a quick query (connection given back at once) and, with `APP_REDIS`, a Redis GET,
  then the LLM call with nothing held: the service keeps its `APP_POOL_SIZE` PostgreSQL and
  Redis connections open and idle (persistent) while the requests wait on the provider — no pool
  is at its limit.

Run it as a user would: `uvicorn tests.attach.apps.async_app:app --loop asyncio|uvloop`.
"""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI

POOL_SIZE = int(os.environ.get("APP_POOL_SIZE", "3"))
PG = os.environ.get("APP_PG", "postgresql://postgres@127.0.0.1:5432/test")
DB = os.environ.get("APP_DB", "")
state: dict[str, Any] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    if DB == "sqlalchemy":
        from sqlalchemy.ext.asyncio import create_async_engine

        state["engine"] = create_async_engine(PG.replace("postgresql://", "postgresql+asyncpg://"), pool_size=POOL_SIZE,
                                              max_overflow=0, pool_timeout=120)  # fmt: skip
    elif DB == "asyncpg":
        import asyncpg

        state["pool"] = await asyncpg.create_pool(PG, min_size=POOL_SIZE, max_size=POOL_SIZE)
    if os.environ.get("APP_REDIS"):
        import redis.asyncio

        pool = redis.asyncio.BlockingConnectionPool.from_url(os.environ["APP_REDIS"], max_connections=POOL_SIZE)
        state["redis"] = redis.asyncio.Redis(connection_pool=pool)  # waits for a connection rather than failing
        await asyncio.gather(*(state["redis"].ping() for _ in range(POOL_SIZE)))  # open them all, kept open
    if os.environ.get("APP_PROVIDER"):
        from openai import AsyncOpenAI

        limit = os.environ.get("APP_HTTP_LIMIT")  # the HTTP client's connection limit (httpx's default: 100)
        client = None
        if limit:
            import httpx

            client = httpx.AsyncClient(limits=httpx.Limits(max_connections=int(limit)), timeout=120)
        state["llm"] = AsyncOpenAI(base_url=os.environ["APP_PROVIDER"], api_key="test", max_retries=0, http_client=client)
    yield
    if "engine" in state:
        await state["engine"].dispose()
    if "pool" in state:
        await state["pool"].close()
    if "redis" in state:
        await state["redis"].aclose()


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health() -> str:
    return "ok"


@app.get("/block")
async def block(ms: float = 200) -> dict[str, float]:
    time.sleep(ms / 1000)  # the fault: a blocking call on the event loop
    return {"blocked_ms": ms}


@app.get("/ok")
async def ok(ms: float = 50) -> dict[str, float]:
    await asyncio.sleep(ms / 1000)
    return {"awaited_ms": ms}


_gate: asyncio.Semaphore | None = None


@app.get("/gate")
async def gate(ms: float = 200) -> dict[str, float]:
    global _gate
    _gate = _gate or asyncio.Semaphore(1)
    async with _gate:
        await asyncio.sleep(ms / 1000)
    return {"gated_ms": ms}


async def ask() -> str:
    stream = await state["llm"].chat.completions.create(
        model="latprof-demo-1", messages=[{"role": "user", "content": "answer briefly"}], stream=True, max_tokens=8,
    )  # fmt: skip
    parts = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


@app.get("/chat")
async def chat() -> dict[str, int]:
    if DB == "sqlalchemy":
        from sqlalchemy import text

        async with state["engine"].connect() as conn:  # held across the LLM call: the fault
            await conn.execute(text("SELECT 1"))
            answer = await ask()
            await conn.execute(text("SELECT length(:a)"), {"a": answer})
            await conn.commit()
    else:
        async with state["pool"].acquire() as conn:  # held across the LLM call, no transaction
            await conn.fetchval("SELECT 1")
            answer = await ask()
            await conn.fetchval("SELECT length($1::text)", answer)
    return {"answer_chars": len(answer)}


@app.get("/ask")
async def ask_only() -> dict[str, int]:
    async with state["pool"].acquire() as conn:  # given back before the LLM call
        await conn.fetchval("SELECT 1")
    if "redis" in state:
        await state["redis"].get("latprof-attach-test")
    answer = await ask()
    return {"answer_chars": len(answer)}


@app.get("/llm")
async def llm_only() -> dict[str, int]:
    answer = await ask()
    return {"answer_chars": len(answer)}
