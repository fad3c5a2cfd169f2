"""The service `bench_overhead.py` saturates: a FastAPI AI service's cheapest endpoint.

It imports what the hooks patch (SQLAlchemy with a pool, the openai client), so every hook
is installed, but its `/profile/{user_id}` endpoint does no I/O: it validates its input and
returns a small JSON document built in Python - what every request pays before any LLM call.
"""

from __future__ import annotations

import openai
from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy import create_engine

engine = create_engine("sqlite:///overhead.db", pool_size=5, max_overflow=0)  # never used: installs the pool hook
llm = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")  # never called

app = FastAPI()


class Profile(BaseModel):
    user_id: int
    plan: str
    models: list[str]
    limits: dict[str, int]


@app.get("/profile/{user_id}", response_model=Profile)
async def profile(user_id: int, verbose: bool = False) -> Profile:
    plan = "pro" if user_id % 3 else "free"
    return Profile(
        user_id=user_id,
        plan=plan,
        models=["small", "large"] if plan == "pro" else ["small"],
        limits={"rpm": 600 if plan == "pro" else 60, "tpm": 200_000 if plan == "pro" else 20_000},
    )
