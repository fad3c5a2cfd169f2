"""An OpenAI-compatible LLM provider on loopback whose TTFT, decode speed and 429s are settings.

Tests and `latprof demo` point the official `openai` client at it to create every
LLM-side latency fault decisively: a TTFT floor, a prefill cost per 1k input tokens, random
provider-side queueing spikes, a time per output token (slower with more streams in flight), the number of output tokens (and a
share of long answers among short ones), a concurrency limit that queues requests, and 429s
(with `retry-after-ms`) for the first attempts of each request, and a connection reset
mid-stream (`reset_after_events`).

Endpoints (HTTP/1.1 with keep-alive, bound to 127.0.0.1 only):

- `POST /v1/chat/completions`: non-streamed, or streamed as SSE `data: {...}` chunks ending
  `data: [DONE]`; a final usage chunk (`choices: []`) only when the request asked
  `stream_options.include_usage`. With `tools` in the request (and the last message not a
  tool result) the answer is a tool call whose arguments stream as `tool_calls` deltas with
  no content.
- `POST /v1/responses`: non-streamed, or streamed as `response.created`, ...,
  `response.output_text.delta` (or `response.function_call_arguments.delta`) ...,
  `response.completed` events.
- `POST /v1/messages` (and `/messages`): the Anthropic Messages API, non-streamed or streamed
  as `message_start`, ..., `content_block_delta` ..., `message_stop` events, errors in its
  shape (`latprof.demo.provider_anthropic`); the anthropic client's base URL is the root, no `/v1`.
- `GET /v1/models`, and `GET /latprof/stats` (attempts, 429s, ... served so far).
- `GET /metrics` in engine mode: vLLM's Prometheus metrics (501 without prometheus_client).

Timing of a streamed answer: the headers and the role-only first chunk (content "") go out at
once, the first token after TTFT, then one token every `tpot_ms`, the finish chunk one
`tpot_ms` after the last token. A non-streamed answer comes whole after TTFT + tokens x tpot.

Settings are the fields of `ProviderConfig`: per server (`Provider(ttft_ms=300)`, or
`--ttft-ms 300` standalone) and per request, as a `latprof` object in the JSON body
(`extra_body={"latprof": {"ttft_ms": 300}}` with the openai client) or as headers
(`x-latprof-ttft-ms: 300`). The text, the spikes and which answers are long are
deterministic for a seed (the n-th call served draws the same as in any other run).

Output length: every answer has `output_tokens` tokens, except that with
`long_output_probability` p a call has `long_output_tokens` instead (most answers short, a few
long: decode owns the tail). Both are capped by the request's max_tokens / max_output_tokens
(the answer then ends with finish reason `length`). With p = 0 nothing is drawn.

Decode under load: with `tpot_ms_per_stream_in_flight` k, a streamed answer's next token comes
`tpot_ms` + k x (streams decoding on this provider then - 1) after its last one, as in a
crowded batch: a stream decodes from its first token to its last event, and every stream on
the server counts (whatever its model or settings). A non-streamed answer's time is planned
up front and neither slows nor is slowed. With k = 0 tokens keep their fixed schedule.

Engine mode (`engine_max_running` > 0): every answer (chat, Responses, Messages; streamed or
not) comes from a continuous-batching scheduler with vLLM's semantics (`latprof.demo.engine`):
a running batch of at most `engine_max_running` requests, a FIFO queue, steps of
`engine_step_ms` + `engine_step_ms_per_running` x running (+ `engine_prefill_ms_per_1k_tokens`
per 1000 tokens prefilled in the step), one token per running request per step, an optional
KV budget (`engine_kv_tokens`) that preempts; `/metrics` shows vLLM's gauges, counters and
histograms. Each token is sent when the engine makes it. `ttft_ms` (and a spike) is then only
the way to the engine, waited before the request joins its queue (the network and the API
server: 0 for an engine on the spot); `ttft_ms_per_1k_input_tokens`, `tpot_ms`,
`tpot_ms_per_stream_in_flight` and `max_concurrency` play no part. A client that leaves aborts
its request (freed from the batch or the queue, counted `finished_reason="abort"`).

    with Provider(ttft_ms=300, tpot_ms=10, output_tokens=20) as provider:
        client = openai.OpenAI(base_url=provider.url, api_key="unused")

    python -m latprof.demo.provider --port 8911 --ttft-ms 300 --spike-probability 0.05 --spike-ms 2000
    python -m latprof.demo.provider --output-tokens 8 --long-output-probability 0.04 --long-output-tokens 240
    python -m latprof.demo.provider --ttft-ms 0 --engine-max-running 8 --engine-kv-tokens 4000   # then GET /metrics
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from latprof.demo import provider_anthropic
from latprof.demo.engine import Engine, EngineRequest, MetricsUnavailable

HOST = "127.0.0.1"

_WORDS = (
    "the provider floor is the part of time to first token that no prompt change moves while decode "
    "grows with every output token and a pool held across the call starves the next request of its "
    "connection so the tail belongs to whichever layer waits longest"
).split()


@dataclass(frozen=True)
class ProviderConfig:
    """How the provider answers; every field can also be set per request."""

    #: TTFT of a tiny prompt: network, provider queueing and the fixed part of prefill.
    ttft_ms: float = 200.0
    #: TTFT added per 1000 input tokens (prefill); input tokens are estimated as characters / 4.
    ttft_ms_per_1k_input_tokens: float = 0.0
    #: Chance that an attempt waits `spike_ms` more before its first token (provider-side queueing).
    spike_probability: float = 0.0
    spike_ms: float = 0.0
    #: Time per output token after the first.
    tpot_ms: float = 10.0
    #: Time per output token added for each other stream decoding on this provider at the time
    #: (a crowded batch): a token comes `tpot_ms` + this x (streams decoding - 1) after the last.
    tpot_ms_per_stream_in_flight: float = 0.0
    #: Output tokens of an answer (capped by the request's max_tokens / max_output_tokens).
    output_tokens: int = 32
    #: Chance that an answer has `long_output_tokens` output tokens instead of `output_tokens`
    #: (same cap); drawn per call from the seed, independently of the spikes.
    long_output_probability: float = 0.0
    long_output_tokens: int = 0
    #: Answer 429 to the first N attempts of each request (counted by openai's
    #: `x-stainless-retry-count`, else per `Idempotency-Key`, else per server).
    fail_first: int = 0
    #: The `retry-after-ms` header of a 429.
    retry_after_ms: int = 200
    #: At most this many requests in prefill or decode at once, the others queue (0: unlimited).
    max_concurrency: int = 0
    #: Send the role-only chunk (empty content) right after the headers, long before the first token.
    role_chunk_first: bool = True
    #: Answer with a tool call: "auto" (when the request has tools and the last message is not a
    #: tool result), "always" (when it has tools) or "never".
    tool_calls: str = "auto"
    #: Reset the TCP connection (RST) in place of the Nth event of a streamed answer, after
    #: sending the N - 1 before it (0: never): a provider or proxy dropping a stream mid-way.
    reset_after_events: int = 0
    #: Answer with `connection: close` and close the connection: every call opens a new one (a
    #: provider or proxy that does not keep connections alive).
    close_connection: bool = False
    #: Wait this long on each new connection before serving it (before its TLS handshake with
    #: TLS, so that it falls inside the client's handshake): the connection set-up of a far
    #: endpoint, paid once per connection.
    connect_delay_ms: float = 0.0
    #: Chance that a new connection waits `connect_spike_ms` more (a lost handshake packet waits
    #: for its retransmission: 1 s on Linux); drawn per connection from the seed.
    connect_spike_probability: float = 0.0
    connect_spike_ms: float = 0.0
    #: Serve HTTPS with this certificate chain and key (PEM files; both or neither): the client
    #: must trust the certificate's CA.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: The model answered with when the request names none.
    model: str = "latprof-demo-1"
    seed: int = 0
    #: Engine mode (> 0): answers come from a continuous-batching scheduler with vLLM's semantics
    #: (`latprof.demo.engine`) running at most this many requests at once (vLLM's `max_num_seqs`),
    #: the others waiting in its FIFO queue, and `GET /metrics` serves vLLM's Prometheus metrics.
    #: 0: off (the timing settings above apply).
    engine_max_running: int = 0
    #: The engine's KV cache in tokens (a request holds input + generated tokens); a batch that
    #: outgrows it preempts its newest request, which prefills again later (0: unlimited).
    engine_kv_tokens: int = 0
    #: The engine's time per step (one output token for each running request) ...
    engine_step_ms: float = 10.0
    #: ... plus this per running request (a bigger batch decodes each token slower) ...
    engine_step_ms_per_running: float = 1.0
    #: ... plus this per 1000 tokens prefilled in the step (input + generated, for a restart).
    engine_prefill_ms_per_1k_tokens: float = 20.0
    #: The `model_name` label of the engine's metrics ("": the model of the first request).
    engine_model: str = ""

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "ttft_ms_per_1k_input_tokens", "spike_ms", "tpot_ms", "connect_delay_ms", "connect_spike_ms",
                     "tpot_ms_per_stream_in_flight", "engine_step_ms", "engine_step_ms_per_running", "engine_prefill_ms_per_1k_tokens"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
        for name in ("spike_probability", "long_output_probability", "connect_spike_probability"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
                raise ValueError(f"{name} must be within [0, 1], not {value!r}")
        for name in ("output_tokens", "long_output_tokens", "fail_first", "retry_after_ms", "max_concurrency", "reset_after_events",
                     "engine_max_running", "engine_kv_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, not {value!r}")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tool_calls not in ("auto", "always", "never"):
            raise ValueError(f"tool_calls must be auto, always or never, not {self.tool_calls!r}")

    def with_overrides(self, overrides: Mapping[str, Any]) -> ProviderConfig:
        """A copy with `overrides` applied; strings (from headers) are converted to the field's type."""
        types = {f.name: type(f.default) for f in fields(self)}
        changes: dict[str, Any] = {}
        for name, value in overrides.items():
            if name not in types or name in _SERVER_ONLY:
                raise ValueError(f"unknown provider setting {name!r}" + (" (a per-server setting)" if name in _SERVER_ONLY else ""))
            changes[name] = _convert(value, types[name], name)
        return dataclasses.replace(self, **changes) if changes else self


