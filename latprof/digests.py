"""Conversation ids as short keyed digests: what latprof stores in their place, never the id itself.

A conversation id (`gen_ai.conversation.id` on a span, the Responses API's `conversation`
argument) can name a user's conversation, and application ids are often guessable (a user id, a
counter): a plain hash of one is reversed by hashing every candidate. So the digest is keyed:
BLAKE2b with a 16-byte secret key, cut to 8 bytes (16 hex digits), which only groups a
conversation's turns together. The key is never written anywhere latprof writes: `latprof run`
draws one per session and hands it to every process of the service in `LATPROF_DIGEST_KEY`
(so the turns of one conversation served by different workers still group); a process without
one (an `attach --inject` target, `latprof analyze` of trace files) draws its own at random,
so the digests of two captures never link the same conversation.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from typing import Any

#: Environment variable with the session's key (hex), set by `latprof run` for the service's processes.
ENV_DIGEST_KEY = "LATPROF_DIGEST_KEY"
#: Bytes of the digest (16 hex digits): collisions among a capture's conversations are negligible.
DIGEST_BYTES = 8


def _key() -> bytes:
    value = os.environ.get(ENV_DIGEST_KEY, "")
    try:
        key = bytes.fromhex(value)
    except ValueError:
        key = b""
    return key[:64] if len(key) >= 16 else secrets.token_bytes(16)


_KEY = _key()


def new_key() -> str:
    """A fresh session key, as `ENV_DIGEST_KEY` takes it."""
    return secrets.token_hex(16)


def conversation_digest(value: Any) -> str | None:
    """The keyed digest of a conversation id: a non-empty string or int, or an object or dict
    with a string `id` (the Responses API's `{"id": ...}` form); None for anything else."""
    if isinstance(value, dict):
        value = value.get("id")
    elif value is not None and not isinstance(value, (str, int)):
        value = getattr(value, "id", None)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        return None
    data = str(value).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES, key=_KEY).hexdigest()
