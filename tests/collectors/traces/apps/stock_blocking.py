"""A FastAPI service traced with stock OpenTelemetry only, one request in N of which blocks its event loop.

Run by `otlp_harness.record_otlp` with `APP` pointed here. Spans come from the stock FastAPI,
asyncpg and httpx instrumentations only (`_stock_common`); `APP_PG` is the PostgreSQL URL,
`APP_POOL_SIZE` the asyncpg pool's size (larger than the load: no pool wait), `PROVIDER_URL`
latprof's demo provider, called with plain `httpx.AsyncClient`.

- `GET /chat?db_ms=D&llm_ms=L`: a query that takes D ms (`pg_sleep`), then a chat completion whose
  first token the provider sends after L ms (its `x-latprof-ttft-ms` header; the provider's default without).
- `GET /chat?db_ms=D&block_ms=B`: the query, then an answer "from the cache" read with a sync
  client: B ms of `time.sleep` inside the `async def` endpoint, which holds the event loop - every
  other request in flight stalls until it returns (the fault). No span covers it.
- `GET /chat?db_ms=D&wait_ms=W`: the query, then W ms awaited without a span (`asyncio.sleep`):
  the same uncovered gap, but the loop keeps serving the others (the negative, with many clients).
"""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import asyncpg
import httpx
from fastapi import FastAPI
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

from tests.collectors.traces.apps._stock_common import chat_body, flush_spans, stock_app, stock_tracing

PG = os.environ.get("APP_PG", "postgresql://postgres@127.0.0.1:5432/test")
POOL_SIZE = int(os.environ.get("APP_POOL_SIZE", "12"))
PROVIDER_URL = os.environ.get("PROVIDER_URL", "")

provider = stock_tracing("stock-blocking")
AsyncPGInstrumentor().instrument()
state: dict[str, Any] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        state["pool"] = await asyncpg.create_pool(PG, min_size=POOL_SIZE, max_size=POOL_SIZE)
        state["http"] = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100))
        yield
    finally:
        if "http" in state:
            await state["http"].aclose()
        if "pool" in state:
            await state["pool"].close()
        flush_spans(provider)


app = stock_app(lifespan)


@app.get("/chat")
async def chat(db_ms: float = 50, llm_ms: float = 0, block_ms: float = 0, wait_ms: float = 0) -> dict[str, Any]:
    async with state["pool"].acquire() as conn:
        await conn.fetchval("SELECT pg_sleep($1)", db_ms / 1000)
    if block_ms:
        time.sleep(block_ms / 1000)  # a sync cache client inside `async def`: the loop stops for everyone
        return {"answer": "cached", "blocked_ms": block_ms}
    if wait_ms:
        await asyncio.sleep(wait_ms / 1000)  # awaited: the loop serves the other requests meanwhile
        return {"answer": "cached", "waited_ms": wait_ms}
    headers = {"x-latprof-ttft-ms": str(llm_ms)} if llm_ms else {}
    response = await state["http"].post(f"{PROVIDER_URL}/chat/completions", json=chat_body("where is my order?"),
                                        headers=headers)  # fmt: skip
    response.raise_for_status()
    return {"answer": response.json()["choices"][0]["message"]["content"]}
