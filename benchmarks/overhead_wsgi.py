"""`overhead_app.py` as a Flask (WSGI) service, for `bench_overhead.py --server gunicorn`.

The same cheapest endpoint: it validates its input and returns a small JSON document built in
Python; SQLAlchemy (with a pool) and the openai client are imported so every hook installs.
"""

from __future__ import annotations

import openai
from flask import Flask, Response
from pydantic import BaseModel
from sqlalchemy import create_engine

engine = create_engine("sqlite:///overhead.db", pool_size=5, max_overflow=0)  # never used: installs the pool hook
llm = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")  # never called

app = Flask(__name__)


class Profile(BaseModel):
    user_id: int
    plan: str
    models: list[str]
    limits: dict[str, int]


@app.get("/profile/<int:user_id>")
def profile(user_id: int) -> Response:
    plan = "pro" if user_id % 3 else "free"
    body = Profile(
        user_id=user_id,
        plan=plan,
        models=["small", "large"] if plan == "pro" else ["small"],
        limits={"rpm": 600 if plan == "pro" else 60, "tpm": 200_000 if plan == "pro" else 20_000},
    )
    return Response(body.model_dump_json(), mimetype="application/json")
