"""A FastAPI service whose sync endpoint holds one global `threading.Lock` while it works: every request waits in line.

Served by uvicorn under `latprof run` in tests/rules/test_lock_contention.py. The lock is made
at import, after the hooks installed, so the locks hook times waits for it.
"""

from __future__ import annotations

import threading
import time

from fastapi import FastAPI

app = FastAPI()
_lock = threading.Lock()


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/locked")
def locked(ms: float = 30):  # type: ignore[no-untyped-def]  # no return type: FastAPI would validate it in a 2nd thread hop
    with _lock:  # the bug under test: one lock for the whole service, held across the work
        time.sleep(ms / 1000)
    return {"held_ms": ms}
