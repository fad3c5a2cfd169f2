"""The agent_tools hook on real frameworks: LangChain tools, the OpenAI Agents SDK's function tools, MCP tool calls."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from typing import Any

import pytest
from recording import recording

import services
from latprof.collectors.hooks import agent_tools, runtime
from latprof.collectors.hooks import redis as redis_hook
from latprof.events import QualityRecord, Request, Segment
from latprof.layers import DB_QUERY, TOOL
from latprof.semconv import (
    ERROR_TYPE,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    LAST_ERROR,
    TOOL_DEPENDS_ON,
    TOOL_FRAMEWORK,
)

langchain_tools = pytest.importorskip("langchain_core.tools")


@pytest.fixture
def hooked():
    with recording() as events:
        assert agent_tools.install() is True
        try:
            yield events
        finally:
            agent_tools.uninstall()


def tool_calls(events) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and e.name.startswith("execute_tool ")]


def in_request(fn):
    token = runtime.begin_request("POST /agent", runtime.now_ns())
    try:
        return fn()
    finally:
        runtime.end_request(token)


# --- LangChain ---------------------------------------------------------------------------------


@langchain_tools.tool
def customer(email: str) -> str:
    """The customer id of an email address."""
    return f"cust_{sum(map(ord, email)) * 7:05d}"


@langchain_tools.tool
def tickets(customer_id: str) -> str:
    """A customer's open tickets."""
    return json.dumps({"customer": customer_id, "open": ["T-1001", "T-1002"]})


@langchain_tools.tool
def broken(x: int) -> int:
    """Always fails."""
    raise RuntimeError("tool failed")


def test_langchain_tool_calls_are_tool_segments_with_name_call_id_and_dependencies(hooked):
    def agent() -> None:
        message = customer.invoke({"name": "customer", "args": {"email": "ada@example.com"}, "id": "call_1", "type": "tool_call"})
        tickets.invoke({"customer_id": message.content})  # sends what the first call answered
        tickets.invoke({"customer_id": "someone_else_42"})

    in_request(agent)
    first, second, third = tool_calls(hooked)
    assert first.layer == TOOL and first.name == "execute_tool customer" and first.parent_id is None
    assert first.attrs == {GEN_AI_OPERATION_NAME: "execute_tool", GEN_AI_TOOL_NAME: "customer",
                           GEN_AI_TOOL_CALL_ID: "call_1", TOOL_FRAMEWORK: "langchain"}  # fmt: skip
    assert second.attrs[TOOL_DEPENDS_ON] == first.segment_id and GEN_AI_TOOL_CALL_ID not in second.attrs
    assert TOOL_DEPENDS_ON not in third.attrs
    assert "ada@example.com" not in repr(hooked) and "T-1001" not in repr(hooked)  # arguments and results stay out


def test_a_failing_langchain_tool_raises_and_is_recorded_with_its_error(hooked):
    def agent() -> None:
        with pytest.raises(RuntimeError, match="tool failed"):
            broken.invoke({"x": 1})

    in_request(agent)
    (call,) = tool_calls(hooked)
    assert call.attrs[ERROR_TYPE] == "RuntimeError"
    assert runtime.current_parent() is None  # the tool's nesting was undone


def test_async_langchain_tools_gathered_overlap_and_what_they_do_nests_under_them(hooked):
    import redis
    import redis.asyncio

    try:
        redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=3).ping()
    except Exception as exc:
        services.missing(f"Redis at 127.0.0.1:6379: {exc}", "a redis server is")

    @langchain_tools.tool
    async def cached(key: str) -> str:
        """Read a key from the cache."""
        client = redis.asyncio.Redis(host="127.0.0.1", port=6379)
        try:
            await asyncio.sleep(0.05)
            return str(await client.get(key))
        finally:
            await client.aclose()

    async def agent() -> None:
        token = runtime.begin_request("POST /agent", runtime.now_ns())
        await asyncio.gather(cached.ainvoke({"key": "latprof-a"}), cached.ainvoke({"key": "latprof-b"}))
        runtime.end_request(token)

    redis_hook.install()
    try:
        asyncio.run(agent())
    finally:
        redis_hook.uninstall()
    a, b = tool_calls(hooked)
    assert a.start_ns < b.end_ns and b.start_ns < a.end_ns  # ran together
    gets = [e for e in hooked if isinstance(e, Segment) and e.layer == DB_QUERY]
    assert sorted(g.parent_id for g in gets) == sorted([a.segment_id, b.segment_id])


def test_outside_a_request_nothing_is_recorded(hooked):
    assert customer.invoke({"email": "x@example.com"}).startswith("cust_")
    assert hooked == []


# --- OpenAI Agents SDK -------------------------------------------------------------------------