#: Settings that apply to the server as a whole, not per request.
_SERVER_ONLY = frozenset({"max_concurrency", "seed", "connect_delay_ms", "connect_spike_probability", "connect_spike_ms",
                          "tls_cert_file", "tls_key_file", "engine_max_running", "engine_kv_tokens", "engine_step_ms",
                          "engine_step_ms_per_running", "engine_prefill_ms_per_1k_tokens", "engine_model"})


def _convert(value: Any, kind: type, name: str) -> Any:
    if isinstance(value, str) and kind is not str:
        if kind is bool:
            if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(f"{name} must be true or false, not {value!r}")
            return value.lower() in ("1", "true", "yes")
        try:
            return kind(float(value)) if kind is int and "." not in value else kind(value)
        except ValueError:
            raise ValueError(f"{name} must be a {kind.__name__}, not {value!r}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


# --- HTTP/1.1 on asyncio streams ------------------------------------------------------------------


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    #: True once the client has closed its end (set by the connection's handler).
    client_left: Callable[[], bool] | None = None


class _BadRequest(Exception):
    pass


_MAX_HEADER_LINES = 100
_MAX_BODY_BYTES = 64 * 1024 * 1024


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """The next request on a connection, or None when the client closed it."""
    line = await reader.readline()
    while line in (b"\r\n", b"\n"):  # tolerate stray blank lines between requests
        line = await reader.readline()
    if not line:
        return None
    try:
        method, target, version = line.decode("latin-1").split()
    except ValueError:
        raise _BadRequest("malformed request line") from None
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADER_LINES):
        header = await reader.readline()
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    else:
        raise _BadRequest("too many headers")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                break
            parts.append(await reader.readexactly(size))
            await reader.readline()
        body = b"".join(parts)
    else:
        length = int(headers.get("content-length", "0") or "0")
        if length > _MAX_BODY_BYTES:
            raise _BadRequest("body too large")
        body = await reader.readexactly(length) if length else b""
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return _Request(method.upper(), target.split("?", 1)[0], headers, body, keep_alive)


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 429: "Too Many Requests",
            501: "Not Implemented"}


