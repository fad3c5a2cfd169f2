"""A FastAPI service of sync (`def`) endpoints on Starlette's thread pool, traced with stock OpenTelemetry only.

Run by `otlp_harness.record_otlp` with `APP` pointed here (scenario "pool_held"): `APP_DB` is
`psycopg_pool` (a sync `psycopg_pool.ConnectionPool` of `APP_POOL_SIZE`, PsycopgInstrumentor) or
`sqlalchemy` (a sync engine on `postgresql+psycopg://`, QueuePool of `APP_POOL_SIZE` without
overflow, SQLAlchemyInstrumentor); the LLM is called with a sync `httpx.Client`
(HTTPXClientInstrumentor). The tracer provider, the FastAPI instrumentation and the untraced
`GET /health` (`async def`: the harness polls it only before the load) are `_stock_common`'s.
No span times the pool checkout.

- `GET /chat`: a connection held across an LLM call: a query, the LLM call, a second query.
- `GET /chat?llm_first=1`: the connection taken at the top of the endpoint, then the LLM call,
  then the two queries (the wait for it is before the LLM call, not before a query).
- `GET /chat?llm_first=1&pre_ms=M`: first M ms of the endpoint's own work (a sleep, no span),
  then as above (the negative: a gap before the first step with no pool behind it).
"""

from __future__ import annotations

import os
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import httpx
from fastapi import FastAPI

from tests.collectors.traces.apps._stock_common import chat_body, flush_spans, stock_app, stock_tracing

DB = os.environ.get("APP_DB", "psycopg_pool")
PG = os.environ.get("APP_PG", "postgresql://postgres@127.0.0.1:5432/test")
POOL_SIZE = int(os.environ.get("APP_POOL_SIZE", "3"))
PROVIDER_URL = os.environ.get("PROVIDER_URL", "")

provider = stock_tracing("stock-sync-pool")
if DB == "psycopg_pool":
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    PsycopgInstrumentor().instrument()

state: dict[str, Any] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        if DB == "sqlalchemy":
            from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
            from sqlalchemy import create_engine

            engine = create_engine(PG.replace("postgresql://", "postgresql+psycopg://", 1), pool_size=POOL_SIZE,
                                   max_overflow=0, pool_timeout=60)  # fmt: skip
            SQLAlchemyInstrumentor().instrument(engine=engine, skip_dep_check=True)
            state["engine"] = engine
        else:
            from psycopg_pool import ConnectionPool

            state["pool"] = ConnectionPool(PG, min_size=POOL_SIZE, max_size=POOL_SIZE, timeout=60, open=True)
            state["pool"].wait()
        state["http"] = httpx.Client(timeout=30)
        yield
    finally:
        if "http" in state:
            state["http"].close()
        if "engine" in state:
            state["engine"].dispose()
        if "pool" in state:
            state["pool"].close()
        flush_spans(provider)


app = stock_app(lifespan)


def _llm(prompt: str) -> str:
    response = state["http"].post(f"{PROVIDER_URL}/chat/completions", json=chat_body(prompt))
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


@app.get("/chat")
def chat(q: str = "where is my order?", llm_first: int = 0, pre_ms: float = 0) -> dict[str, Any]:
    if pre_ms:
        time.sleep(pre_ms / 1000)
    if "engine" in state:
        from sqlalchemy import text

        with state["engine"].connect() as conn:
            conn.execute(text("SELECT 1")).scalar()
            answer = _llm(q)
            conn.execute(text("SELECT length(:a)"), {"a": answer}).scalar()
            conn.commit()
        return {"answer": answer}
    with state["pool"].connection() as conn:
        if llm_first:
            answer = _llm(q)
            conn.execute("SELECT 1").fetchone()
        else:
            conn.execute("SELECT 1").fetchone()
            answer = _llm(q)
        conn.execute("SELECT length(%s)", (answer,)).fetchone()
    return {"answer": answer}
