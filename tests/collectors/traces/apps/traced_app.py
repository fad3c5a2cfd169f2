"""A FastAPI service traced with stock OpenTelemetry only (no latprof code), exporting OTLP/HTTP.

Run it as a user would: `python -m uvicorn tests.collectors.traces.apps.traced_app:app --port P` with

- `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: where the BatchSpanProcessor's OTLPSpanExporter sends
  the spans (`http://127.0.0.1:PORT/v1/traces`), or `OTEL_EXPORTER_OTLP_ENDPOINT` (the exporter
  appends `/v1/traces`): the exporter reads its settings from the environment, as in any
  service; `OTEL_SERVICE_NAME` names the resource;
- `PROVIDER_URL`: the OpenAI-compatible provider's base URL (the official `openai` client,
  streamed); `TOOL_URL`: the tool service's base URL (`httpx.AsyncClient`);
- `APP_DB`: `sqlalchemy` (an SQLAlchemy asyncio engine on `postgresql+psycopg://`, QueuePool of
  `APP_POOL_SIZE` with no overflow), `psycopg_pool` (`psycopg_pool.AsyncConnectionPool`) or
  `asyncpg` (`asyncpg.create_pool`), or empty for no database; `APP_PG`: the PostgreSQL URL;
  `APP_POOL_SIZE` (default 3).

Instrumented with FastAPIInstrumentor (the server span and its `http send`/`http receive`
spans), HTTPXClientInstrumentor (the tool calls; openai 2.x's LLM calls too - openai 3.x runs on
httpx2, which that instrumentation does not see), and, by backend, SQLAlchemyInstrumentor,
PsycopgInstrumentor or AsyncPGInstrumentor. `/health` is excluded from tracing.

Endpoints (all `async def`, parameters by query string):

- `GET /chat`: a pooled connection held across an LLM call: a query, the LLM call inside the
  session (SQLAlchemy: transaction open), a second query, commit.
- `GET /tools?n=N&ms=M`: N independent tool calls one after another (`/customer`, `/orders`,
  `/plan`, ...; each ~M ms in the service), then one LLM call.
- `GET /agent?turns=T&ms=M`: T turns of an LLM call then a tool call whose URL comes from the
  answer (`/search?q=<first word>`), then a final LLM call.
- `GET /query?ms=M`: `SELECT pg_sleep(M / 1000.0)` through the backend.
- `GET /ok`: a quick query (when a backend is configured) and a quick LLM call.
"""

from __future__ import annotations

import os
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator
from urllib.parse import quote

import httpx
import openai
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

DB = os.environ.get("APP_DB", "")
PG = os.environ.get("APP_PG", "postgresql://postgres@127.0.0.1:5432/test")
POOL_SIZE = int(os.environ.get("APP_POOL_SIZE", "3"))
PROVIDER_URL = os.environ.get("PROVIDER_URL", "")
TOOL_URL = os.environ.get("TOOL_URL", "")
MODEL = os.environ.get("APP_MODEL", "latprof-demo-1")
#: Written to stderr once the spans are flushed at shutdown (the harness checks it).
FLUSHED_MARK = "traced_app: spans flushed:"
TOOL_NAMES = ("customer", "orders", "plan", "inventory", "shipping", "invoices", "reviews", "weather")

if DB not in ("", "sqlalchemy", "psycopg_pool", "asyncpg"):
    raise SystemExit(f"APP_DB must be sqlalchemy, psycopg_pool or asyncpg, not {DB!r}")

provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "otlp-traced-app")}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
trace.set_tracer_provider(provider)
HTTPXClientInstrumentor().instrument()
if DB == "psycopg_pool":
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    PsycopgInstrumentor().instrument()
elif DB == "asyncpg":
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

    AsyncPGInstrumentor().instrument()

state: dict[str, Any] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        if DB == "sqlalchemy":
            from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
            from sqlalchemy.ext.asyncio import create_async_engine

            engine = create_async_engine(PG.replace("postgresql://", "postgresql+psycopg://", 1), pool_size=POOL_SIZE,
                                         max_overflow=0, pool_timeout=60)  # fmt: skip
            # the instrumentation declares "sqlalchemy < 2.1" and would instrument nothing on 2.1 without
            # skip_dep_check (what a user on 2.1 has to pass); harmless on 2.0
            SQLAlchemyInstrumentor().instrument(engine=engine.sync_engine, skip_dep_check=True)
            state["engine"] = engine
        elif DB == "psycopg_pool":
            from psycopg_pool import AsyncConnectionPool

            pool = AsyncConnectionPool(PG, min_size=POOL_SIZE, max_size=POOL_SIZE, timeout=60, open=False)
            await pool.open(wait=True)
            state["pool"] = pool
        elif DB == "asyncpg":
            import asyncpg

            state["pool"] = await asyncpg.create_pool(PG, min_size=POOL_SIZE, max_size=POOL_SIZE)
        if PROVIDER_URL:
            state["llm"] = openai.AsyncOpenAI(base_url=PROVIDER_URL, api_key="unused", max_retries=0)
        state["http"] = httpx.AsyncClient(timeout=30)
        yield
    finally:
        if "http" in state:
            await state["http"].aclose()
        if "llm" in state:
            await state["llm"].close()
        if "engine" in state:
            await state["engine"].dispose()
        if "pool" in state:
            await state["pool"].close()
        flushed = provider.force_flush(10_000)  # SIGTERM -> uvicorn's lifespan shutdown: no span is lost
        provider.shutdown()
        print(f"{FLUSHED_MARK} {flushed}", file=sys.stderr, flush=True)


