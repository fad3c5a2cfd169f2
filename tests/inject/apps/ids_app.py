"""An ASGI service started plainly (no latprof) for the --inject tests.

- `/health`, `/work` (a short await): ordinary traffic;
- `/ids?t=module:owner:attribute,...`: `id()` of each attribute (owner "" for a module
  attribute; "-" when its module is not imported), to compare before and after an injection;
- `/threads`: the names of the process's threads.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any
from urllib.parse import parse_qs


def _ids(spec: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, spec.split(",")):
        module_name, owner_name, attribute = item.split(":")
        module = sys.modules.get(module_name)
        if module is None:
            out[item] = "-"
            continue
        owner = getattr(module, owner_name, None) if owner_name else module
        out[item] = id(vars(owner).get(attribute)) if owner is not None else "-"
    return out


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/ids":
        query = parse_qs(scope.get("query_string", b"").decode())
        body = json.dumps(_ids(query.get("t", [""])[0])).encode()
    elif path == "/threads":
        body = json.dumps(sorted(t.name for t in threading.enumerate())).encode()
    else:
        if path == "/work":
            await asyncio.sleep(0.005)
        body = b"ok"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
