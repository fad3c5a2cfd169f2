"""Which outbound calls of a request depend on an earlier one: a value from its response in their request.

Not a hook itself: the HTTP client hooks call it. The sequential-tool-calls rule must not call
two calls "independent, could have run together" when the second sent an id the first one
answered (a customer id, then that customer's tickets). So, inside a request, the hooks keep
the id-like values of each call's response - tokens of 4 to 64 letters, digits and `_-.:`
with at least one digit, from the first `MAX_SCAN_BYTES` the caller read - and look for them
in each later call's URL (path and query) and body. A match is `latprof.tool.depends_on` =
the id of the latest call that answered it. Nothing of this leaves the process: the values
live in the request's scratch space until the request ends, bounded (`MAX_CALLS` calls of
`MAX_TOKENS` values each).
"""

from __future__ import annotations

import re
from typing import Any

from latprof.collectors import runtime

#: Only this much of a response or request body is scanned.
MAX_SCAN_BYTES = 16 * 1024
#: Values kept per call, and calls kept per request (the latest).
MAX_TOKENS = 256
MAX_CALLS = 16

_KEY = "tools"
_TOKEN = re.compile(rb"[A-Za-z0-9_.:\-]{4,64}")
_DIGIT = re.compile(rb"\d")


def tokens(data: bytes) -> frozenset[bytes]:
    """The id-like values in `data` (at most MAX_TOKENS, from its first MAX_SCAN_BYTES)."""
    found: set[bytes] = set()
    for token in _TOKEN.findall(data[:MAX_SCAN_BYTES]):
        if _DIGIT.search(token) is not None:
            found.add(token)
            if len(found) >= MAX_TOKENS:
                break
    return frozenset(found)


def answered(state: runtime.RequestState | None, segment_id: str, body: bytes) -> None:
    """The call `segment_id` of the request answered `body` (what the caller read of it)."""
    if state is None or not body:
        return
    values = tokens(body)
    if not values:
        return
    scratch = state.scratch
    if scratch is None:
        scratch = state.scratch = {}
    calls: list[tuple[str, frozenset[bytes]]] = scratch.setdefault(_KEY, [])
    calls.append((segment_id, values))
    if len(calls) > MAX_CALLS:
        del calls[0]


def depends_on(state: runtime.RequestState | None, target: Any, body: Any = None) -> str | None:
    """The id of the latest earlier call of the request whose answer carried a value this request sends.

    `target` is the request's path and query (not its host: `127.0.0.1:8080` is no answer's value).
    """
    if state is None or state.scratch is None:
        return None
    calls = state.scratch.get(_KEY)
    if not calls:
        return None
    sent = target if isinstance(target, bytes) else str(target).encode("utf-8", "replace")
    if isinstance(body, (bytes, bytearray)) and body:
        sent += b" " + bytes(body[:MAX_SCAN_BYTES])
    values = tokens(sent)
    if not values:
        return None
    for segment_id, answered_values in reversed(calls):
        if not values.isdisjoint(answered_values):
            return segment_id
    return None
