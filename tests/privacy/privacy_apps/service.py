"""A FastAPI service that sends privacy canaries through every hook `latprof run` loads.

The canaries come from the JSON file named by `PRIVACY_CANARIES` (`{group: {purpose: value}}`).
Each `GET /leak/{kind}` route hands its group's canaries to one library the hooks patch: as a
prompt, an SQL parameter or literal, a Redis key, a URL path, a header, a tool argument, an
exception message; the upstream it calls (`PRIVACY_UPSTREAM`, the test's echo server) answers
with canaries too (completions, response bodies, `Set-Cookie`). `GET /users/{user_id}/orders/{order_id}`
is what the client calls with canaries in its path, query string and headers; every response
carries a canary `Set-Cookie` and a custom header.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import anthropic
import asyncpg
import httpx
import openai
import redis.asyncio as aioredis
import sqlalchemy
from fastapi import FastAPI, Request, Response
from psycopg_pool import AsyncConnectionPool

C: dict[str, dict[str, str]] = json.loads(Path(os.environ["PRIVACY_CANARIES"]).read_text())
UPSTREAM = os.environ["PRIVACY_UPSTREAM"]  # the echo server: http://127.0.0.1:PORT
PROVIDER = os.environ["PRIVACY_PROVIDER"]  # latprof's demo provider: http://127.0.0.1:PORT/v1
PG = os.environ["PRIVACY_PG"]
TABLE = os.environ["PRIVACY_TABLE"]
REDIS = os.environ["PRIVACY_REDIS"]


def dsn(group: str) -> str:
    """PG with the group's canary password (trust auth ignores it) and `application_name`."""
    parts = urlsplit(PG)
    host = parts.netloc.rsplit("@", 1)[-1]
    netloc = f"{parts.username or 'postgres'}:{C[group]['password']}@{host}"
    return urlunsplit(parts._replace(netloc=netloc, query=f"application_name={C[group]['dsn_option']}"))


def sql_statements(group: str, placeholder: str) -> list[tuple[str, bool]]:
    """(statement, takes the two parameters) of `group`: parameters, a literal, comments, a dollar-quoted and an E'' literal."""
    c = C[group]
    return [
        (f"INSERT INTO {TABLE} (k, v) VALUES ({placeholder.format(1)}, {placeholder.format(2)})", True),
        (f"SELECT v FROM {TABLE} WHERE k = '{c['literal']}'", False),
        (f"/* {c['comment']} */ SELECT count(*) FROM {TABLE} -- {c['comment']}", False),
        (f"SELECT $${c['dollar']}$$", False),
        (f"SELECT E'\\' FROM {c['escaped']}'", False),
    ]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.engine = sqlalchemy.create_engine(dsn("sqlalchemy").replace("postgresql://", "postgresql+psycopg://"), pool_size=2)
    app.state.pgpool = AsyncConnectionPool(dsn("psycopg_pool"), min_size=1, max_size=2, open=False, name="privacy-pool")
    await app.state.pgpool.open(wait=True, timeout=20)
    app.state.apg = await asyncpg.create_pool(dsn("asyncpg"), min_size=1, max_size=2)
    app.state.redis = aioredis.Redis.from_url(REDIS, client_name=C["redis"]["client_name"])
    app.state.http = httpx.AsyncClient(base_url=UPSTREAM)
    app.state.aiohttp = aiohttp.ClientSession()
    try:
        yield
    finally:
        await app.state.aiohttp.close()
        await app.state.http.aclose()
        await app.state.redis.aclose()
        await app.state.apg.close()
        await app.state.pgpool.close()
        app.state.engine.dispose()


app = FastAPI(lifespan=lifespan)


@app.middleware("http")
async def set_cookie(request: Request, call_next: Any) -> Any:
    response = await call_next(request)
    response.headers["Set-Cookie"] = f"session={C['asgi']['set_cookie']}; HttpOnly"
    response.headers["X-Service-Secret"] = C["asgi"]["response_header"]
    return response


@app.get("/health")
async def health() -> str:
    return "ok"


@app.get("/users/{user_id}/orders/{order_id}")
async def order(user_id: str, order_id: str, q: str = "") -> dict[str, str]:
    return {"user": user_id, "order": order_id, "q": q}


