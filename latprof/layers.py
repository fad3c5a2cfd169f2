"""The closed layer vocabulary of report-v1 and the precedence rule between nested layers."""

from __future__ import annotations

from typing import Final

QUEUE: Final = "queue"
EVENT_LOOP: Final = "event_loop"
DB_POOL: Final = "db.pool"
DB_QUERY: Final = "db.query"
HTTP_POOL: Final = "http.pool"
PROVIDER: Final = "provider"
MODEL: Final = "model"
TOOL: Final = "tool"
RETRY: Final = "retry"
LOCK: Final = "lock"
APP: Final = "app"
UNATTRIBUTED: Final = "unattributed"

#: Every layer, in the order reports list them. The vocabulary is closed (docs/report-v1.md).
LAYERS: Final[tuple[str, ...]] = (
    QUEUE,
    EVENT_LOOP,
    DB_POOL,
    DB_QUERY,
    HTTP_POOL,
    PROVIDER,
    MODEL,
    TOOL,
    RETRY,
    LOCK,
    APP,
    UNATTRIBUTED,
)

#: Layers a collector may put on a segment. `app` and `unattributed` are derived from the
#: time no segment covers (measured CPU time backs `app`), but an explicit `app` segment
#: (local work a hook timed) is allowed too.
SEGMENT_LAYERS: Final[frozenset[str]] = frozenset(LAYERS) - {UNATTRIBUTED}

#: What each layer means, in the words of report-v1 (docs/report-v1.md); used by renderers and docs.
DESCRIPTIONS: Final[dict[str, str]] = {
    QUEUE: "waiting before any worker/handler started on it",
    EVENT_LOOP: "ready to run but delayed by a blocked asyncio event loop",
    DB_POOL: "waiting to check a connection out of a database or cache pool",
    DB_QUERY: "executing database or cache statements",
    HTTP_POOL: "waiting for a free connection in an outbound HTTP client pool",
    PROVIDER: "from sending an LLM request until its first token (TTFT)",
    MODEL: "generating after the first token (decode)",
    TOOL: "executing agent tools / calls to non-LLM services",
    RETRY: "sleeping in backoff between failed attempts",
    LOCK: "blocked on a lock, semaphore or the GIL",
    APP: "running the service's own code on the CPU",
    UNATTRIBUTED: "not explained by any signal that was collected",
}

# Generic waits absorbed by a more specific enclosing layer (the spec's precedence rule):
# a condition variable inside a pool checkout is that checkout; an LLM SDK call's own HTTP
# request is the SDK's provider/model time, not a tool call. `retry` is never absorbed: a
# backoff sleep inside an SDK call is still `retry`.
_ABSORBED_BY: Final[dict[str, frozenset[str]]] = {
    LOCK: frozenset({QUEUE, EVENT_LOOP, DB_POOL, DB_QUERY, HTTP_POOL, PROVIDER, MODEL, TOOL, RETRY}),
    TOOL: frozenset({PROVIDER, MODEL}),
    APP: frozenset({DB_QUERY, PROVIDER, MODEL, TOOL}),
}


def effective_layer(inner: str, enclosing: str | None) -> str:
    """Return the layer that owns time spent in a segment of layer `inner` nested in `enclosing`.

    The innermost segment owns its time unless it is a generic wait that the enclosing,
    more specific layer absorbs.
    """
    if enclosing is not None and enclosing in _ABSORBED_BY.get(inner, ()):
        return enclosing
    return inner
