"""An agent-like FastAPI service whose slow requests make three tool calls, in one of four shapes.

It calls a lookup service (`TOOLS_APP_BASE`: `GET /tool/KIND[?of=ID]` answers `{"id": ...}`
after a while) with one shared httpx.AsyncClient, and the LLM (`TOOLS_APP_PROVIDER`, the demo
provider) with the openai client.

- `GET /ask`: the fast path, one lookup;
- `GET /ask?shape=sequential`: three independent lookups one after another;
- `GET /ask?shape=gathered`: the same three with `asyncio.gather`;
- `GET /ask?shape=dependent`: each lookup sends the id the previous one answered;
- `GET /ask?shape=agent`: LLM -> lookup -> LLM -> lookup -> LLM.

With `via=langchain`, each lookup is a call of a LangChain tool (`lookup`) that makes the same
HTTP call.
"""

from __future__ import annotations

import asyncio
import os

import httpx
import openai
from fastapi import FastAPI
from langchain_core.tools import tool

app = FastAPI()
http = httpx.AsyncClient(base_url=os.environ.get("TOOLS_APP_BASE", "http://127.0.0.1:9"), limits=httpx.Limits(max_connections=50))
llm = openai.AsyncOpenAI(base_url=os.environ.get("TOOLS_APP_PROVIDER", "http://127.0.0.1:9/v1"), api_key="unused")


@app.get("/health")
async def health() -> str:
    return "ok"


async def lookup(kind: str, of: str = "") -> str:
    response = await http.get(f"/tool/{kind}", params={"of": of} if of else None)
    return str(response.json()["id"])


@tool("lookup")
async def lookup_tool(kind: str, of: str = "") -> str:
    """Look a customer, their tickets or their plan up."""
    return await lookup(kind, of)


async def lookup_via_tool(kind: str, of: str = "") -> str:
    return str(await lookup_tool.ainvoke({"kind": kind, "of": of}))


async def think() -> None:
    await llm.chat.completions.create(model="demo", messages=[{"role": "user", "content": "next?"}])


@app.get("/ask")
async def ask(shape: str = "fast", via: str = "httpx") -> dict[str, object]:
    look = lookup_via_tool if via == "langchain" else lookup
    if shape == "sequential":
        ids = [await look("customer"), await look("tickets"), await look("plan")]
    elif shape == "gathered":
        ids = list(await asyncio.gather(look("customer"), look("tickets"), look("plan")))
    elif shape == "dependent":
        customer = await look("customer")
        tickets = await look("tickets", of=customer)
        ids = [customer, tickets, await look("plan", of=tickets)]
    elif shape == "agent":
        await think()
        first = await look("customer")
        await think()
        ids = [first, await look("tickets")]
        await think()
    else:
        ids = [await look("customer")]
    return {"ids": ids}
