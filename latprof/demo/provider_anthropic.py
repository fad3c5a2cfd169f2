"""The demo provider's Anthropic Messages API: `POST /v1/messages` requests read, and answers written, in its wire format.

`latprof.demo.provider` serves the endpoint with the timing and settings of its chat endpoint
(TTFT, time per output token, output tokens, spikes, 429s with `retry-after-ms` and
`retry-after`, which the official anthropic client honours, `fail_first`, a tool use when the
request has `tools`); this module only says what the answer looks like:

- non-streamed: one `message` object, its `content` a `text` block (or a `tool_use` block),
  `stop_reason` `end_turn` / `max_tokens` / `tool_use`, and `usage.input_tokens` /
  `usage.output_tokens`;
- streamed: SSE `event: message_start` (the model, and `usage.input_tokens`),
  `content_block_start`, `ping` at once, one `content_block_delta` per output token
  (`text_delta`, or `input_json_delta` for a tool use), then `content_block_stop`,
  `message_delta` (`stop_reason`, `usage.output_tokens`) and `message_stop`;
- errors: `{"type": "error", "error": {"type": "rate_limit_error", "message": ...}}`.

The client's base URL is the provider's root (`http://127.0.0.1:PORT`, no `/v1`): the
anthropic client adds `/v1/messages` itself.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from latprof.demo.provider import _Answer

#: The provider's finish reasons in the Messages API's words.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
#: An error's `error.type` by HTTP status.
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error", 429: "rate_limit_error"}


def is_messages_path(path: str) -> bool:
    """True for the Messages endpoint: `/v1/messages`, or `/messages` for a base URL that ends in `/v1`."""
    return path in ("/v1/messages", "/messages") or path.endswith("/v1/messages")


def read_request(payload: dict[str, Any]) -> tuple[Any, bool, list[dict[str, Any]], Any]:
    """(what holds the prompt's text, whether the last message is a tool result, the tools, the max_tokens) of a Messages request.

    A `tool_choice` of type `none` leaves the request without tools.
    """
    messages = payload.get("messages") or []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    content = last.get("content")
    last_is_tool_result = last.get("role") == "user" and isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content
    )
    choice = payload.get("tool_choice")
    tools = [] if isinstance(choice, dict) and choice.get("type") == "none" else [
        t for t in payload.get("tools") or [] if isinstance(t, dict) and t.get("name")
    ]
    return [messages, payload.get("system") or ""], last_is_tool_result, tools, payload.get("max_tokens")


def _usage(answer: _Answer) -> dict[str, Any]:
    return {"input_tokens": answer.input_tokens, "output_tokens": len(answer.pieces),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "service_tier": "standard"}  # fmt: skip


def _tool_id(answer: _Answer) -> str:
    return "toolu_" + answer.call_id


def message(answer: _Answer, number: int) -> dict[str, Any]:
    """The non-streamed answer: a `message` with its whole content and usage."""
    if answer.tool_name:
        block: dict[str, Any] = {"type": "tool_use", "id": _tool_id(answer), "name": answer.tool_name, "input": json.loads(answer.text)}
    else:
        block = {"type": "text", "text": answer.text}
    return {
        "id": f"msg_{number}", "type": "message", "role": "assistant", "model": answer.model, "content": [block],
        "stop_reason": STOP_REASONS.get(answer.finish_reason, "end_turn"), "stop_sequence": None, "usage": _usage(answer),
    }  # fmt: skip


def events(answer: _Answer, number: int) -> list[tuple[int | None, bytes]]:
    """The streamed answer as (token slot it waits for, None = at once; SSE bytes) pairs."""
    out: list[tuple[int | None, bytes]] = []

    def event(when: int | None, body: dict[str, Any]) -> None:
        out.append((when, f"event: {body['type']}\n".encode() + b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"))

    start = {**message(answer, number), "content": [], "stop_reason": None, "usage": {**_usage(answer), "output_tokens": 1}}
    event(None, {"type": "message_start", "message": start})
    if answer.tool_name:
        block: dict[str, Any] = {"type": "tool_use", "id": _tool_id(answer), "name": answer.tool_name, "input": {}}
        kind, field = "input_json_delta", "partial_json"
    else:
        block, kind, field = {"type": "text", "text": ""}, "text_delta", "text"
    event(None, {"type": "content_block_start", "index": 0, "content_block": block})
    event(None, {"type": "ping"})
    for i, piece in enumerate(answer.pieces):
        event(i, {"type": "content_block_delta", "index": 0, "delta": {"type": kind, field: piece}})
    done_at = len(answer.pieces)
    event(done_at, {"type": "content_block_stop", "index": 0})
    event(done_at, {"type": "message_delta", "delta": {"stop_reason": STOP_REASONS.get(answer.finish_reason, "end_turn"), "stop_sequence": None},
                    "usage": {"output_tokens": len(answer.pieces)}})
    event(done_at, {"type": "message_stop"})
    return out


def error_body(status: int, message_text: str) -> dict[str, Any]:
    """An error answer in the Messages API's shape."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message_text}}
