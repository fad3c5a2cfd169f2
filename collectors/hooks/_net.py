"""Where an LLM call's HTTP attempt spent its time before the answer: DNS, connect, TLS, upload, the server's first byte.

Not a hook itself. The httpx hook (for the openai SDK, and raw LLM calls) and the
aiohttp_client hook hand each HTTP attempt of an LLM call (`_llm.timed_call`) to this module,
which listens to the client's own connection events and writes the attempt's timings into the
call's `net` (`LlmCall.net`), recorded on its `provider` segment:

- **httpcore** (httpx, and the openai client through it; httpcore2 alike): the `trace` request
  extension, called with `connection.connect_tcp.*` (DNS and TCP connect: httpcore resolves
  inside its connect), `connection.start_tls.*`, then `http11.*` / `http2.*`
  `send_request_headers`, `send_request_body` and `receive_response_headers`, each
  `.started` and `.complete` (`.failed` on an error). A sync pool calls a function, an async
  one awaits a coroutine function. The request's own trace extension, if the service set
  one, is called after ours with the same arguments; the request is given a copy of its
  extensions with ours in, never the caller's dict changed.
- **aiohttp**: a `TraceConfig` whose signals (`on_dns_resolvehost_*`, `on_connection_create_*`
  (TCP and TLS together), `on_request_headers_sent`, `on_request_chunk_sent`,
  `on_request_end`) time the same stretches; see `collectors/hooks/aiohttp_client.py`.

What is measured, per attempt (a retried call keeps its last): `NET_DNS_MS`, `NET_CONNECT_MS`,
`NET_TLS_MS` (only when the attempt opened a connection), `NET_UPLOAD_MS` (request headers
and body sent), `NET_SERVER_MS` (request sent to response headers read: the server's time to
first byte plus one network round trip), `NET_NEW_CONNECTION`. A stretch whose end was not
seen (an error) is left out. Each callback costs one clock read and a dict store.
"""

from __future__ import annotations

import time
from typing import Any

from latprof.semconv import NET_CONNECT_MS, NET_DNS_MS, NET_NEW_CONNECTION, NET_SERVER_MS, NET_TLS_MS, NET_UPLOAD_MS

_clock = time.perf_counter_ns

#: httpcore event -> the mark it sets.
_MARKS = {
    "connection.connect_tcp.started": "connect0",
    "connection.connect_tcp.complete": "connect1",
    "connection.start_tls.started": "tls0",
    "connection.start_tls.complete": "tls1",
    **{f"{http}.{event}": mark for http in ("http11", "http2") for event, mark in (
        ("send_request_headers.started", "upload0"),
        ("send_request_body.complete", "upload1"),
        ("receive_response_headers.complete", "headers"),
    )},
}  # fmt: skip


def timings(marks: dict[str, int]) -> dict[str, Any]:
    """The attributes of one attempt from its marks (perf_counter ns): each stretch whose two ends
    were seen. A resolution timed on its own (aiohttp's) happened inside the connect: taken out of it."""
    out: dict[str, Any] = {}
    for key, start, end in ((NET_DNS_MS, "dns0", "dns1"), (NET_CONNECT_MS, "connect0", "connect1"), (NET_TLS_MS, "tls0", "tls1"),
                            (NET_UPLOAD_MS, "upload0", "upload1"), (NET_SERVER_MS, "upload1", "headers")):  # fmt: skip
        if start in marks and end in marks and marks[end] >= marks[start]:
            out[key] = round((marks[end] - marks[start]) / 1e6, 3)
    if NET_DNS_MS in out and NET_CONNECT_MS in out:
        out[NET_CONNECT_MS] = round(max(0.0, out[NET_CONNECT_MS] - out[NET_DNS_MS]), 3)
    out[NET_NEW_CONNECTION] = "connect0" in marks
    return out


class HttpcoreTrace:
    """The `trace` extension of one httpcore request (sync pools): marks its events, then calls the service's own."""

    __slots__ = ("call", "marks", "inner")

    def __init__(self, call: Any, inner: Any) -> None:
        self.call = call
        self.marks: dict[str, int] = {}
        self.inner = inner

    def __call__(self, name: str, info: Any) -> Any:
        self.mark(name)
        if self.inner is not None:
            return self.inner(name, info)
        return None

    def mark(self, name: str) -> None:
        try:
            mark = _MARKS.get(name)
            if mark is None:
                return
            self.marks[mark] = _clock()
            if mark == "headers":  # the attempt reached its answer: what the call keeps
                self.call.net = timings(self.marks)
        except Exception:  # never into the client; a missing mark leaves its stretch out
            pass


class AsyncHttpcoreTrace(HttpcoreTrace):
    """The same for async pools, which await the extension."""

    __slots__ = ()

    async def __call__(self, name: str, info: Any) -> Any:
        self.mark(name)
        if self.inner is not None:
            await self.inner(name, info)


def trace_httpcore(request: Any, call: Any, asynchronous: bool) -> None:
    """Give httpcore `request` (about to be sent for `call`) a trace extension that times its attempt."""
    extensions = request.extensions
    inner = extensions.get("trace")
    if isinstance(inner, HttpcoreTrace):  # already ours (a request handed on by a proxying pool)
        return
    tracer = AsyncHttpcoreTrace(call, inner) if asynchronous else HttpcoreTrace(call, inner)
    request.extensions = {**extensions, "trace": tracer}


# --- aiohttp -------------------------------------------------------------------------------------

_CONFIG_ATTR = "_latprof_net"  # on a ClientSession: True once our TraceConfig is in its list
_aiohttp_config: Any = None  # the one frozen TraceConfig every timed session shares


def trace_aiohttp(session: Any) -> None:
    """Give `session` (about to send an LLM call) the TraceConfig that times its calls' connections.

    Added once per session, at its first timed call, as a new list (a call iterating the old one
    is not disturbed); its handlers return at once for a call that is not timed.
    """
    global _aiohttp_config
    if session.__dict__.get(_CONFIG_ATTR):
        return
    if _aiohttp_config is None:
        _aiohttp_config = _make_aiohttp_config()
    session._trace_configs = [*session._trace_configs, _aiohttp_config]
    session.__dict__[_CONFIG_ATTR] = True


def _make_aiohttp_config() -> Any:
    import aiohttp

    from latprof.collectors.hooks._llm import timed_call

    def marker(name: str) -> Any:
        async def mark(session: Any, ctx: Any, params: Any) -> None:
            call = timed_call.get()
            if call is None:
                return
            try:
                marks = ctx.__dict__.setdefault("latprof_marks", {})
                marks[name] = _clock()
                if name == "headers":  # on_request_end: the response's headers were read
                    call.net = timings(marks)
            except Exception:  # never into the client
                pass

        return mark

    config = aiohttp.TraceConfig()
    config.on_dns_resolvehost_start.append(marker("dns0"))
    config.on_dns_resolvehost_end.append(marker("dns1"))
    # TCP and TLS together: aiohttp has no signal between them (NET_CONNECT_MS, no NET_TLS_MS).
    config.on_connection_create_start.append(marker("connect0"))
    config.on_connection_create_end.append(marker("connect1"))
    config.on_connection_create_end.append(marker("upload0"))
    config.on_connection_reuseconn.append(marker("upload0"))
    config.on_request_headers_sent.append(marker("upload1"))
    config.on_request_chunk_sent.append(marker("upload1"))
    config.on_request_end.append(marker("headers"))
    config.freeze()
    return config
