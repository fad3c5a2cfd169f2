"""A Starlette service that serves without hooks until the test loads them (`late`), under uvicorn (asyncio or uvloop).

Its psycopg_pool `AsyncConnectionPool` (`late-pool`) is made and filled when it starts, long
before the hooks come. `probe` looks at its event loop from the loop's own thread: latprof's
task factory, the probe's pending ticks and the loop monitors.
"""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from tests.collectors.hooks.apps import late

PG = os.environ.get("LATE_PG", "postgresql://postgres@127.0.0.1:5432/test")
POOL_NAME = "late-pool"
_state: dict[str, Any] = {}


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    pool = AsyncConnectionPool(PG, min_size=2, max_size=2, open=False, name=POOL_NAME, timeout=20)
    await pool.open(wait=True, timeout=20)
    _state.update(pool=pool, loop=asyncio.get_running_loop())
    try:
        yield
    finally:
        await pool.close()


def _ms(request: Request) -> float:
    return float(request.query_params.get("ms", "0")) / 1000


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def chat(request: Request) -> JSONResponse:
    await asyncio.sleep(_ms(request))
    return JSONResponse({"chat": request.path_params["chat_id"]})


async def inflight(request: Request) -> PlainTextResponse:
    """What runs while the hooks come: it began before them, and must not be recorded."""
    async with _state["pool"].connection() as conn:
        await conn.execute("SELECT 1")
    await asyncio.gather(asyncio.sleep(_ms(request)), asyncio.sleep(_ms(request) / 2))
    async with _state["pool"].connection() as conn:
        await conn.execute("SELECT 1")
    return PlainTextResponse("done")


async def block(request: Request) -> PlainTextResponse:
    time.sleep(_ms(request))  # a blocking call inside `async def`: the loop stalls
    return PlainTextResponse("blocked", status_code=202)


async def db(request: Request) -> PlainTextResponse:
    async with _state["pool"].connection() as conn:
        await conn.execute("SELECT pg_sleep(%s)", (_ms(request),))
    return PlainTextResponse("done")


async def spawn(request: Request) -> JSONResponse:
    """Two tasks of its own, each a little CPU then a sleep: the loop's task factory times them."""

    async def part(i: int) -> int:
        end = time.thread_time() + 0.003
        while time.thread_time() < end:
            pass
        await asyncio.sleep(_ms(request))
        return i

    return JSONResponse({"parts": await asyncio.gather(*(asyncio.create_task(part(i)) for i in range(2)))})


async def after(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


app = Starlette(lifespan=lifespan, routes=[
    Route("/health", health), Route("/chat/{chat_id:int}", chat), Route("/inflight", inflight), Route("/block", block),
    Route("/db", db), Route("/spawn", spawn), Route("/after", after),
])  # fmt: skip

_monitors: list[Any] = []  # the loop monitors seen while the hooks recorded (kept to look at them after)


async def _inspect() -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()
    # scheduled, or due and moved to the ready queue in the very iteration that runs this (a busy machine);
    # uvloop keeps its timers to itself: none here
    handles = [*getattr(loop, "_scheduled", ()), *getattr(loop, "_ready", ())]
    ticks = [h for h in handles
             if not h.cancelled() and type(getattr(h._callback, "__self__", None)).__name__ == "LoopMonitor"]
    return {"task_factory": None if factory is None else factory.__qualname__, "pending_ticks": len(ticks)}


def probe(phase: str) -> dict[str, Any]:
    """The loop as its own thread sees it; after the uninstall, whether the monitors seen while recording still tick."""
    loop = _state["loop"]
    if phase == "before":  # the loop may be blocked right now (the test blocks it): read from here
        factory = loop.get_task_factory()
        return {"task_factory": None if factory is None else factory.__qualname__, "loop": type(loop).__module__}
    seen = asyncio.run_coroutine_threadsafe(_inspect(), loop).result(10)
    seen["loop"] = type(loop).__module__
    if phase == "installed":
        from latprof.collectors.hooks import asyncio_loop

        _monitors[:] = asyncio_loop.monitors()
        seen["monitors"] = len(_monitors)
    elif phase == "after":
        due = [m._due_ns for m in _monitors]
        time.sleep(0.3)  # a monitor still ticking would have scheduled its next tick meanwhile (every 10-100 ms)
        seen["monitors"] = [{"closed": m.closed, "running": m._running, "ticked": m._due_ns != d} for m, d in zip(_monitors, due)]
        from latprof.collectors.hooks import asyncio_loop

        seen["watched"] = len(asyncio_loop.monitors())
    return seen


late.start(probe)
