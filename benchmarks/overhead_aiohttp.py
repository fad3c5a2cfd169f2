"""`overhead_app.py` as an `aiohttp.web` service, for `bench_overhead.py --server aiohttp`.

    python overhead_aiohttp.py PORT

The same cheapest endpoint: it validates its input and returns a small JSON document built in
Python; SQLAlchemy (with a pool) and the openai client are imported so every hook installs.
"""

from __future__ import annotations

import sys
from typing import Any

import openai
from aiohttp import web
from pydantic import BaseModel
from sqlalchemy import create_engine

engine = create_engine("sqlite:///overhead.db", pool_size=5, max_overflow=0)  # never used: installs the pool hook
llm = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")  # never called


class Profile(BaseModel):
    user_id: int
    plan: str
    models: list[str]
    limits: dict[str, int]


async def profile(request: web.Request) -> web.Response:
    user_id = int(request.match_info["user_id"])
    plan = "pro" if user_id % 3 else "free"
    body = Profile(
        user_id=user_id,
        plan=plan,
        models=["small", "large"] if plan == "pro" else ["small"],
        limits={"rpm": 600 if plan == "pro" else 60, "tpm": 200_000 if plan == "pro" else 20_000},
    )
    return web.Response(text=body.model_dump_json(), content_type="application/json")


def init(argv: Any = None) -> web.Application:
    app = web.Application()
    app.router.add_get("/profile/{user_id}", profile)
    return app


if __name__ == "__main__":  # no access log, as the other servers of the benchmark
    web.run_app(init(), host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
