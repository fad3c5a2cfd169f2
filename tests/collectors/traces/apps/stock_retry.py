"""A FastAPI service traced with stock OpenTelemetry only, whose LLM calls are retried by hand after 429s.

Run by `otlp_harness.record_otlp` with `APP` pointed here: `PROVIDER_URL` is a provider that
always answers, `LIMITED_URL` one that answers 429 (with `retry-after-ms`) to the first attempt
of each `Idempotency-Key`. The LLM is called with plain `httpx.AsyncClient` (the stock
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
import sys
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import httpx
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

PROVIDER_URL = os.environ.get("PROVIDER_URL", "")
LIMITED_URL = os.environ.get("LIMITED_URL", "")
FLUSHED_MARK = "traced_app: spans flushed:"  # what otlp_harness waits for
MAX_ATTEMPTS = 4

provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "stock-retry")}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
trace.set_tracer_provider(provider)
HTTPXClientInstrumentor().instrument()

state: dict[str, Any] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state["http"] = httpx.AsyncClient(timeout=30)
    try:
        yield
    finally:
        await state["http"].aclose()
        flushed = provider.force_flush(10_000)
        provider.shutdown()
        print(f"{FLUSHED_MARK} {flushed}", file=sys.stderr, flush=True)


app = FastAPI(lifespan=lifespan)
FastAPIInstrumentor.instrument_app(app, excluded_urls="health")


def _body(prompt: str) -> dict[str, Any]:
    return {"model": "latprof-demo-1", "messages": [{"role": "user", "content": prompt}]}


async def _post(base: str, prompt: str, key: str) -> httpx.Response:
    return await state["http"].post(f"{base}/chat/completions", json=_body(prompt), headers={"Idempotency-Key": key})


@app.get("/health")
async def health() -> str:
    return "ok"


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