@app.get("/boom/{item}")
async def boom(item: str) -> None:
    raise RuntimeError(f"order {item} failed for {C['asgi']['exception']}")


def _headers(group: str) -> dict[str, str]:
    c = C[group]
    return {"Authorization": f"Bearer {c['authorization']}", "Cookie": f"sid={c['cookie']}", "X-Custom-Secret": c["custom_header"]}


def _chat(group: str, stream: bool) -> dict[str, Any]:
    return {"model": "echo", "stream": stream, "messages": [{"role": "user", "content": C[group]["prompt"]}]}


@app.get("/leak/run")
async def leak_run() -> dict[str, str]:
    """The service's argv and environment as it got them (the test's proof that they held canaries)."""
    return {"argv": " ".join(sys.argv), "env": os.environ.get("PRIVACY_ENV_SECRET", "")}


@app.get("/leak/openai")
async def leak_openai() -> dict[str, str]:
    c = C["openai"]
    texts = []
    for base in (PROVIDER, UPSTREAM + "/v1"):  # the demo provider takes the prompts; the echo server answers canaries
        client = openai.AsyncOpenAI(base_url=base, api_key=c["api_key"], default_headers={"X-Custom-Secret": c["custom_header"]})
        messages: Any = [{"role": "system", "content": c["system"]}, {"role": "user", "content": c["prompt"]}]
        done = await client.chat.completions.create(model="demo", messages=messages, user=c["user"])
        texts.append(done.choices[0].message.content or "")
        stream = await client.chat.completions.create(model="demo", messages=messages, stream=True, stream_options={"include_usage": True})
        async for chunk in stream:
            texts += [choice.delta.content or "" for choice in chunk.choices]
        if base == PROVIDER:  # the Responses API, streamed and not
            response = await client.responses.create(model="demo", input=c["prompt"], instructions=c["system"])
            texts.append(response.output_text)
            async with await client.responses.create(model="demo", input=c["prompt"], stream=True) as events:
                async for _ in events:
                    pass
        await client.close()
    return {"text": "".join(texts)}


@app.get("/leak/anthropic")
async def leak_anthropic() -> dict[str, str]:
    c = C["anthropic"]
    texts = []
    for base in (PROVIDER.removesuffix("/v1"), UPSTREAM):  # the client adds /v1/messages to the root
        client = anthropic.AsyncAnthropic(base_url=base, api_key=c["api_key"], default_headers={"X-Custom-Secret": c["custom_header"]})
        messages: Any = [{"role": "user", "content": c["prompt"]}]
        done = await client.messages.create(model="demo", max_tokens=64, system=c["system"], messages=messages)
        texts += [block.text for block in done.content if block.type == "text"]
        stream = await client.messages.create(model="demo", max_tokens=64, system=c["system"], messages=messages, stream=True)
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                texts.append(event.delta.text)
        async with client.messages.stream(model="demo", max_tokens=64, system=c["system"], messages=messages) as helper:
            texts += [text async for text in helper.text_stream]
        await client.close()
    return {"text": "".join(texts)}


@app.get("/leak/httpx")
async def leak_httpx() -> dict[str, str]:
    c, http = C["httpx"], app.state.http
    got = await http.get(f"/items/{c['path']}", params={"token": c["query"]}, headers=_headers("httpx"))
    posted = await http.post("/items", json={"secret": c["body"]}, headers=_headers("httpx"))
    llm = await http.post("/v1/chat/completions", json=_chat("httpx", False), headers=_headers("httpx"))
    streamed = ""
    async with http.stream("POST", "/v1/chat/completions", json=_chat("httpx", True), headers=_headers("httpx")) as response:
        async for text in response.aiter_text():
            streamed += text
    return {"text": got.text + posted.text + llm.text + streamed}


