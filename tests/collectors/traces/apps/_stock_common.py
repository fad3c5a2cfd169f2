"""What the services traced with stock OpenTelemetry share: the tracer provider, and its flush on shutdown.

    provider = stock_tracing("stock-blocking")   # OTLP/HTTP export as OTEL_EXPORTER_OTLP_* says, httpx instrumented
    ...
    finally:
        flush_spans(provider)                     # in the lifespan's shutdown: what otlp_harness waits for

Not a service itself: `otlp_harness.record_otlp` runs the `apps/stock_*.py` that import it.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

FLUSHED_MARK = "traced_app: spans flushed:"  # what otlp_harness waits for


def stock_tracing(default_service: str) -> TracerProvider:
    """The global tracer provider, exporting OTLP/HTTP in batches (service `OTEL_SERVICE_NAME`, else
    `default_service`), with httpx's stock instrumentation on: the setup every stock service starts with."""
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", default_service)}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    HTTPXClientInstrumentor().instrument()
    return provider


def flush_spans(provider: TracerProvider) -> None:
    """Flush and shut down `provider`, then say so on stderr (SIGTERM -> uvicorn's lifespan shutdown: no span is lost)."""
    flushed = provider.force_flush(10_000)
    provider.shutdown()
    print(f"{FLUSHED_MARK} {flushed}", file=sys.stderr, flush=True)


def chat_body(prompt: str) -> dict[str, Any]:
    """A chat completion request for latprof's demo provider."""
    return {"model": "latprof-demo-1", "messages": [{"role": "user", "content": prompt}]}


def stock_app(lifespan: Callable[[FastAPI], Any]) -> FastAPI:
    """The FastAPI app with `lifespan`, traced by the stock FastAPI instrumentation, with the
    untraced `GET /health` otlp_harness polls until the service is up."""
    app = FastAPI(lifespan=lifespan)
    FastAPIInstrumentor.instrument_app(app, excluded_urls="health")

    @app.get("/health")
    async def health() -> str:
        return "ok"

    return app