def _head(status: int, headers: Sequence[tuple[str, str]], keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append(f"connection: {'keep-alive' if keep_alive else 'close'}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


_END = b"0\r\n\r\n"  # the end of a chunked body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# --- what the provider says -------------------------------------------------------------------------


def _text_of(value: Any) -> str:
    """All text in a message content, a Responses input, or a list of their parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(_text_of(item) for item in value)
    if isinstance(value, dict):
        return " ".join(_text_of(value[key]) for key in ("content", "text", "input", "output", "arguments") if key in value)
    return ""


def _estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def _split(text: str, pieces: int) -> list[str]:
    """`text` cut into `pieces` consecutive non-empty parts (fewer when text is shorter)."""
    pieces = max(1, min(pieces, len(text)))
    bounds = [round(i * len(text) / pieces) for i in range(pieces + 1)]
    return [text[bounds[i] : bounds[i + 1]] for i in range(pieces)]


@dataclass
class _Answer:
    """One answer, planned before it is sent."""

    model: str
    input_tokens: int
    pieces: list[str]  # one per output token: words of the text, or parts of the tool arguments
    tool_name: str | None  # set for a tool call
    call_id: str
    finish_reason: str  # stop, length or tool_calls
    ttft_s: float
    tpot_s: float
    front_s: float = 0.0  # engine mode: the wait before the engine sees it (ttft_ms and a spike, no prefill)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class _ProviderServer:
    """The request handling, on one asyncio loop."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        # A stream of its own, so that long answers never change which calls spike.
        self._length_rng = random.Random(f"{config.seed}:long-output")
        self._ids = 0
        self._attempts_by_key: dict[str, int] = {}
        self._anonymous_attempts = 0
        self._limit = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
        self.stats = {"attempts": 0, "rate_limited": 0, "answered": 0, "streamed": 0, "disconnected": 0, "reset": 0}
        self.decoding = 0  # streams between their first token and their last event (`tpot_ms_per_stream_in_flight`)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.tls = _tls_context(config)
        self._connect_rng = random.Random(f"{config.seed}:connect")  # its own stream: spikes of calls stay the same
        self.engine: Engine | None = None
        if config.engine_max_running:  # built on the serving loop: its task ends with the others when the server stops
            self.engine = Engine(config.engine_max_running, kv_tokens=config.engine_kv_tokens, step_ms=config.engine_step_ms,
                                 step_ms_per_running=config.engine_step_ms_per_running,
                                 prefill_ms_per_1k_tokens=config.engine_prefill_ms_per_1k_tokens, model_name=config.engine_model)
            self.tasks.add(asyncio.get_running_loop().create_task(self.engine.run(), name="latprof-demo-engine"))

    def connect_delay_ms(self) -> float:
        """How long the next new connection waits before it is served."""
        config = self.config
        spike = config.connect_spike_probability and self._connect_rng.random() < config.connect_spike_probability
        return config.connect_delay_ms + (config.connect_spike_ms if spike else 0.0)

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
        try:
            while True:
                try:
                    request = await _read_request(reader)
                except _BadRequest as exc:
                    await self._error(writer, 400, str(exc), "invalid_request_error", keep_alive=False)
                    break
                if request is not None:
                    request.client_left = lambda: reader.at_eof() or writer.transport.is_closing()
                if request is None or not await self._dispatch(request, writer) or not request.keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, UnicodeDecodeError):
            self.stats["disconnected"] += 1
        except asyncio.CancelledError:  # the server stops: end quietly (asyncio logs a cancelled handler)
            pass
        finally:
            if task is not None:
                self.tasks.discard(task)
            writer.close()

    async def _dispatch(self, request: _Request, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must be closed."""
        path = request.path.rstrip("/")
        if path in ("/v1/models", "/models") and request.method == "GET":
            body = {"object": "list", "data": [{"id": self.config.model, "object": "model", "created": 0, "owned_by": "latprof"}]}
            return await self._json(writer, 200, body, request.keep_alive)
        if path == "/latprof/stats" and request.method == "GET":
            return await self._json(writer, 200, dict(self.stats), request.keep_alive)
        if path == "/metrics" and request.method == "GET" and self.engine is not None:
            try:
                return await self._text(writer, 200, self.engine.metrics_text(), self.engine.content_type, request.keep_alive)
            except MetricsUnavailable as exc:
                return await self._text(writer, 501, f"{exc}\n".encode(), "text/plain; charset=utf-8", request.keep_alive)
        if path in ("/v1/chat/completions", "/chat/completions"):
            kind = "chat"
        elif path in ("/v1/responses", "/responses"):
            kind = "responses"
        elif provider_anthropic.is_messages_path(path):
            kind = "anthropic"
        else:
            return await self._error(writer, 404, f"no route {request.method} {request.path}", "invalid_request_error", request.keep_alive)
        if request.method != "POST":
            return await self._error(writer, 405, f"use POST for {request.path}", "invalid_request_error", request.keep_alive, api=kind)
        try:
            payload = json.loads(request.body or b"{}")
            if not isinstance(payload, dict):
                raise ValueError("the body must be a JSON object")
            overrides = dict(payload.pop("latprof", None) or {})
            for name, value in request.headers.items():
                if name.startswith("x-latprof-"):
                    overrides[name[len("x-latprof-") :].replace("-", "_")] = value
            config = self.config.with_overrides(overrides)
        except (ValueError, TypeError) as exc:
            return await self._error(writer, 400, str(exc), "invalid_request_error", request.keep_alive, api=kind)
        if config.close_connection:
            request.keep_alive = False

        self.stats["attempts"] += 1
        if self._attempt_of(request) < config.fail_first:
            self.stats["rate_limited"] += 1
            headers = [("retry-after-ms", str(config.retry_after_ms)), ("retry-after", str(math.ceil(config.retry_after_ms / 1000)))]
            return await self._error(writer, 429, "Rate limit reached (latprof demo provider)", "rate_limit_exceeded", request.keep_alive, headers, api=kind)

        if self._limit is not None and self.engine is None:
            async with self._limit:  # queued requests wait here: provider-side queueing, inside TTFT
                return await self._answer(kind, payload, config, request, writer)
        return await self._answer(kind, payload, config, request, writer)

    def _attempt_of(self, request: _Request) -> int:
        """Which attempt of its request this is, 0 for the first."""
        retry_count = request.headers.get("x-stainless-retry-count")
        if retry_count is not None and retry_count.isdigit():
            return int(retry_count)
        key = request.headers.get("idempotency-key")
        if key:
            if len(self._attempts_by_key) > 10_000:
                self._attempts_by_key.clear()
            attempt = self._attempts_by_key.get(key, 0)
            self._attempts_by_key[key] = attempt + 1
            return attempt
        self._anonymous_attempts += 1
        return self._anonymous_attempts - 1

    def _plan(self, kind: str, payload: dict[str, Any], config: ProviderConfig) -> _Answer:
        if kind == "chat":
            messages = payload.get("messages") or []
            prompt = _text_of(messages)
            last_is_tool_result = bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool"
            tools = [t.get("function", t) for t in payload.get("tools") or [] if isinstance(t, dict)]
            limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
        elif kind == "anthropic":
            texts, last_is_tool_result, tools, limit = provider_anthropic.read_request(payload)
            prompt = _text_of(texts)
        else:
            items = payload.get("input")
            prompt = _text_of(items) + " " + _text_of(payload.get("instructions") or "")
            last_is_tool_result = isinstance(items, list) and bool(items) and isinstance(items[-1], dict) and items[-1].get("type") == "function_call_output"
            tools = [t for t in payload.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
            limit = payload.get("max_output_tokens")
        tokens = config.output_tokens
        if config.long_output_probability and self._length_rng.random() < config.long_output_probability:
            tokens = config.long_output_tokens
        finish = "stop"
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < tokens:
            tokens, finish = limit, "length"
        input_tokens = _estimate_tokens(prompt)
        ttft_ms = config.ttft_ms + config.ttft_ms_per_1k_input_tokens * input_tokens / 1000
        front_ms = config.ttft_ms
        if config.spike_probability and self._rng.random() < config.spike_probability:
            ttft_ms += config.spike_ms
            front_ms += config.spike_ms
        offset = zlib.crc32(f"{config.seed}:{prompt}".encode())
        words = [_WORDS[(offset + i) % len(_WORDS)] for i in range(tokens)]
        wants_tool = tools and payload.get("tool_choice") != "none" and (config.tool_calls == "always" or (config.tool_calls == "auto" and not last_is_tool_result))
        number = self._next_id()
        if wants_tool and tokens:
            name = str(tools[0].get("name") or "tool")
            arguments = json.dumps({"query": " ".join(words)})
            return _Answer(str(payload.get("model") or config.model), input_tokens, _split(arguments, tokens), name,
                           f"call_{number}", "tool_calls", ttft_ms / 1000, config.tpot_ms / 1000, front_ms / 1000)
        pieces = [("" if i == 0 else " ") + word for i, word in enumerate(words)]
        return _Answer(str(payload.get("model") or config.model), input_tokens, pieces, None, f"call_{number}", finish,
                       ttft_ms / 1000, config.tpot_ms / 1000, front_ms / 1000)

    async def _answer(self, kind: str, payload: dict[str, Any], config: ProviderConfig, request: _Request, writer: asyncio.StreamWriter) -> bool:
        loop = asyncio.get_running_loop()
        start = loop.time()
        answer = self._plan(kind, payload, config)
        number = self._next_id()
        stream = bool(payload.get("stream"))
        headers = [("x-request-id", f"req_{number}"), ("openai-model", answer.model)]
        job: EngineRequest | None = None
        try:
            if not stream:
                if self.engine is not None:
                    job = await self._to_engine(answer, request)
                    if not await job.until(None):
                        return False  # the client left
                else:
                    await _sleep_until(loop, start + answer.ttft_s + len(answer.pieces) * answer.tpot_s)
                body = (self._chat_completion(answer, number) if kind == "chat" else provider_anthropic.message(answer, number)
                        if kind == "anthropic" else self._response(answer, number, "completed"))
                headers.append(("openai-processing-ms", str(round((loop.time() - start) * 1000))))
                self.stats["answered"] += 1
                return await self._json(writer, 200, body, request.keep_alive, headers)
            headers += [("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache"),
                        ("transfer-encoding", "chunked"), ("openai-processing-ms", str(round((loop.time() - start) * 1000)))]
            writer.write(_head(200, headers, request.keep_alive))
            events = list(self._chat_events(answer, number, payload, config) if kind == "chat" else provider_anthropic.events(answer, number)
                          if kind == "anthropic" else self._response_events(answer, number))
            if self.engine is not None:
                job = await self._to_engine(answer, request)
            if not await self._stream(events, answer, config, writer, start, job):
                return False
        finally:
            if job is not None and self.engine is not None:
                self.engine.abort(job)  # a client that left, or a server that stops (nothing once done)
        self.stats["answered"] += 1
        self.stats["streamed"] += 1
        return True

    async def _to_engine(self, answer: _Answer, request: _Request) -> EngineRequest:
        """The answer's request, queued in the engine after the fixed part of TTFT (the way there)."""
        assert self.engine is not None
        if answer.front_s:
            await asyncio.sleep(answer.front_s)
        return self.engine.submit(answer.input_tokens, len(answer.pieces), model=answer.model, finish_reason=answer.finish_reason,
                                  gone=request.client_left)

    async def _stream(self, events: list[tuple[int | None, bytes]], answer: _Answer, config: ProviderConfig, writer: asyncio.StreamWriter,
                      start: float, job: EngineRequest | None) -> bool:
        """Send a streamed answer's events, each at its token's time; False when the connection is done for."""
        loop = asyncio.get_running_loop()
        first_token_at = start + answer.ttft_s
        per_stream_s = config.tpot_ms_per_stream_in_flight / 1000
        slot, slot_at, decoding = 0, first_token_at, False
        try:
            for index, (offset_tokens, data) in enumerate(events):
                if offset_tokens is not None:
                    if job is not None:  # engine mode: when the scheduler has produced it (the last events: when done)
                        if not await job.until(offset_tokens + 1 if offset_tokens < len(answer.pieces) else None):
                            return False  # the client left
                    elif per_stream_s:  # each token one tpot after the last, at the load of the moment
                        while slot < offset_tokens:
                            slot, slot_at = slot + 1, slot_at + answer.tpot_s + per_stream_s * max(0, self.decoding - 1)
                        await _sleep_until(loop, slot_at)
                    else:
                        await _sleep_until(loop, first_token_at + offset_tokens * answer.tpot_s)
                    if not decoding:
                        decoding, self.decoding = True, self.decoding + 1
                if config.reset_after_events and index + 1 >= config.reset_after_events:  # at the Nth event's time
                    _reset(writer)
                    self.stats["reset"] += 1
                    return False
                # The body's end goes with the last event, as a server flushing a finished stream
                # sends it: a client that closes the response after its last event (the openai
                # SDK after `[DONE]`) then finds the body read and keeps the connection.
                writer.write(_chunk(data) + (_END if index + 1 == len(events) else b""))
                await writer.drain()
        finally:
            if decoding:
                self.decoding -= 1
        if not events:
            writer.write(_END)
            await writer.drain()
        return True

    # Each event is (when, bytes): `when` is the token slot it waits for (0 = first token), None = at once.

    def _chat_events(self, answer: _Answer, number: int, payload: dict[str, Any], config: ProviderConfig) -> list[tuple[int | None, bytes]]:
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        base = {"id": f"chatcmpl-{number}", "object": "chat.completion.chunk", "created": int(time.time()), "model": answer.model,
                "system_fingerprint": "fp_latprof"}
        if include_usage:
            base["usage"] = None

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return b"data: " + _dumps(body) + b"\n\n"

        role = {"role": "assistant", "content": None if answer.tool_name else "", "refusal": None}
        events: list[tuple[int | None, bytes]] = []
        if config.role_chunk_first:
            events.append((None, chunk(role)))
        for i, piece in enumerate(answer.pieces):
            if answer.tool_name:
                call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
                if i == 0:
                    call = {"index": 0, "id": answer.call_id, "type": "function", "function": {"name": answer.tool_name, "arguments": piece}}
                delta: dict[str, Any] = {"tool_calls": [call]}
            else:
                delta = {"content": piece}
            if i == 0 and not config.role_chunk_first:
                delta = {**role, **delta}
            events.append((i, chunk(delta)))
        done_at = len(answer.pieces)
        events.append((done_at, chunk({} if answer.pieces or config.role_chunk_first else role, answer.finish_reason)))
        if include_usage:
            usage = {"prompt_tokens": answer.input_tokens, "completion_tokens": len(answer.pieces),
                     "total_tokens": answer.input_tokens + len(answer.pieces)}
            events.append((done_at, b"data: " + _dumps({**base, "choices": [], "usage": usage}) + b"\n\n"))
        events.append((done_at, b"data: [DONE]\n\n"))
        return events

    def _chat_completion(self, answer: _Answer, number: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None if answer.tool_name else answer.text, "refusal": None}
        if answer.tool_name:
            message["tool_calls"] = [{"id": answer.call_id, "type": "function", "function": {"name": answer.tool_name, "arguments": answer.text}}]
        return {
            "id": f"chatcmpl-{number}", "object": "chat.completion", "created": int(time.time()), "model": answer.model,
            "system_fingerprint": "fp_latprof",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": answer.finish_reason}],
            "usage": {"prompt_tokens": answer.input_tokens, "completion_tokens": len(answer.pieces),
                      "total_tokens": answer.input_tokens + len(answer.pieces)},
        }

    def _output_item(self, answer: _Answer, number: int, done: bool) -> dict[str, Any]:
        status = "completed" if done else "in_progress"
        if answer.tool_name:
            return {"id": f"fc_{number}", "type": "function_call", "status": status, "call_id": answer.call_id,
                    "name": answer.tool_name, "arguments": answer.text if done else ""}
        content = [{"type": "output_text", "text": answer.text, "annotations": [], "logprobs": []}] if done else []
        return {"id": f"msg_{number}", "type": "message", "status": status, "role": "assistant", "content": content}

    def _response(self, answer: _Answer, number: int, status: str) -> dict[str, Any]:
        done = status == "completed"
        return {
            "id": f"resp_{number}", "object": "response", "created_at": int(time.time()), "status": status,
            "model": answer.model, "output": [self._output_item(answer, number, True)] if done else [],
            "usage": {"input_tokens": answer.input_tokens, "output_tokens": len(answer.pieces),
                      "total_tokens": answer.input_tokens + len(answer.pieces),
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}} if done else None,
            "error": None, "incomplete_details": None, "instructions": None, "metadata": {}, "parallel_tool_calls": True,
            "temperature": 1.0, "tool_choice": "auto", "tools": [], "top_p": 1.0, "text": {"format": {"type": "text"}},
        }

    def _response_events(self, answer: _Answer, number: int) -> list[tuple[int | None, bytes]]:
        events: list[tuple[int | None, bytes]] = []

        def event(when: int | None, body: dict[str, Any]) -> None:
            body["sequence_number"] = len(events)
            events.append((when, f"event: {body['type']}\n".encode() + b"data: " + _dumps(body) + b"\n\n"))

        event(None, {"type": "response.created", "response": self._response(answer, number, "in_progress")})
        event(None, {"type": "response.in_progress", "response": self._response(answer, number, "in_progress")})
        item = self._output_item(answer, number, False)
        item_id = item["id"]
        event(None, {"type": "response.output_item.added", "output_index": 0, "item": item})
        if answer.tool_name:
            for i, piece in enumerate(answer.pieces):
                event(i, {"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": 0, "delta": piece})
            done_at = len(answer.pieces)
            event(done_at, {"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": 0,
                            "name": answer.tool_name, "arguments": answer.text})
        else:
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            event(None, {"type": "response.content_part.added", "item_id": item_id, "output_index": 0, "content_index": 0, "part": part})
            for i, piece in enumerate(answer.pieces):
                event(i, {"type": "response.output_text.delta", "item_id": item_id, "output_index": 0, "content_index": 0,
                          "delta": piece, "logprobs": []})
            done_at = len(answer.pieces)
            event(done_at, {"type": "response.output_text.done", "item_id": item_id, "output_index": 0, "content_index": 0,
                            "text": answer.text, "logprobs": []})
            event(done_at, {"type": "response.content_part.done", "item_id": item_id, "output_index": 0, "content_index": 0,
                            "part": {**part, "text": answer.text}})
        event(done_at, {"type": "response.output_item.done", "output_index": 0, "item": self._output_item(answer, number, True)})
        event(done_at, {"type": "response.completed", "response": self._response(answer, number, "completed")})
        return events

    async def _text(self, writer: asyncio.StreamWriter, status: int, data: bytes, content_type: str, keep_alive: bool) -> bool:
        writer.write(_head(status, [("content-type", content_type), ("content-length", str(len(data)))], keep_alive) + data)
        await writer.drain()
        return keep_alive

    async def _json(self, writer: asyncio.StreamWriter, status: int, body: Any, keep_alive: bool,
                    headers: Sequence[tuple[str, str]] = ()) -> bool:
        data = _dumps(body)
        writer.write(_head(status, [("content-type", "application/json"), ("content-length", str(len(data))), *headers], keep_alive) + data)
        await writer.drain()
        return keep_alive

    async def _error(self, writer: asyncio.StreamWriter, status: int, message: str, code: str, keep_alive: bool,
                     headers: Sequence[tuple[str, str]] = (), api: str = "openai") -> bool:
        if api == "anthropic":
            return await self._json(writer, status, provider_anthropic.error_body(status, message), keep_alive, headers)
        kind = "requests" if status == 429 else "invalid_request_error"
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        return await self._json(writer, status, body, keep_alive, headers)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a TCP reset (SO_LINGER 0, then abort), as a crashed peer or a proxy does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(frozen=True)
class LocalCertificate:
    """A certificate for 127.0.0.1 from a CA made on the spot (trustme): the provider's PEM files, and the CA to trust."""

    chain_file: str
    key_file: str
    ca_file: str

    @classmethod
    def make(cls, folder: Path) -> LocalCertificate:
        import trustme  # the `demo` extra

        ca = trustme.CA()
        cert = ca.issue_cert(HOST)
        made = cls(str(folder / "provider-chain.pem"), str(folder / "provider-key.pem"), str(folder / "ca.pem"))
        cert.private_key_and_cert_chain_pem.write_to_path(made.chain_file)
        cert.private_key_pem.write_to_path(made.key_file)
        ca.cert_pem.write_to_path(made.ca_file)
        return made

    def settings(self) -> dict[str, str]:
        """The provider settings that serve it."""
        return {"tls_cert_file": self.chain_file, "tls_key_file": self.key_file}

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts it."""
        return ssl.create_default_context(cafile=self.ca_file)


def _tls_context(config: ProviderConfig) -> ssl.SSLContext | None:
    """The server's TLS context when the config names a certificate, else None."""
    if not config.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    return context


class _Gate(asyncio.Protocol):
    """A new connection, held unread for `connect_delay_ms`, then (with TLS) its handshake, then served.

    Reading is paused from the start, so the client's first bytes (its TLS ClientHello) wait
    in the socket for the delay: the client sees it inside its connect or handshake.
    """

    def __init__(self, provider: _ProviderServer) -> None:
        self.provider = provider

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # before the loop starts reading it
        task = asyncio.get_running_loop().create_task(self._open(transport))
        self.provider.tasks.add(task)
        task.add_done_callback(self.provider.tasks.discard)

    async def _open(self, transport: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_MAX_BODY_BYTES)
        protocol = asyncio.StreamReaderProtocol(reader, self.provider.handle)
        try:
            delay_ms = self.provider.connect_delay_ms()
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)
            if transport.is_closing():
                return
            if self.provider.tls is not None:
                tls = await loop.start_tls(transport, protocol, self.provider.tls, server_side=True)
                if tls is None:
                    raise ConnectionError("the TLS handshake did not finish")
                protocol.connection_made(tls)
            else:
                transport.set_protocol(protocol)
                protocol.connection_made(transport)
                transport.resume_reading()
        except (OSError, ConnectionError, asyncio.CancelledError):  # the client left, or its handshake failed
            self.provider.stats["disconnected"] += 1
            transport.abort()


