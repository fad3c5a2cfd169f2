"""An aiohttp.web application for the aiohttp_web hook's tests: `python -m aiohttp.web ... tests.collectors.hooks.apps.aiohttp_app:init`.

`AIOHTTP_APP_LOOP=uvloop` runs it on uvloop.
"""

from __future__ import annotations

import asyncio
import os
import time

from aiohttp import web

if os.environ.get("AIOHTTP_APP_LOOP") == "uvloop":
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

routes = web.RouteTableDef()


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@routes.get("/chat/{chat_id}")
async def chat(request: web.Request) -> web.Response:
    await asyncio.sleep(float(request.query.get("ms", "0")) / 1000)
    return web.json_response({"chat": request.match_info["chat_id"]})


@routes.post("/chat/{chat_id}")
async def post_chat(request: web.Request) -> web.Response:
    return web.json_response({"chat": request.match_info["chat_id"]}, status=201)


@routes.get("/boom")
async def boom(request: web.Request) -> web.Response:
    raise RuntimeError("boom")


@routes.get("/block")
async def block(request: web.Request) -> web.Response:
    time.sleep(float(request.query.get("ms", "100")) / 1000)  # blocks the event loop
    return web.Response(text="blocked", status=202)


@routes.get("/cpu")
async def cpu(request: web.Request) -> web.Response:
    deadline = time.thread_time() + float(request.query.get("ms", "0")) / 1000
    n = 0
    while time.thread_time() < deadline:
        n += 1
    return web.json_response({"n": n})


@routes.get("/stream")
async def stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for i in range(3):
        await asyncio.sleep(0.05)
        await response.write(f"chunk {i}\n".encode())
    await response.write_eof()
    return response


def init(argv: list[str] | None = None) -> web.Application:
    app = web.Application()
    app.add_routes(routes)
    return app
