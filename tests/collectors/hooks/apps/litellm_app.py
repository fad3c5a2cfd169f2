"""A service calling the demo provider through LiteLLM, run under `latprof run` by the litellm hook tests.

`python litellm_app.py PROVIDER_URL CANARY CONNECTS_FILE`: four requests (`completion`
streamed and not, `acompletion` streamed and not), each a prompt holding CANARY; then it
writes every address the process connected to or looked up (a `socket.connect` /
`socket.getaddrinfo` audit hook, set before LiteLLM is imported) to CONNECTS_FILE, one per line.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

CONNECTS: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect":
        address = args[1]
        CONNECTS.append(str(address[0] if isinstance(address, tuple) else address))
    elif event == "socket.getaddrinfo":
        CONNECTS.append(str(args[0]))


sys.addaudithook(_audit)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no model cost map fetched from the internet

import litellm  # noqa: E402
from litellm import completion  # noqa: E402  # bound after `latprof run` installed the hooks

from latprof.collectors.hooks import runtime  # noqa: E402

URL, CANARY, CONNECTS_FILE = sys.argv[1:4]
MODEL = "openai/latprof-demo-1"
MESSAGES = [{"role": "user", "content": f"{CANARY}: which layer owns the p99?"}]


def in_request(route: str) -> Any:
    return runtime.begin_request(route, runtime.now_ns())


def sync_calls() -> None:
    token = in_request("POST /stream")
    text = "".join(c.choices[0].delta.content or "" for c in completion(model=MODEL, api_base=URL, api_key="unused",
                                                                      messages=MESSAGES, stream=True) if c.choices)  # fmt: skip
    runtime.end_request(token)
    assert text
    token = in_request("POST /whole")
    answer = completion(model=MODEL, api_base=URL, api_key="unused", messages=MESSAGES)
    runtime.end_request(token)
    assert answer.choices[0].message.content


async def async_calls() -> None:
    token = in_request("POST /astream")
    stream = await litellm.acompletion(model=MODEL, api_base=URL, api_key="unused", messages=MESSAGES, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    runtime.end_request(token)
    assert text
    token = in_request("POST /awhole")
    answer = await litellm.acompletion(model=MODEL, api_base=URL, api_key="unused", messages=MESSAGES)
    runtime.end_request(token)
    assert answer.choices[0].message.content


sync_calls()
asyncio.run(async_calls())
with open(CONNECTS_FILE, "w") as out:
    out.write("\n".join(CONNECTS))