async def _sleep_until(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    delay = deadline - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


async def serve(config: ProviderConfig, port: int = 0, *, ready: Any = None, stop: asyncio.Event | None = None,
                server_out: list[_ProviderServer] | None = None) -> None:
    """Serve until `stop` is set (forever without one); `ready(port)` is called once listening."""
    provider = _ProviderServer(config)
    if server_out is not None:
        server_out.append(provider)
    if provider.tls is not None or config.connect_delay_ms or config.connect_spike_probability:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Gate(provider), HOST, port)
    else:
        server = await asyncio.start_server(provider.handle, HOST, port, limit=_MAX_BODY_BYTES)
    try:
        if ready is not None:
            ready(server.sockets[0].getsockname()[1])
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        server.close()
        for task in list(provider.tasks):
            task.cancel()
        await asyncio.gather(*provider.tasks, return_exceptions=True)
        await server.wait_closed()


class Provider:
    """The demo provider in a background thread of this process (default) or in a subprocess.

    `Provider(ttft_ms=300).start()`; `url` is the base URL for `openai.OpenAI(base_url=...)`;
    `stop()` closes every connection. Also a context manager.
    """

    def __init__(self, config: ProviderConfig | None = None, *, port: int = 0, subprocess: bool = False, **settings: Any) -> None:
        self.config = dataclasses.replace(config or ProviderConfig(), **settings)
        self.port = port
        self.in_subprocess = subprocess
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._server: list[_ProviderServer] = []
        self._process: Any = None

    @property
    def url(self) -> str:
        return f"{'https' if self.config.tls_cert_file else 'http'}://{HOST}:{self.port}/v1"

    @property
    def metrics_url(self) -> str:
        """The engine mode's Prometheus endpoint (what `--engine-metrics` scrapes)."""
        return f"{'https' if self.config.tls_cert_file else 'http'}://{HOST}:{self.port}/metrics"

    def stats(self) -> dict[str, int]:
        """Attempts, 429s, answers, streamed answers and broken connections served so far."""
        if self._server:
            return dict(self._server[0].stats)
        import urllib.request

        context = ssl._create_unverified_context() if self.config.tls_cert_file else None  # our own loopback server
        with urllib.request.urlopen(f"{self.url[: -len('/v1')]}/latprof/stats", timeout=10, context=context) as response:  # subprocess mode
            result: dict[str, int] = json.load(response)
            return result

    def start(self) -> Provider:
        if self._thread is not None or self._process is not None:
            return self
        if self.in_subprocess:
            self._start_process()
        else:
            self._start_thread()
        return self

    def _start_thread(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []

        def on_ready(port: int) -> None:
            self.port = port
            ready.set()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve(self.config, self.port, ready=on_ready, stop=self._stop, server_out=self._server)

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # reported by start()
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=run, name="latprof-demo-provider", daemon=True)
        self._thread.start()
        if not ready.wait(30) or failure:
            self._thread = None
            raise RuntimeError(f"the demo provider did not start: {failure[0] if failure else 'timed out'}")

    def _start_process(self) -> None:
        args = [sys.executable, "-m", "latprof.demo.provider", "--port", str(self.port)]
        default = ProviderConfig()
        for f in fields(self.config):
            value = getattr(self.config, f.name)
            if value != getattr(default, f.name):
                flag = "--" + f.name.replace("_", "-")
                args += [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
        self._process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        line = self._process.stdout.readline()
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"the demo provider did not start: {line.strip() or 'no output'}")
        self.port = int(line.rsplit(":", 1)[1].split("/")[0])

    def stop(self) -> None:
        if self._process is not None:
            process, self._process = self._process, None
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self._thread is not None:
            thread, self._thread = self._thread, None
            if self._loop is not None and self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
            thread.join(30)

    def __enter__(self) -> Provider:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


