"""A FastAPI service traced with stock OpenTelemetry only, whose LLM calls are retried by hand after 429s.

Run by `otlp_harness.record_otlp` with `APP` pointed here: `PROVIDER_URL` is a provider that
always answers, `LIMITED_URL` one that answers 429 (with `retry-after-ms`) to the first attempt
of each `Idempotency-Key`. Spans come from the stock FastAPI and httpx instrumentations only
(`_stock_common`); the LLM is called with plain `httpx.AsyncClient` (the stock
HTTPXClientInstrumentor sees each attempt as a client span; nothing sees the sleep between).

- `GET /chat?limited=0|1`: one chat completion; through the rate-limited provider when 1, with a
  hand-written loop: on 429, sleep `retry-after-ms`, try again (the fault: retry backoff).
- `GET /agent?limited=0|1`: an agent loop, no retry: a "search" call, an LLM call, then the
  same "search" call again; when 1 the search goes to the rate-limited provider, so its first
  call fails and the second (after the LLM call) succeeds (the negative: not a retry).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import httpx
from fastapi import FastAPI

from tests.collectors.traces.apps._stock_common import chat_body, flush_spans, stock_app, stock_tracing

PROVIDER_URL = os.environ.get("PROVIDER_URL", "")
LIMITED_URL = os.environ.get("LIMITED_URL", "")
MAX_ATTEMPTS = 4

provider = stock_tracing("stock-retry")
state: dict[str, Any] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state["http"] = httpx.AsyncClient(timeout=30)
    try:
        yield
    finally:
        await state["http"].aclose()
        flush_spans(provider)


app = stock_app(lifespan)


async def _post(base: str, prompt: str, key: str) -> httpx.Response:
    return await state["http"].post(f"{base}/chat/completions", json=chat_body(prompt), headers={"Idempotency-Key": key})


@app.get("/chat")
async def chat(limited: int = 0) -> dict[str, Any]:
    base, key = (LIMITED_URL if limited else PROVIDER_URL), uuid.uuid4().hex
    for _ in range(MAX_ATTEMPTS):
        response = await _post(base, "where is my order?", key)
        if response.status_code != 429:
            response.raise_for_status()
            return {"answer": response.json()["choices"][0]["message"]["content"]}
        await asyncio.sleep(int(response.headers.get("retry-after-ms", "500")) / 1000)
    raise RuntimeError("rate limited")


@app.get("/agent")
async def agent(limited: int = 0) -> dict[str, Any]:
    search, key = (LIMITED_URL if limited else PROVIDER_URL), uuid.uuid4().hex
    first = await _post(search, "search: order status", key)
    plan = await _post(PROVIDER_URL, "plan the next step", uuid.uuid4().hex)
    plan.raise_for_status()
    second = await _post(search, "search: order status", key)
    second.raise_for_status()
    return {"first": first.status_code, "second": second.status_code}
