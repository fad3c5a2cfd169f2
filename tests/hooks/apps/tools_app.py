"""An agent-like FastAPI service whose slow requests make three tool calls, in one of four shapes.

It calls a lookup service (`TOOLS_APP_BASE`: `GET /tool/KIND[?of=ID]` answers `{"id": ...}`
after a while) with one shared httpx.AsyncClient, and the LLM (`TOOLS_APP_PROVIDER`, the demo
provider) with the openai client.

- `GET /ask`: the fast path, one lookup;
- `GET /ask?shape=sequential`: three independent lookups one after another;
- `GET /ask?shape=gathered`: the same three with `asyncio.gather`;
- `GET /ask?shape=dependent`: each lookup sends the id the previous one answered;
- `GET /ask?shape=agent`: LLM -> lookup -> LLM -> lookup -> LLM.
"""

from __future__ import annotations

import asyncio
import os

import httpx
import openai
from fastapi import FastAPI

app = FastAPI()
http = httpx.AsyncClient(base_url=os.environ.get("TOOLS_APP_BASE", "http://127.0.0.1:9"), limits=httpx.Limits(max_connections=50))
llm = openai.AsyncOpenAI(base_url=os.environ.get("TOOLS_APP_PROVIDER", "http://127.0.0.1:9/v1"), api_key="unused")


@app.get("/health")
async def health() -> str:
    return "ok"


async def lookup(kind: str, of: str = "") -> str:
    response = await http.get(f"/tool/{kind}", params={"of": of} if of else None)
    return str(response.json()["id"])


async def think() -> None:
    await llm.chat.completions.create(model="demo", messages=[{"role": "user", "content": "next?"}])


@app.get("/ask")
async def ask(shape: str = "fast") -> dict[str, object]:
    if shape == "sequential":
        ids = [await lookup("customer"), await lookup("tickets"), await lookup("plan")]
    elif shape == "gathered":
        ids = list(await asyncio.gather(lookup("customer"), lookup("tickets"), lookup("plan")))
    elif shape == "dependent":
        customer = await lookup("customer")
        tickets = await lookup("tickets", of=customer)
        ids = [customer, tickets, await lookup("plan", of=tickets)]
    elif shape == "agent":
        await think()
        first = await lookup("customer")
        await think()
        ids = [first, await lookup("tickets")]
        await think()
    else:
        ids = [await lookup("customer")]
    return {"ids": ids}
