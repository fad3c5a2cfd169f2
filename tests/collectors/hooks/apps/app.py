"""A FastAPI service for the ASGI hook tests: async and sync endpoints, an HTTP middleware, a mounted Starlette app."""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import anyio.to_thread
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import StreamingResponse

from tests.collectors.hooks.apps import plain

#: Worker threads of anyio's default limiter (40 by default): small, so that sync endpoints queue.
THREADPOOL_TOKENS = int(os.environ.get("APP_THREADPOOL_TOKENS", "2"))


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    anyio.to_thread.current_default_thread_limiter().total_tokens = THREADPOOL_TOKENS
    yield


app = FastAPI(lifespan=lifespan)


@app.middleware("http")
async def server_timing(request: Request, call_next):  # a BaseHTTPMiddleware: the endpoint runs in a child task
    response = await call_next(request)
    response.headers["x-served-by"] = "app"
    return response


def burn_cpu(ms: float) -> None:
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


@app.get("/health")
async def health() -> dict[str, str]:
    return {"ok": "yes"}


@app.get("/chat/{chat_id}")
async def get_chat(chat_id: int, ms: float = 5) -> dict[str, int]:
    await asyncio.sleep(ms / 1000)
    return {"chat": chat_id}


@app.post("/chat/{chat_id}", status_code=201)
async def post_chat(chat_id: int) -> dict[str, int]:
    return {"chat": chat_id}


@app.get("/items/{item_id}")
async def get_item(item_id: str) -> dict[str, str]:
    if item_id == "missing":
        raise HTTPException(status_code=404)
    return {"item": item_id}


@app.get("/boom")
async def boom() -> None:
    raise RuntimeError("the endpoint failed")


@app.get("/block")
async def block(ms: float = 500) -> dict[str, float]:
    time.sleep(ms / 1000)  # the bug under test: a blocking call inside `async def`
    return {"blocked_ms": ms}


@app.get("/cpu")
async def cpu(ms: float = 100) -> dict[str, float]:
    burn_cpu(ms)
    return {"cpu_ms": ms}


@app.get("/cpu-sync")
def cpu_sync(ms: float = 100) -> dict[str, float]:
    burn_cpu(ms)
    return {"cpu_ms": ms}


@app.get("/sync")
def sync(ms: float = 200):  # type: ignore[no-untyped-def]  # no return type: FastAPI would validate it in a 2nd thread hop
    time.sleep(ms / 1000)
    return {"slept_ms": ms}


@app.get("/stream")
async def stream() -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(3):
            await asyncio.sleep(0.01)
            yield b"chunk %d\n" % i

    return StreamingResponse(chunks(), media_type="text/plain")


@app.get("/sleep")
async def sleep(ms: float = 500) -> Response:
    await asyncio.sleep(ms / 1000)
    return Response(b"slept")


app.mount("/plain", plain.app)
