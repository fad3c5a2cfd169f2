"""What timing an LLM call's network (`collectors/hooks/_net.py`) adds to a call, next to the hooks without it.

    python benchmarks/bench_net_timings.py [--calls 300] [--trials 7]

The official openai client (sync, non-streamed, and async streamed) calls the demo provider in
this process, over plain HTTP with keep-alive and over TLS with a new connection per call
(`close_connection`), each call inside a request, with the openai and httpx hooks installed and
recording into a real `CaptureWriter`. Two arms alternate trial by trial (this machine is
noisy): the hooks as shipped, and the same with the network timing switched off (the tracer
never given to the request). The cost is this process's CPU time per call (`time.process_time`:
the provider's thread included, the same in both arms); "added" is the difference of the
medians over trials, with the spread of each arm.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import openai  # noqa: E402
from recording import recording  # noqa: E402

from latprof.collectors.hooks import _net, runtime  # noqa: E402
from latprof.collectors.hooks import httpx as httpx_hook  # noqa: E402
from latprof.collectors.hooks import openai as openai_hook  # noqa: E402
from latprof.demo.provider import LocalCertificate, Provider  # noqa: E402

MESSAGES = [{"role": "user", "content": "Which layer owns the p99?"}]
_shipped = _net.trace_httpcore


def _off(request: Any, call: Any, asynchronous: bool) -> None:
    return None


def _sync_calls(client: openai.OpenAI, calls: int, headers: dict[str, str]) -> None:
    for _ in range(calls):
        token = runtime.begin_request("POST /chat", runtime.now_ns())
        try:
            client.chat.completions.create(model="demo", messages=MESSAGES, extra_headers=headers)  # type: ignore[arg-type]
        finally:
            runtime.end_request(token)


def _async_calls(base_url: str, calls: int, headers: dict[str, str]) -> None:
    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)  # connections are per loop
        for _ in range(calls):
            token = runtime.begin_request("POST /chat", runtime.now_ns())
            try:
                stream = await client.chat.completions.create(model="demo", messages=MESSAGES, stream=True,  # type: ignore[arg-type]
                                                              extra_headers=headers)  # fmt: skip
                async for _ in stream:
                    pass
            finally:
                runtime.end_request(token)
        await client.close()

    asyncio.run(main())


def _trial(run: Callable[[], None], calls: int, timed: bool) -> float:
    _net.trace_httpcore = _shipped if timed else _off  # type: ignore[assignment]
    try:
        with recording():
            start = time.process_time()
            run()
            return (time.process_time() - start) / calls * 1e6
    finally:
        _net.trace_httpcore = _shipped  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()
    openai_hook.install()
    httpx_hook.install()
    certificate = LocalCertificate.make(Path(tempfile.mkdtemp(prefix="latprof-bench-net-")))
    context = certificate.client_context()
    settings = {"ttft_ms": 0.0, "tpot_ms": 0.0, "output_tokens": 4}
    with Provider(**settings) as plain, Provider(**settings, **certificate.settings()) as tls:
        cases: list[tuple[str, Callable[[], None]]] = []
        sync_plain = openai.OpenAI(base_url=plain.url, api_key="unused", max_retries=0)
        sync_tls = openai.OpenAI(base_url=tls.url, api_key="unused", max_retries=0, http_client=openai.DefaultHttpxClient(verify=context))
        close = {"x-latprof-close-connection": "true"}
        cases.append(("sync, keep-alive", lambda: _sync_calls(sync_plain, args.calls, {})))
        cases.append(("sync, TLS, new connection per call", lambda: _sync_calls(sync_tls, args.calls, close)))
        cases.append(("async streamed, keep-alive", lambda: _async_calls(plain.url, args.calls, {})))
        print(f"{args.calls} calls x {args.trials} trials per arm; CPU us per call (median [min-max])")
        print(f"{'case':38} {'without timing':>22} {'with timing':>22} {'added':>8}")
        for name, run in cases:
            run()  # warm up: imports, connections, caches
            without: list[float] = []
            with_timing: list[float] = []
            for trial in range(args.trials):
                order = (False, True) if trial % 2 == 0 else (True, False)
                for timed in order:
                    (with_timing if timed else without).append(_trial(run, args.calls, timed))
            a, b = statistics.median(without), statistics.median(with_timing)
            print(f"{name:38} {a:8.1f} [{min(without):.0f}-{max(without):.0f}] {b:10.1f} [{min(with_timing):.0f}-{max(with_timing):.0f}]"
                  f" {b - a:+8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
