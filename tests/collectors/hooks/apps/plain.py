"""A plain Starlette service (no FastAPI) for the hook tests."""

from __future__ import annotations

import asyncio
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"hello {request.path_params['name']}")


async def chat(request: Request) -> JSONResponse:
    await asyncio.sleep(float(request.query_params.get("ms", "5")) / 1000)
    return JSONResponse({"chat": request.path_params["chat_id"]})


async def block(request: Request) -> JSONResponse:
    ms = float(request.query_params.get("ms", "500"))
    time.sleep(ms / 1000)  # a blocking call inside `async def`: the loop stalls
    return JSONResponse({"blocked_ms": ms}, status_code=202)


app = Starlette(
    routes=[
        Route("/health", health),
        Route("/hello/{name}", hello),
        Route("/chat/{chat_id:int}", chat),
        Route("/block", block),
    ]
)