@app.get("/leak/aiohttp")
async def leak_aiohttp() -> dict[str, str]:
    c, session = C["aiohttp_client"], app.state.aiohttp
    texts = []
    async with session.get(f"{UPSTREAM}/items/{c['path']}", params={"token": c["query"]}, headers=_headers("aiohttp_client")) as r:
        texts.append(await r.text())
    async with session.post(f"{UPSTREAM}/items", json={"secret": c["body"]}, headers=_headers("aiohttp_client")) as r:
        texts.append(await r.text())
    for stream in (False, True):
        async with session.post(f"{UPSTREAM}/v1/chat/completions", json=_chat("aiohttp_client", stream), headers=_headers("aiohttp_client")) as r:
            texts.append(await r.text())
    return {"text": "".join(texts)}


@app.get("/leak/sqlalchemy")
def leak_sqlalchemy() -> dict[str, int]:  # sync: in a worker thread, as a sync SQLAlchemy service runs
    c = C["sqlalchemy"]
    with app.state.engine.begin() as conn:
        for statement, with_params in sql_statements("sqlalchemy", ":p{}"):
            conn.execute(sqlalchemy.text(statement), {"p1": c["param_key"], "p2": c["param_value"]} if with_params else {})
    return {"ok": 1}


@app.get("/leak/psycopg_pool")
async def leak_psycopg_pool() -> dict[str, int]:
    c = C["psycopg_pool"]
    async with app.state.pgpool.connection() as conn:
        for statement, with_params in sql_statements("psycopg_pool", "%s"):
            await conn.execute(statement, (c["param_key"], c["param_value"]) if with_params else None)
    return {"ok": 1}


@app.get("/leak/asyncpg")
async def leak_asyncpg() -> dict[str, int]:
    c = C["asyncpg"]
    async with app.state.apg.acquire() as conn:
        for statement, with_params in sql_statements("asyncpg", "${}"):
            if with_params:
                await conn.execute(statement, c["param_key"], c["param_value"])
            else:
                await conn.fetch(statement)
        await conn.fetchrow(f"SELECT v FROM {TABLE} WHERE k = $1", c["param_key"])
    return {"ok": 1}


@app.get("/leak/redis")
async def leak_redis() -> dict[str, str]:
    c, r = C["redis"], app.state.redis
    await r.set(c["key"], c["value"], ex=60)
    value = await r.get(c["key"])
    await r.hset(c["hash"], c["field"], c["value"])
    async with r.pipeline(transaction=True) as pipe:
        pipe.set(c["pipeline_key"], c["value"], ex=60).get(c["pipeline_key"]).expire(c["hash"], 60)
        await pipe.execute()
    return {"value": (value or b"").decode()}


@app.get("/leak/langchain")
async def leak_langchain() -> dict[str, str]:
    from langchain_core.tools import tool

    c = C["langchain"]

    @tool("lookup")
    async def lookup(customer: str) -> str:
        """Look a customer up."""
        return c["result"] if customer == c["argument"] else "?"

    return {"result": str(await lookup.ainvoke({"customer": c["argument"]}))}


@app.get("/leak/agents")
async def leak_agents() -> dict[str, str]:
    import agents

    c = C["agents"]

    @agents.function_tool
    async def lookup(customer: str) -> str:
        """Look a customer up."""
        return c["result"] if customer == c["argument"] else "?"

    client = openai.AsyncOpenAI(base_url=UPSTREAM + "/v1", api_key=c["api_key"])
    model = agents.OpenAIResponsesModel(model="echo", openai_client=client)
    agent = agents.Agent(name="privacy", instructions=c["instructions"], tools=[lookup], model=model)
    result = await agents.Runner.run(agent, c["prompt"], run_config=agents.RunConfig(tracing_disabled=True))
    await client.close()
    return {"final": str(result.final_output)}


@app.get("/leak/mcp")
async def leak_mcp() -> dict[str, str]:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    c = C["mcp"]
    server = MCPServer("privacy")

    @server.tool()
    async def lookup(customer: str) -> str:
        """Look a customer up."""
        return c["result"] if customer == c["argument"] else "?"

    @server.tool()
    async def fail(customer: str) -> str:
        """Always fails, with the customer in its message."""
        raise ValueError(f"no such customer {customer} ({c['error']})")

    async with Client(server) as client:
        result = await client.call_tool("lookup", {"customer": c["argument"]})
        failed = await client.call_tool("fail", {"customer": c["argument"]})
    return {"result": result.content[0].text, "failed": str(failed.is_error)}  # type: ignore[union-attr]

