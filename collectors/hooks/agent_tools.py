"""Agent tool functions as `tool` segments: LangChain tools, OpenAI Agents SDK function tools, MCP tool calls.

An agent's tools are often plain Python functions (a lookup in the service's own database, a
search, another agent), not HTTP calls the httpx/aiohttp hooks would see. Each call of one,
inside a request, is a segment named `execute_tool {name}` (OpenTelemetry's GenAI name for
it) in the `tool` layer, from the call to its return, with `gen_ai.operation.name` =
`execute_tool`, `gen_ai.tool.name`, `gen_ai.tool.call.id` when the framework has one,
`latprof.tool.framework`, and `error.type` when the call raised (or, in the Agents SDK, when
the SDK turned the tool's error into its answer). What the tool does inside (queries, pool
waits, HTTP calls) nests under it and keeps its own layer; the rest of its time is `tool`.
So one request's tool calls keep their parent/child structure, and `sequential-tool-calls`
can tell a run of independent calls from parallel ones (`asyncio.gather`, the Agents SDK's
parallel tool calls) and from an agent loop (an LLM call between two tools makes the second
dependent). Arguments and results are never recorded: like the HTTP hooks, the hook keeps
the id-like values of a call's result in the request (collectors/hooks/_tools.py) and marks a later
call whose arguments carry one with `latprof.tool.depends_on`.

Patch points, each when (if ever) its library is imported (`uninstall()` restores):

- LangChain (`langchain_core`): `BaseTool.run` and `BaseTool.arun`, which every tool's
  `invoke`/`ainvoke`/`run`/`arun`/`batch` goes through; the call id is the `tool_call_id`
  keyword `invoke` passes for a `ToolCall` input.
- OpenAI Agents SDK (`agents`): `_invoke_function_tool_with_metadata`, the function the
  runner calls once per function-tool call (`agents.run_internal.tool_execution`, and its
  definition in `agents.tool`); name and call id from its `ToolContext`.
- MCP (`mcp`): `ClientSession.call_tool`, through which `mcp.Client`, session groups and
  the Agents SDK's MCP servers call a server's tool (MCP has no call id).

A tool called right inside a call of the same name (an MCP tool the Agents SDK runs) is
recorded once, by the outer hook; other tools called inside a tool (an agent used as a tool)
are recorded, nested under it. Outside a request each patched call costs a context-variable read. Every
error of the hook is counted, never raised into the service.
"""

from __future__ import annotations

import contextvars
import sys
import time
from typing import Any, Callable

from latprof.collectors.hooks import _scaffold, _tools, runtime
from latprof.layers import TOOL
from latprof.semconv import (
    ERROR_TYPE,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    TOOL_DEPENDS_ON,
    TOOL_FRAMEWORK,
)

HOOK = "agent_tools"

_now = time.time_ns
_request_var = runtime._request
_parent_var = runtime._parent
#: The name of the tool call being recorded in this task: the same tool called right inside it
#: (an MCP tool the Agents SDK runs) is the same call, not recorded again.
_in_tool: contextvars.ContextVar[str | None] = contextvars.ContextVar("latprof_in_tool", default=None)




# --- one call --------------------------------------------------------------------------------


class _Call:
    """A tool call inside a request, from `_begin` to `_end`."""

    __slots__ = ("state", "segment_id", "parent", "start_ns", "attrs", "parent_token", "tool_token")

    def __init__(self, state: runtime.RequestState, name: str, call_id: Any, framework: str, arguments: Any) -> None:
        self.state = state
        self.segment_id = runtime.new_id()
        self.parent = _parent_var.get()
        attrs: dict[str, Any] = {GEN_AI_OPERATION_NAME: "execute_tool", GEN_AI_TOOL_NAME: name, TOOL_FRAMEWORK: framework}
        if isinstance(call_id, str) and call_id:
            attrs[GEN_AI_TOOL_CALL_ID] = call_id
        if state.scratch is not None and arguments is not None:  # an earlier call may have answered a value it sends
            depends = _tools.depends_on(state, _as_bytes(arguments))
            if depends is not None:
                attrs[TOOL_DEPENDS_ON] = depends
        self.attrs = attrs
        self.parent_token = _parent_var.set(self.segment_id)  # what the tool does nests under it
        self.tool_token = _in_tool.set(name)
        self.start_ns = _now()


def _begin(name: Any, call_id: Any, framework: str, arguments: Any) -> _Call | None:
    """A call to record, or None outside a request, inside another tool call, or when the hook fails."""
    state = _request_var.get()
    if state is None or runtime._writer is None:
        return None
    try:
        name = str(name)
        if _in_tool.get() == name:
            return None
        return _Call(state, name, call_id, framework, arguments)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


def _end(call: _Call, result: Any, error: BaseException | str | None) -> None:
    end = _now()
    try:
        try:
            _parent_var.reset(call.parent_token)
            _in_tool.reset(call.tool_token)
        except ValueError:  # ended in another context than it began
            pass
        attrs = call.attrs
        if error is not None:
            attrs[ERROR_TYPE] = error if isinstance(error, str) else type(error).__qualname__
        runtime.record(f"execute_tool {attrs[GEN_AI_TOOL_NAME]}", TOOL, call.start_ns, end, attrs,
                       parent_id=call.parent if call.parent is not None else runtime.ROOT,
                       segment_id=call.segment_id, state=call.state, copy_attrs=False)
        runtime.saw(HOOK)
        if error is None and result is not None:
            _tools.keep(call.state, call.segment_id, _as_bytes(result))
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _as_bytes(value: Any) -> bytes:
    """Arguments or a result as text to look for id-like values in (never recorded)."""
    if isinstance(value, bytes):
        return value[: _tools.MAX_SCAN_BYTES]
    content = getattr(value, "content", None)  # a LangChain ToolMessage, an MCP CallToolResult
    if content is not None and not isinstance(value, (str, dict, list, tuple)):
        value = content
    text = value if isinstance(value, str) else repr(value)
    return text[: _tools.MAX_SCAN_BYTES].encode("utf-8", "replace")


