"""A sync Flask tool service traced with stock OpenTelemetry only, for one gunicorn sync worker.

`GET /ANY/PATH?ms=N` answers `{"tool": "ANY/PATH", "ok": true}` after N ms of work; `GET
/health` is not traced. It exports its spans (service `backend`) by OTLP/HTTP to
`$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; the SDK flushes them when the worker exits. The
gateway (traced_app.py) calls it with the stock httpx instrumentation, whose trace context
headers put its server spans in the gateway's traces: one worker serves one request at a
time, so a burst of calls waits in gunicorn's accept backlog, where no span sees it.
"""

from __future__ import annotations

import time

from flask import Flask, jsonify, request
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.flask import FlaskInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": "backend"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
trace.set_tracer_provider(provider)

app = Flask(__name__)
FlaskInstrumentor().instrument_app(app, excluded_urls="health")


@app.get("/health")
def health() -> str:
    return "ok"


@app.get("/<path:tool>")
def work(tool: str):  # type: ignore[no-untyped-def]
    time.sleep(float(request.args.get("ms", "0")) / 1000)
    return jsonify(tool=tool, ok=True)
