"""An aiohttp.web service for the privacy canaries of the aiohttp_web hook (`init` for `python -m aiohttp.web`).

`GET /users/{user_id}/orders/{order_id}` answers with a canary `Set-Cookie` and custom header;
`GET /boom/{item}` raises with a canary in the message. Canaries from `PRIVACY_CANARIES`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from aiohttp import web

C: dict[str, dict[str, str]] = json.loads(Path(os.environ["PRIVACY_CANARIES"]).read_text())


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def order(request: web.Request) -> web.Response:
    response = web.json_response({"user": request.match_info["user_id"], "q": request.query.get("q", "")})
    response.headers["Set-Cookie"] = f"session={C['aiohttp_web']['set_cookie']}"
    response.headers["X-Service-Secret"] = C["aiohttp_web"]["response_header"]
    return response


async def boom(request: web.Request) -> web.Response:
    raise RuntimeError(f"order {request.match_info['item']} failed for {C['aiohttp_web']['exception']}")


def init(argv: Any = None) -> web.Application:
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/users/{user_id}/orders/{order_id}", order)
    app.router.add_get("/boom/{item}", boom)
    return app
