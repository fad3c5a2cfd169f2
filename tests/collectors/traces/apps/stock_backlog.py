"""A sync service whose requests wait in the accept backlog, and a reverse proxy for it, traced with stock OpenTelemetry only.

Run by tests/collectors/traces/test_stock_ingress_e2e.py, each in its own process, both exporting
OTLP/HTTP to `$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`:

- `backend()`: a Flask app for gunicorn (`'...stock_backlog:backend()'`, sync workers; service
  `stock-backlog`, FlaskInstrumentor). `GET /work?ms=N` answers after N ms of work; `GET /health` is
  not traced. With one worker, requests beyond the one it serves wait in gunicorn's accept backlog,
  before any span. With `OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST=x-request-start` in
  its environment the stock instrumentation records the proxy's stamp on each server span
  (`http.request.header.x_request_start`); nothing else is captured. The SDK flushes the spans when
  the worker exits.
- `proxy()`: a reverse proxy for uvicorn's `--factory` (service `stock-proxy`, FastAPIInstrumentor
  for its server spans and an untraced `GET /health`, both from `_stock_common.stock_app`;
  HTTPXClientInstrumentor for its call): every other GET is forwarded unchanged (path and query) to
  `$BACKEND_URL` with an httpx AsyncClient, the answer passed back. Its spans carry no proxy
  attribute: only their shape (one request forwarded, same method and path) says what it is. It
  flushes its spans on shutdown and then writes this module's `FLUSHED_MARK` to stderr.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint's annotations, and `Request` is
# imported inside `proxy()` (each process imports only its own side), where a string could not be resolved.
import os
import sys
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

FLUSHED_MARK = "stock_backlog: spans flushed:"


def _tracer_provider(service: str) -> Any:
    """The process's TracerProvider, exporting in batches to the receiver, set as the global one."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    return provider


def backend() -> Any:
    """The sync Flask service (one per gunicorn worker: built after the fork, so its exporter thread lives)."""
    from flask import Flask, jsonify, request
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    provider = _tracer_provider("stock-backlog")
    app = Flask(__name__)
    FlaskInstrumentor().instrument_app(app, excluded_urls="health", tracer_provider=provider)

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.get("/work")
    def work() -> Any:
        time.sleep(float(request.args.get("ms", "0")) / 1000)  # the handler's own work: a sync worker is busy meanwhile
        return jsonify(ok=True)

    return app


def proxy() -> Any:
    """The reverse proxy: FastAPI + httpx.AsyncClient, stock instrumentations."""
    import httpx
    from fastapi import FastAPI, Request, Response
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    from tests.collectors.traces.apps._stock_common import stock_app

    provider = _tracer_provider("stock-proxy")
    HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    state: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["client"] = httpx.AsyncClient(base_url=os.environ["BACKEND_URL"], timeout=30)
        try:
            yield
        finally:
            await state["client"].aclose()
            flushed = provider.force_flush(10_000)
            provider.shutdown()
            print(f"{FLUSHED_MARK} {flushed}", file=sys.stderr, flush=True)

    app = stock_app(lifespan)  # FastAPIInstrumentor (the global provider: this one), untraced GET /health

    @app.get("/{path:path}")
    async def forward(path: str, request: Request) -> Response:
        upstream = await state["client"].get(f"/{path}", params=request.query_params)
        return Response(upstream.content, status_code=upstream.status_code, media_type=upstream.headers.get("content-type"))

    return app
