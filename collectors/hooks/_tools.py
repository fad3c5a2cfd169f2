"""Which outbound calls of a request depend on an earlier one: a value from its response in their request.

Not a hook itself: the HTTP client hooks and the agent tools hook call it. The sequential-tool-calls rule must not call
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

from latprof.collectors.hooks import runtime

#: Only this much of a response or request body is scanned.
MAX_SCAN_BYTES = 16 * 1024
#: Values kept per call, and calls kept per request (the latest).
MAX_TOKENS = 256
MAX_CALLS = 16

_KEY = "tools"
_PENDING = "tools.pending"
_TOKEN = re.compile(rb"[A-Za-z0-9_.:\-]{4,64}")
_DIGIT = re.compile(rb"\d")
_find_digit = re.compile(rb"[0-9]").search  # every value `tokens` finds has one


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


def keep(state: runtime.RequestState, segment_id: str, body: bytes) -> None:
    """`answered`, made only when needed: most answers are never asked about (no later call of
    the request sends anything id-like). So the first MAX_SCAN_BYTES of an answer with a digit
    are kept in the request's scratch space as they are (at most MAX_CALLS of them: the oldest
    is tokenised when one more comes) and tokenised, in order, only when a later call sends
    something that could be a value. What `depends_on` finds is what it would have found."""
    if _find_digit(body, 0, MAX_SCAN_BYTES) is None:  # no value to keep
        return
    scratch = state.scratch
    if scratch is None:
        scratch = state.scratch = {}
    pending: list[tuple[str, bytes]] | None = scratch.get(_PENDING)
    if pending is None:
        pending = scratch[_PENDING] = []
    pending.append((segment_id, body[:MAX_SCAN_BYTES]))
    if len(pending) > MAX_CALLS:
        answered(state, *pending.pop(0))


def depends_on(state: runtime.RequestState | None, target: Any, body: Any = None) -> str | None:
    """The id of the latest earlier call of the request whose answer carried a value this request sends.

    `target` is the request's path and query (not its host: `127.0.0.1:8080` is no answer's
    value), or a tool call's arguments; `body` what it sends besides (bytes).
    """
    if state is None or state.scratch is None:
        return None
    scratch = state.scratch
    pending = scratch.get(_PENDING)
    if not pending and not scratch.get(_KEY):
        return None
    sent = target if isinstance(target, bytes) else str(target).encode("utf-8", "replace")
    if isinstance(body, (bytes, bytearray)) and body:
        sent += b" " + bytes(body[:MAX_SCAN_BYTES])
    if _find_digit(sent) is None:  # nothing it sends can be a value
        return None
    if pending:
        for segment_id, answer in pending:
            answered(state, segment_id, answer)
        pending.clear()
    calls: list[tuple[str, frozenset[bytes]]] | None = scratch.get(_KEY)
    if not calls:
        return None
    values = tokens(sent)
    if not values:
        return None
    for segment_id, answered_values in reversed(calls):
        if not values.isdisjoint(answered_values):
            return segment_id
    return None
