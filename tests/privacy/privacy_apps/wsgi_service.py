"""A Flask service under gunicorn for the privacy canaries of the wsgi hook.

`GET /users/<user_id>/orders/<order_id>` answers with a canary `Set-Cookie` and custom header;
`GET /boom/<item>` raises with a canary in the message. Canaries from `PRIVACY_CANARIES`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flask import Flask, Response

C: dict[str, dict[str, str]] = json.loads(Path(os.environ["PRIVACY_CANARIES"]).read_text())
app = Flask(__name__)


@app.get("/health")
def health() -> str:
    return "ok"


@app.get("/users/<user_id>/orders/<order_id>")
def order(user_id: str, order_id: str) -> Response:
    response = Response(json.dumps({"user": user_id, "order": order_id}), content_type="application/json")
    response.headers["Set-Cookie"] = f"session={C['wsgi']['set_cookie']}"
    response.headers["X-Service-Secret"] = C["wsgi"]["response_header"]
    return response


@app.get("/boom/<item>")
def boom(item: str) -> None:
    raise RuntimeError(f"order {item} failed for {C['wsgi']['exception']}")
