"""The demo service traced as a team that already uses OpenTelemetry traces it (`latprof demo --traces`).

`latprof demo --traces KIND` starts the service plainly (no latprof in it) with
`LATPROF_DEMO_TRACES=KIND`; the service then calls `setup` at import, before anything runs:

- `stock`: the stock SDK and instrumentations only, as the OTLP end-to-end tests' services:
  FastAPIInstrumentor (the server span), SQLAlchemyInstrumentor on both engines (statements and
  the pool's `connect`), HTTPXClientInstrumentor (httpx clients; openai 3.x sends on httpx2,
  which it does not see, so its LLM calls leave no span);
- a GenAI instrumentation of the openai client on top: `openllmetry`
  (`opentelemetry-instrumentation-openai`), `openinference`
  (`openinference-instrumentation-openai`) or `openai-v2`
  (`opentelemetry-instrumentation-openai-v2`) — see docs/genai.md for what each records.

Spans go through a BatchSpanProcessor and the OTLP/HTTP exporter to
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (`latprof receive`, started by `latprof.demo.run`), and are
flushed at shutdown (`shutdown`). Needs the `test` extra's OpenTelemetry packages, and the
chosen GenAI instrumentation: `missing()` says what is not installed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

#: KIND -> (module to import, its instrumentor class, the package to install), None for stock only.
GENAI: dict[str, tuple[str, str, str]] = {
    "openllmetry": ("opentelemetry.instrumentation.openai", "OpenAIInstrumentor", "opentelemetry-instrumentation-openai"),
    "openinference": ("openinference.instrumentation.openai", "OpenAIInstrumentor", "openinference-instrumentation-openai"),
    "openai-v2": ("opentelemetry.instrumentation.openai_v2", "OpenAIInstrumentor", "opentelemetry-instrumentation-openai-v2"),
}
KINDS = ("stock", *GENAI)
#: The stock packages `setup` imports: module -> package.
_STOCK = {
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry.instrumentation.fastapi": "opentelemetry-instrumentation-fastapi",
    "opentelemetry.instrumentation.sqlalchemy": "opentelemetry-instrumentation-sqlalchemy",
    "opentelemetry.instrumentation.httpx": "opentelemetry-instrumentation-httpx",
}


def missing(kind: str) -> list[str]:
    """The packages `kind` needs that are not installed (checked before anything starts)."""
    needed = dict(_STOCK)
    if kind in GENAI:
        module, _, package = GENAI[kind]
        needed[module] = package
    out = []
    for module, package in needed.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(package)
    return out


def setup(kind: str, app: Any, engines: list[Any]) -> Any:
    """Trace the service: `app` (FastAPI), `engines` (SQLAlchemy `Engine`s, sync ones: an async
    engine's `sync_engine`), httpx, and the openai client for a GenAI `kind`. Returns the tracer
    provider (to flush at shutdown)."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if kind not in KINDS:
        raise SystemExit(f"LATPROF_DEMO_TRACES must be one of {', '.join(KINDS)}, not {kind!r}")
    provider = TracerProvider(resource=Resource.create({"service.name": "latprof-demo"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider, excluded_urls="health")
    for engine in engines:
        # the instrumentation declares "sqlalchemy < 2.1": on 2.1 a user has to pass skip_dep_check
        SQLAlchemyInstrumentor().instrument(engine=engine, tracer_provider=provider, skip_dep_check=True)
    HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    if kind in GENAI:
        module, name, _ = GENAI[kind]
        instrumentor = getattr(importlib.import_module(module), name)()
        instrumentor.instrument(tracer_provider=provider)
    return provider


def shutdown(provider: Any) -> None:
    """Send every span still buffered (SIGTERM -> uvicorn's lifespan shutdown: none is lost)."""
    provider.force_flush(10_000)
    provider.shutdown()