#: `--help` of each ProviderConfig field (its `#:` comment, shortened).
_HELP = {
    "ttft_ms": "TTFT of a tiny prompt: network, provider queueing, fixed prefill",
    "ttft_ms_per_1k_input_tokens": "TTFT added per 1000 input tokens (prefill; tokens = characters / 4)",
    "spike_probability": "chance that a call waits --spike-ms more for its first token (provider-side queueing)",
    "spike_ms": "the extra TTFT of a spike",
    "tpot_ms": "time per output token after the first",
    "tpot_ms_per_stream_in_flight": "time per output token added per other stream decoding at the time (a crowded batch)",
    "output_tokens": "output tokens of an answer (capped by the request's max_tokens / max_output_tokens)",
    "long_output_probability": "chance that an answer has --long-output-tokens instead of --output-tokens",
    "long_output_tokens": "output tokens of a long answer (same cap)",
    "fail_first": "answer 429 to the first N attempts of each request",
    "retry_after_ms": "the retry-after-ms header of a 429",
    "max_concurrency": "at most this many calls in prefill or decode at once, the others queue (0: unlimited)",
    "role_chunk_first": "send the role-only chunk right after the headers",
    "tool_calls": "answer with a tool call: auto, always or never",
    "reset_after_events": "reset the connection in place of the Nth event of a streamed answer (0: never)",
    "close_connection": "close the connection after each answer (no keep-alive)",
    "connect_delay_ms": "wait this long on each new connection before serving it (inside the TLS handshake with TLS)",
    "connect_spike_probability": "chance that a new connection waits --connect-spike-ms more (a lost handshake packet)",
    "connect_spike_ms": "the extra wait of such a connection",
    "tls_cert_file": "serve HTTPS with this PEM certificate chain (with --tls-key-file)",
    "tls_key_file": "the PEM private key of --tls-cert-file",
    "model": "the model answered with when the request names none",
    "seed": "seed of the text, the spikes and the long answers",
    "engine_max_running": "engine mode: a vLLM-like continuous-batching scheduler running at most this many requests "
                          "(max_num_seqs), the others queued, vLLM's metrics at GET /metrics (0: off)",
    "engine_kv_tokens": "the engine's KV cache in tokens; outgrowing it preempts the newest request (0: unlimited)",
    "engine_step_ms": "the engine's time per step (one token per running request)",
    "engine_step_ms_per_running": "the engine's step time added per running request",
    "engine_prefill_ms_per_1k_tokens": "the engine's step time added per 1000 tokens prefilled in the step",
    "engine_model": "the model_name label of the engine's metrics (default: the first request's model)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m latprof.demo.provider", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8911, help="port on 127.0.0.1 (0: any free port); default 8911")
    for f in fields(ProviderConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{_HELP.get(f.name, f.name.replace('_', ' '))}; default %(default)s"
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=_HELP.get(f.name))
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default, metavar=f.name.upper(), help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    port = args.pop("port")
    try:
        config = ProviderConfig(**args)
    except ValueError as exc:
        print(f"latprof demo provider: error: {exc}", file=sys.stderr)
        return 2

    def ready(bound: int) -> None:
        print(f"latprof demo provider listening on {'https' if config.tls_cert_file else 'http'}://{HOST}:{bound}/v1", flush=True)

    try:
        asyncio.run(serve(config, port, ready=ready))
    except KeyboardInterrupt:
        pass
    except (OSError, ValueError) as exc:  # a port in use, a certificate that does not load
        print(f"latprof demo provider: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
