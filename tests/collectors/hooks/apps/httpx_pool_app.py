"""A FastAPI service for the httpx hook's end-to-end test: every request calls a slow tool through ONE shared AsyncClient.

`GET /work?ms=N` calls `GET {APP_TOOL_URL}/slow?ms=N&token=...` through a single
`httpx.AsyncClient(limits=httpx.Limits(max_connections=APP_POOL_MAX))` made at startup (default
2 connections): more concurrent requests than connections wait for a free connection slot.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import AsyncIterator

import httpx
from fastapi import FastAPI

TOOL_URL = os.environ.get("APP_TOOL_URL", "http://127.0.0.1:9")
POOL_MAX = int(os.environ.get("APP_POOL_MAX", "2"))
#: Sent in each call's query string: the capture must never contain it.
SECRET = os.environ.get("APP_SECRET", "s3cr3t-token")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=POOL_MAX), timeout=30) as client:
        app.state.client = client
        yield


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health() -> dict[str, str]:
    return {"ok": "yes"}


@app.get("/work")
async def work(ms: float = 100) -> dict[str, float]:
    client: httpx.AsyncClient = app.state.client
    response = await client.get(f"{TOOL_URL}/slow", params={"ms": ms, "token": SECRET})
    response.raise_for_status()
    return {"tool_ms": ms}
