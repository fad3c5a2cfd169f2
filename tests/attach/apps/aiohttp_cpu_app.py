"""An aiohttp.web server whose handler burns the CPU on the event loop, for `latprof attach` tests.

`python tests/attach/apps/aiohttp_cpu_app.py PORT`; `GET /cpu?ms=N` computes for N ms before it
answers, holding the loop; `GET /health` answers at once.
"""

from __future__ import annotations

import sys
import time

from aiohttp import web


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def digest(ms: float) -> int:
    end, n = time.perf_counter() + ms / 1000, 0
    while time.perf_counter() < end:
        n += sum(i * i for i in range(200))
    return n


async def cpu(request: web.Request) -> web.Response:
    return web.json_response({"n": digest(float(request.query.get("ms", "50")))})


app = web.Application()
app.add_routes([web.get("/health", health), web.get("/cpu", cpu)])

if __name__ == "__main__":
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
