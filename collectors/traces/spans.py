"""The span every trace reader yields (OTLP JSON, and later Jaeger, Zipkin, OTLP protobuf).

A reader in `collectors/` turns its format into `Span` tuples; `latprof.collectors.traces.tracemap` turns the
spans of each trace into the event model (requests and their layered segments). Ids are
lowercase hex strings whatever the format carried; times are nanoseconds since the Unix
epoch; attributes are flat (an OTLP `AnyValue` becomes a Python str, bool, int, float,
list or dict).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from latprof.events import NO_ATTRS

#: Span kinds, numbered as OTLP numbers them.
KIND_UNSPECIFIED = 0
KIND_INTERNAL = 1
KIND_SERVER = 2
KIND_CLIENT = 3
KIND_PRODUCER = 4
KIND_CONSUMER = 5
#: Span kind names (OTLP's enum names and the short lower-case forms other formats use) to numbers.
KIND_NAMES: Mapping[str, int] = {
    "SPAN_KIND_UNSPECIFIED": KIND_UNSPECIFIED,
    "SPAN_KIND_INTERNAL": KIND_INTERNAL,
    "SPAN_KIND_SERVER": KIND_SERVER,
    "SPAN_KIND_CLIENT": KIND_CLIENT,
    "SPAN_KIND_PRODUCER": KIND_PRODUCER,
    "SPAN_KIND_CONSUMER": KIND_CONSUMER,
    "unspecified": KIND_UNSPECIFIED,
    "internal": KIND_INTERNAL,
    "server": KIND_SERVER,
    "client": KIND_CLIENT,
    "producer": KIND_PRODUCER,
    "consumer": KIND_CONSUMER,
}

#: Status codes, numbered as OTLP numbers them.
STATUS_UNSET = 0
STATUS_OK = 1
STATUS_ERROR = 2
STATUS_NAMES: Mapping[str, int] = {
    "STATUS_CODE_UNSET": STATUS_UNSET,
    "STATUS_CODE_OK": STATUS_OK,
    "STATUS_CODE_ERROR": STATUS_ERROR,
    "UNSET": STATUS_UNSET,
    "OK": STATUS_OK,
    "ERROR": STATUS_ERROR,
}


class SpanEvent(NamedTuple):
    """A timestamped event on a span (`gen_ai.content.completion`, `exception`, a first-token mark)."""

    name: str
    ts_ns: int
    attrs: Mapping[str, Any] = NO_ATTRS


class SpanLink(NamedTuple):
    """A link from a span to another span (a message's process span to its send/create span)."""

    trace_id: str
    span_id: str


class Span(NamedTuple):
    """One span of a trace.

    `parent_id` is None for a root span (an absent or empty parent id). `resource` is the
    attribute mapping of the resource that emitted the span (`service.name`,
    `service.instance.id`, `host.name`, ...): one mapping object shared by all of that
    resource's spans. `service` is its `service.name` ("" when absent), `scope` the
    instrumentation scope's name ("" when absent).
    """

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    service: str
    scope: str
    attrs: Mapping[str, Any] = NO_ATTRS
    status_code: int = STATUS_UNSET
    events: tuple[SpanEvent, ...] = ()
    links: tuple[SpanLink, ...] = ()
    resource: Mapping[str, Any] = NO_ATTRS
    #: How many events the tracer dropped (OTLP `dropped_events_count`: over its limit, 128 by default), on a
    #: span that kept some (0 on one with none: nothing to misread). The OpenTelemetry SDK keeps the latest,
    #: so the first of a kind - a stream's first chunk - may be gone.
    dropped_events: int = 0

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns
