"""A FastAPI service that retries by hand: the openai client with max_retries=0, a 600 ms backoff after a 429."""

from __future__ import annotations

import asyncio
import os

import openai
from fastapi import FastAPI

app = FastAPI()
client = openai.AsyncOpenAI(base_url=os.environ.get("RETRY_APP_PROVIDER", "http://127.0.0.1:9/v1"), api_key="unused", max_retries=0)
BACKOFF_S = 0.6


@app.get("/health")
async def health() -> str:
    return "ok"


@app.get("/answer")
async def answer(key: str, fail: int = 0) -> dict[str, object]:
    for attempt in range(3):
        try:
            response = await client.chat.completions.create(
                model="demo",
                messages=[{"role": "user", "content": "hello"}],
                # The provider counts attempts per key (and per x-stainless-retry-count, which the
                # client sends as 0 on every call it does not retry itself: not a number here).
                extra_headers={"Idempotency-Key": key, "x-stainless-retry-count": "manual"},
                extra_body={"latprof": {"fail_first": fail}},
            )
            return {"attempts": attempt + 1, "text": response.choices[0].message.content}
        except openai.RateLimitError:
            if attempt == 2:
                raise
            await asyncio.sleep(BACKOFF_S)
    raise AssertionError("unreachable")
