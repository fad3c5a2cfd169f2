"""A FastAPI service traced with stock OpenTelemetry only, whose LLM calls go through an httpx client with a small pool.

Run by `otlp_harness.record_otlp` with `APP` pointed here. Spans come from the stock FastAPI and httpx
instrumentations only (`_stock_common`); `PROVIDER_URL` is latprof's demo provider, called through one
shared `httpx.AsyncClient(limits=httpx.Limits(max_connections=HTTP_LIMIT))` (`HTTP_LIMIT` from the
environment, 2 by default). httpx's span starts before the call waits for one of those connections:
with more requests in flight than the limit, the wait is inside the LLM call's span.

- `GET /chat`: one chat completion through the limited client.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import httpx
from fastapi import FastAPI

from tests.collectors.traces.apps._stock_common import chat_body, flush_spans, stock_app, stock_tracing

PROVIDER_URL = os.environ.get("PROVIDER_URL", "")
HTTP_LIMIT = int(os.environ.get("HTTP_LIMIT", "2"))

provider = stock_tracing("stock-http-limit")
state: dict[str, Any] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state["http"] = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=HTTP_LIMIT))
    try:
        yield
    finally:
        await state["http"].aclose()
        flush_spans(provider)


app = stock_app(lifespan)


@app.get("/chat")
async def chat() -> dict[str, Any]:
    response = await state["http"].post(f"{PROVIDER_URL}/chat/completions", json=chat_body("where is my order?"))
    response.raise_for_status()
    return {"answer": response.json()["choices"][0]["message"]["content"]}