# --- LangChain ---------------------------------------------------------------------------------


def _patch_langchain(module: Any) -> None:
    scaffold.wrap(module.BaseTool, "run", _langchain_run)
    scaffold.wrap(module.BaseTool, "arun", _langchain_arun)


def _langchain_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        call = _begin(getattr(self, "name", "tool"), kwargs.get("tool_call_id"), "langchain", tool_input)
        if call is None:
            return original(self, tool_input, *args, **kwargs)
        try:
            result = original(self, tool_input, *args, **kwargs)
        except BaseException as exc:
            _end(call, None, exc)
            raise
        _end(call, result, None)
        return result

    return run


def _langchain_arun(original: Callable[..., Any]) -> Callable[..., Any]:
    async def arun(self: Any, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        call = _begin(getattr(self, "name", "tool"), kwargs.get("tool_call_id"), "langchain", tool_input)
        if call is None:
            return await original(self, tool_input, *args, **kwargs)
        try:
            result = await original(self, tool_input, *args, **kwargs)
        except BaseException as exc:
            _end(call, None, exc)
            raise
        _end(call, result, None)
        return result

    return arun


# --- OpenAI Agents SDK -------------------------------------------------------------------------

_INVOKE = "_invoke_function_tool_with_metadata"


def _patch_agents(module: Any) -> None:
    scaffold.wrap(module, _INVOKE, _agents_invoke)


def _agents_invoke(original: Callable[..., Any]) -> Callable[..., Any]:
    async def invoke(*args: Any, **kwargs: Any) -> Any:
        if _request_var.get() is None:
            return await original(*args, **kwargs)
        tool = kwargs.get("function_tool")
        context = kwargs.get("context")
        call = _begin(getattr(tool, "name", None) or getattr(context, "tool_name", "tool"),
                      getattr(context, "tool_call_id", None), "openai-agents", kwargs.get("arguments"))
        if call is None:
            return await original(*args, **kwargs)
        try:
            result = await original(*args, **kwargs)
        except BaseException as exc:
            _end(call, None, exc)
            raise
        failed = getattr(result, "is_sdk_generated_error", False) is True  # the SDK answered the tool's error
        _end(call, None if failed else getattr(result, "output", None), "tool_error" if failed else None)
        return result

    return invoke


# --- MCP -------------------------------------------------------------------------------------


def _patch_mcp(module: Any) -> None:
    scaffold.wrap(module.ClientSession, "call_tool", _mcp_call_tool)


def _mcp_call_tool(original: Callable[..., Any]) -> Callable[..., Any]:
    async def call_tool(self: Any, name: str, arguments: Any = None, *args: Any, **kwargs: Any) -> Any:
        call = _begin(name, None, "mcp", arguments)
        if call is None:
            return await original(self, name, arguments, *args, **kwargs)
        try:
            result = await original(self, name, arguments, *args, **kwargs)
        except BaseException as exc:
            _end(call, None, exc)
            raise
        failed = getattr(result, "is_error", False) is True  # the server answered the tool's error
        _end(call, None if failed else result, "tool_error" if failed else None)
        return result

    return call_tool


# --- install ---------------------------------------------------------------------------------

_T = _scaffold.Target
_AGENTS = [_scaffold.Tested("agents", "0.24", "0.24", "openai_agents")]
#: What the hook patches, each part when (if ever) its library is imported, in the lines it is tested on.
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("langchain_core.tools.base", [
        _T("langchain_core.tools.base", "BaseTool", "run", False),
        _T("langchain_core.tools.base", "BaseTool", "arun", True),
    ], _patch_langchain, [_scaffold.Tested("langchain_core", "1.8", "1.8")]),
    _scaffold.Library("agents.tool", [_T("agents.tool", "", _INVOKE, True)], _patch_agents, _AGENTS),
    _scaffold.Library("agents.run_internal.tool_execution",
                      [_T("agents.run_internal.tool_execution", "", _INVOKE, True)], _patch_agents, _AGENTS),
    _scaffold.Library("mcp.client.session", [_T("mcp.client.session", "ClientSession", "call_tool", True)],
                      _patch_mcp, [_scaffold.Tested("mcp", "2.3", "2.3")]),
])  # fmt: skip
#: Patch LangChain, the Agents SDK and MCP when (or if already) imported; idempotent.
install = scaffold.install
#: Put every patched attribute back (tests).
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""

    def describe() -> str:
        loaded = [lib.module.split(".")[0] for lib in scaffold.libraries if lib.module in sys.modules]
        frameworks = ", ".join(sorted(set(loaded))) or "none of LangChain, the Agents SDK and MCP"
        return (f"tool calls of the frameworks loaded ({frameworks}) that start after the injection are seen, tools"
                " defined before it included; calls already running are not")

    return scaffold.late_coverage(describe)