app = FastAPI(lifespan=lifespan)
FastAPIInstrumentor.instrument_app(app, excluded_urls="health")


async def llm(prompt: str) -> str:
    """One streamed chat completion; the answer's text."""
    stream = await state["llm"].chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                        stream=True)  # fmt: skip
    parts = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


async def tool(path: str) -> Any:
    response = await state["http"].get(f"{TOOL_URL}{path}")
    response.raise_for_status()
    return response.json()


@app.get("/health")
async def health() -> str:
    return "ok"


@app.get("/chat")
async def chat(q: str = "where is my order?") -> dict[str, Any]:
    if DB == "sqlalchemy":
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import AsyncSession

        async with AsyncSession(state["engine"]) as session:
            history = (await session.execute(text("SELECT count(*) FROM pg_catalog.pg_class WHERE relname = :q"), {"q": q})).scalar()
            answer = await llm(f"{q} ({history})")  # the connection is held, the transaction open
            stored = (await session.execute(text("SELECT length(CAST(:answer AS text))"), {"answer": answer})).scalar()
            await session.commit()
    elif DB == "psycopg_pool":
        async with state["pool"].connection() as conn:
            history = (await (await conn.execute("SELECT count(*) FROM pg_catalog.pg_class WHERE relname = %s", (q,))).fetchone())[0]
            answer = await llm(f"{q} ({history})")
            stored = (await (await conn.execute("SELECT length(%s::text)", (answer,))).fetchone())[0]
    elif DB == "asyncpg":
        async with state["pool"].acquire() as conn:
            history = await conn.fetchval("SELECT count(*) FROM pg_catalog.pg_class WHERE relname = $1", q)
            answer = await llm(f"{q} ({history})")
            stored = await conn.fetchval("SELECT length($1::text)", answer)
    else:
        answer, stored = await llm(q), None
    return {"answer": answer, "stored": stored}


@app.get("/tools")
async def tools(n: int = 1, ms: float = 100) -> dict[str, Any]:
    results = []
    for i in range(n):  # one after another, although none needs another's result
        results.append(await tool(f"/{TOOL_NAMES[i % len(TOOL_NAMES)]}?ms={ms:g}"))
    answer = await llm(f"summarise {len(results)} tool results")
    return {"tools": n, "answer": answer}


@app.get("/agent")
async def agent(turns: int = 2, ms: float = 50) -> dict[str, Any]:
    observation = "start"
    for turn in range(turns):
        answer = await llm(f"turn {turn}: {observation}")
        word = (answer.split() or ["nothing"])[0]
        observation = str(await tool(f"/search?q={quote(word)}&turn={turn}&ms={ms:g}"))
    final = await llm(f"answer from: {observation}")
    return {"turns": turns, "answer": final}


async def _query(sql_sqlalchemy: str, sql_psycopg: str, sql_asyncpg: str, value: Any) -> Any:
    if DB == "sqlalchemy":
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import AsyncSession

        async with AsyncSession(state["engine"]) as session:
            return (await session.execute(text(sql_sqlalchemy), {"v": value})).scalar()
    if DB == "psycopg_pool":
        async with state["pool"].connection() as conn:
            return (await (await conn.execute(sql_psycopg, (value,))).fetchone())[0]
    if DB == "asyncpg":
        async with state["pool"].acquire() as conn:
            return await conn.fetchval(sql_asyncpg, value)
    return None


@app.get("/query")
async def query(ms: float = 10) -> dict[str, Any]:
    await _query("SELECT pg_sleep(:v)", "SELECT pg_sleep(%s)", "SELECT pg_sleep($1)", ms / 1000.0)
    return {"slept_ms": ms}


@app.get("/ok")
async def ok() -> dict[str, Any]:
    one = await _query("SELECT :v", "SELECT %s::int", "SELECT $1::int", 1)
    answer = await llm("hello")
    return {"one": one, "answer": answer}