class _Responses(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible Responses endpoint: two parallel calls of `slow_add` (the second
    fails), then a final answer."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answered = any(item.get("type") == "function_call_output" for item in body.get("input", []) if isinstance(item, dict))
        if not answered:
            output = [
                {"type": "function_call", "id": "fc_1", "call_id": "call_A", "name": "slow_add",
                 "arguments": json.dumps({"a": 1, "b": 2}), "status": "completed"},
                {"type": "function_call", "id": "fc_2", "call_id": "call_B", "name": "slow_add",
                 "arguments": json.dumps({"a": -1, "b": 0}), "status": "completed"},
            ]  # fmt: skip
        else:
            output = [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": "done", "annotations": []}]}]  # fmt: skip
        data = json.dumps({"id": "resp_1", "object": "response", "created_at": 0, "model": "fake",
                           "status": "completed", "output": output}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_agents_sdk_function_tools_run_in_parallel_with_their_call_ids(hooked):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Responses)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    @agents.function_tool
    async def slow_add(a: int, b: int) -> int:
        """Add two numbers, slowly; negative numbers are refused."""
        await asyncio.sleep(0.2)
        if a < 0:
            raise ValueError("negative")
        return a + b

    async def run() -> str:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="unused")
        model = agents.OpenAIResponsesModel(model="fake", openai_client=client)
        agent = agents.Agent(name="adder", instructions="add", tools=[slow_add], model=model)
        token = runtime.begin_request("POST /agent", runtime.now_ns())
        try:
            result = await agents.Runner.run(agent, "add", run_config=agents.RunConfig(tracing_disabled=True))
        finally:
            runtime.end_request(token)
        await client.close()
        return str(result.final_output)

    try:
        assert asyncio.run(run()) == "done"
    finally:
        server.shutdown()
        server.server_close()
    calls = sorted(tool_calls(hooked), key=lambda s: s.attrs[GEN_AI_TOOL_CALL_ID])
    assert [s.attrs[GEN_AI_TOOL_CALL_ID] for s in calls] == ["call_A", "call_B"]
    a, b = calls
    assert {s.attrs[TOOL_FRAMEWORK] for s in calls} == {"openai-agents"} and a.name == "execute_tool slow_add"
    assert a.start_ns < b.end_ns and b.start_ns < a.end_ns  # the SDK ran them together
    assert (a.end_ns - a.start_ns) / 1e6 >= 150
    assert ERROR_TYPE not in a.attrs and b.attrs[ERROR_TYPE] == "tool_error"  # the SDK answered the error
    (root,) = [e for e in hooked if isinstance(e, Request)]
    assert {s.request_id for s in calls} == {root.request_id}


# --- MCP ---------------------------------------------------------------------------------------


def test_mcp_tool_calls_through_a_client_session(hooked):
    pytest.importorskip("mcp")
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("lookups")

    @server.tool()
    async def plan(customer_id: str) -> str:
        """The customer's plan."""
        await asyncio.sleep(0.05)
        return "pro"

    @server.tool()
    async def fail(x: int) -> int:
        """Always fails."""
        raise ValueError("no")

    async def run() -> None:
        async with Client(server) as client:
            token = runtime.begin_request("POST /agent", runtime.now_ns())
            try:
                result = await client.call_tool("plan", {"customer_id": "cust_1"})
                assert result.content[0].text == "pro"
                failed = await client.call_tool("fail", {"x": 1})
                assert failed.is_error
            finally:
                runtime.end_request(token)
            await client.call_tool("plan", {"customer_id": "cust_2"})  # outside the request

    asyncio.run(run())
    ok, failed = tool_calls(hooked)
    assert ok.name == "execute_tool plan" and ok.attrs[TOOL_FRAMEWORK] == "mcp" and ERROR_TYPE not in ok.attrs
    assert (ok.end_ns - ok.start_ns) / 1e6 >= 40
    assert failed.name == "execute_tool fail" and failed.attrs[ERROR_TYPE] == "tool_error"


# --- the hook itself ---------------------------------------------------------------------------


def test_a_failing_hook_is_counted_and_the_tool_still_runs(hooked, monkeypatch):
    monkeypatch.setattr(agent_tools, "_Call", None)  # calling it raises TypeError
    assert in_request(lambda: customer.invoke({"email": "x@example.com"})).startswith("cust_")
    runtime.report_errors(force=True)
    (error,) = [e for e in hooked if isinstance(e, QualityRecord) and e.kind == "error" and e.attrs.get("collector") == agent_tools.HOOK]
    assert "TypeError" in error.attrs[LAST_ERROR]
    assert tool_calls(hooked) == []


def test_install_twice_patches_once_and_uninstall_restores():
    from langchain_core.tools import BaseTool

    original = BaseTool.__dict__["run"]
    agent_tools.install()
    agent_tools.install()
    assert BaseTool.__dict__["run"].__wrapped__ is original
    agent_tools.uninstall()
    assert BaseTool.__dict__["run"] is original
