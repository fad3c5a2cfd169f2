"""The small AI service `latprof demo` runs under `latprof run`: FastAPI, SQLAlchemy, openai.

Configured by environment variables (set by `latprof.demo.run`):

- LATPROF_DEMO_DSN: SQLAlchemy URL (async driver: sqlite+aiosqlite, postgresql+psycopg);
- LATPROF_DEMO_POOL_SIZE: pool size (max_overflow is always 0);
- LATPROF_DEMO_PROVIDER_URL: base URL of the demo provider;
- LATPROF_DEMO_PROVIDER_CA: a CA certificate (PEM) to trust when the provider serves HTTPS;
- LATPROF_DEMO_THREADPOOL_TOKENS: worker threads of anyio's default limiter (sync endpoints);
- LATPROF_DEMO_EXPORT_BLOCK_MS: how long `/export` blocks the event loop;
- LATPROF_DEMO_LLM_MAX_CONNECTIONS: the most connections the shared async LLM client opens (0: httpx's default);
- LATPROF_DEMO_TRACES: traced with stock OpenTelemetry (and a GenAI instrumentation) instead of
  latprof's hooks (`latprof.demo.otel`), for `latprof demo --traces`.

Routes: `/chat` holds its connection across the streamed LLM call (the bug);
`/chat-released` reads, releases the connection, then calls the LLM (the fix);
`/chat-new-client` does the same with an openai client made for the request (a bug: each call
opens its own connection); `/chat-sync` is a sync endpoint (thread pool) doing the fixed version with blocking clients;
`/export` is an async endpoint that makes a blocking call on the event loop (the other bug);
`/agent` is an agent loop whose successive LLM calls resend the whole history, each turn
appending the previous answer and a tool result: most requests take 2 turns, a few 10
(the growing context).
Every LLM call streams and asks for usage, so the hooks record output tokens.
"""

from __future__ import annotations

import gc
import os
import random
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
import httpx
import openai
from fastapi import FastAPI
from openai.types.chat import ChatCompletionMessageParam
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine

DSN = os.environ.get("LATPROF_DEMO_DSN", "sqlite+aiosqlite:///latprof-demo.db")
POOL_SIZE = int(os.environ.get("LATPROF_DEMO_POOL_SIZE", "3"))
PROVIDER_URL = os.environ.get("LATPROF_DEMO_PROVIDER_URL", "http://127.0.0.1:8911/v1")
THREADPOOL_TOKENS = int(os.environ.get("LATPROF_DEMO_THREADPOOL_TOKENS", "40"))
EXPORT_BLOCK_MS = float(os.environ.get("LATPROF_DEMO_EXPORT_BLOCK_MS", "300"))
TRACES = os.environ.get("LATPROF_DEMO_TRACES", "")
MODEL = "latprof-demo-1"
TABLE = "latprof_demo_messages"

_SELECT = text(
    f"SELECT id, body FROM {TABLE} WHERE chat_id = :chat_id ORDER BY id DESC LIMIT 5"
)


def sync_dsn(dsn: str) -> str:
    """The blocking-driver URL of the same database (for the sync endpoint)."""
    return dsn.replace("sqlite+aiosqlite:", "sqlite:", 1)


engine = create_async_engine(DSN, pool_size=POOL_SIZE, max_overflow=0, pool_timeout=60)
sync_engine = create_engine(
    sync_dsn(DSN), pool_size=POOL_SIZE, max_overflow=0, pool_timeout=60
)
PROVIDER_CA = os.environ.get("LATPROF_DEMO_PROVIDER_CA", "")
_verify: Any = ssl.create_default_context(cafile=PROVIDER_CA) if PROVIDER_CA else True
LLM_MAX_CONNECTIONS = int(os.environ.get("LATPROF_DEMO_LLM_MAX_CONNECTIONS", "0"))
_limits: dict[str, Any] = (
    {"limits": httpx.Limits(max_connections=LLM_MAX_CONNECTIONS, max_keepalive_connections=LLM_MAX_CONNECTIONS)}
    if LLM_MAX_CONNECTIONS else {}
)
llm = openai.AsyncOpenAI(
    base_url=PROVIDER_URL, api_key="latprof-demo", max_retries=0, timeout=60,
    http_client=openai.DefaultAsyncHttpxClient(verify=_verify, **_limits),
)
sync_llm = openai.OpenAI(
    base_url=PROVIDER_URL, api_key="latprof-demo", max_retries=0, timeout=60,
    http_client=openai.DefaultHttpxClient(verify=_verify),
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    anyio.to_thread.current_default_thread_limiter().total_tokens = THREADPOOL_TOKENS
    async with engine.begin() as conn:
        await conn.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {TABLE} (id INTEGER PRIMARY KEY, chat_id INTEGER, body TEXT)"
            )
        )
        count = (await conn.execute(text(f"SELECT COUNT(*) FROM {TABLE}"))).scalar_one()
        if not count:
            rows = [
                {"id": i, "chat_id": i % 50, "body": f"message {i}"} for i in range(500)
            ]
            await conn.execute(
                text(
                    f"INSERT INTO {TABLE} (id, chat_id, body) VALUES (:id, :chat_id, :body)"
                ),
                rows,
            )
    # Warm up as a production service would: the openai client imports its resources (about
    # 500 modules on some releases) at their first use, and the collector's full pass over
    # them then stalls the loop for 150-200 ms in the middle of the load. Import them now and
    # collect once, so that the demo shows its fault, not a garbage-collection pause.
    _ = llm.chat.completions, sync_llm.chat.completions
    gc.collect()
    try:
        yield
    finally:
        await llm.close()
        sync_llm.close()
        await engine.dispose()
        sync_engine.dispose()
        if tracing is not None:
            from latprof.demo.otel import shutdown

            shutdown(tracing)


app = FastAPI(lifespan=lifespan)
tracing: Any = None
if TRACES:
    from latprof.demo.otel import setup

    tracing = setup(TRACES, app, [engine.sync_engine, sync_engine])


def _messages(rows: Any, chat_id: int) -> list[ChatCompletionMessageParam]:
    history = " ".join(row.body for row in rows)
    return [
        {"role": "system", "content": "You are the latprof demo assistant."},
        {"role": "user", "content": f"chat {chat_id}: {history}. Answer briefly."},
    ]


async def _stream_answer(messages: list[ChatCompletionMessageParam], client: openai.AsyncOpenAI | None = None) -> str:
    stream = await (client or llm).chat.completions.create(
        model=MODEL,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


@app.get("/health")
async def health() -> dict[str, str]:
    return {"ok": "yes"}


@app.get("/chat")
async def chat(chat_id: int = 1) -> dict[str, Any]:
    """The bug: the connection stays checked out (no write transaction) during the LLM call."""
    async with engine.connect() as conn:
        rows = (await conn.execute(_SELECT, {"chat_id": chat_id})).all()
        answer = await _stream_answer(_messages(rows, chat_id))
    return {"chat": chat_id, "answer": answer}


@app.get("/chat-released")
async def chat_released(chat_id: int = 1) -> dict[str, Any]:
    """The fix: read, give the connection back, then call the LLM."""
    async with engine.connect() as conn:
        rows = (await conn.execute(_SELECT, {"chat_id": chat_id})).all()
    answer = await _stream_answer(_messages(rows, chat_id))
    return {"chat": chat_id, "answer": answer}


@app.get("/chat-new-client")
async def chat_new_client(chat_id: int = 1) -> dict[str, Any]:
    """Another bug: a client made per request, whose call opens (and pays for) a connection of its own."""
    async with engine.connect() as conn:
        rows = (await conn.execute(_SELECT, {"chat_id": chat_id})).all()
    async with openai.AsyncOpenAI(base_url=PROVIDER_URL, api_key="latprof-demo", max_retries=0, timeout=60,
                                  http_client=openai.DefaultAsyncHttpxClient(verify=_verify)) as client:  # fmt: skip
        answer = await _stream_answer(_messages(rows, chat_id), client)
    return {"chat": chat_id, "answer": answer}


@app.get("/chat-sync")
def chat_sync(chat_id: int = 1) -> dict[str, Any]:
    """A sync endpoint: runs on anyio's thread pool, blocking for the whole LLM call."""
    with sync_engine.connect() as conn:
        rows = conn.execute(_SELECT, {"chat_id": chat_id}).all()
    stream = sync_llm.chat.completions.create(
        model=MODEL,
        messages=_messages(rows, chat_id),
        stream=True,
        stream_options={"include_usage": True},
    )
    answer = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    return {"chat": chat_id, "answer": answer}


@app.get("/export")
async def export(chat_id: int = 1) -> dict[str, Any]:
    """The blocking call: an `async def` endpoint that renders its export synchronously."""
    async with engine.connect() as conn:
        rows = (await conn.execute(_SELECT, {"chat_id": chat_id})).all()
    document = _render_export(rows)  # on the event loop: every request in flight waits for it
    return {"chat": chat_id, "bytes": len(document)}


#: `/agent`: the share of requests whose loop runs `AGENT_LONG_TURNS` turns (the others run 2),
#: drawn from a seeded stream; each turn appends a tool result of `AGENT_TOOL_RESULT_CHARS`.
AGENT_LONG_SHARE = 0.06
AGENT_LONG_TURNS = 10
AGENT_TOOL_RESULT_CHARS = 3000
_agent_draws = random.Random(23)


@app.get("/agent")
async def agent(chat_id: int = 1) -> dict[str, Any]:
    """An agent loop: every turn sends the whole conversation so far, which grows by an answer
    and a tool result each turn; the long loops' last calls carry thousands of input tokens."""
    turns = AGENT_LONG_TURNS if _agent_draws.random() < AGENT_LONG_SHARE else 2
    async with engine.connect() as conn:
        rows = (await conn.execute(_SELECT, {"chat_id": chat_id})).all()
    messages = _messages(rows, chat_id)
    answer = ""
    for turn in range(turns):
        answer = await _stream_answer(messages)
        messages.append({"role": "assistant", "content": answer})
        result = f"tool result {chat_id}.{turn}: " + "rows " * (AGENT_TOOL_RESULT_CHARS // 5)
        messages.append({"role": "user", "content": result})
    return {"chat": chat_id, "turns": turns, "answer": answer}


def _render_export(rows: Any) -> str:
    """Stands in for a sync SDK or HTTP client call (or PDF rendering) made inside `async def`."""
    time.sleep(EXPORT_BLOCK_MS / 1000)
    return "\n".join(row.body for row in rows)
