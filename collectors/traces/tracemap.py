"""From trace spans to the event model: each trace's root span a request, its descendants layered segments.

Stock OpenTelemetry instrumentation records calls, not waits: no pool-wait span (except
SQLAlchemy's `connect`), LLM HTTP calls that end when the response headers arrive, no queue
time. This module maps what the spans do show to layers by one table (`classify`, the table
below), and leaves the rest uncovered: time on a request's critical path that no
span explains is `unattributed` (traces carry no CPU time), which `latprof.analysis.inference` and the
`uninstrumented-gap` rule then examine.

| spans (scope, name, attributes)                                   | layer |
|-------------------------------------------------------------------|-------|
| `gen_ai.operation.name` chat / text_completion / generate_content / embeddings (also OpenLLMetry's `llm.request.type`, OpenInference's `openinference.span.kind` LLM / EMBEDDING) | `provider` up to the first token when the instrumentation records it (`gen_ai.response.time_to_first_chunk`, a first-chunk event: `genai_spans`), `model` after; without it `provider` with `latprof.ttft_known: false` (the analysis estimates decode from output tokens, as for any non-streamed call) |
| `gen_ai.operation.name` execute_tool, retrieval (OpenInference TOOL, RETRIEVER, RERANKER) | `tool` |
| `gen_ai.operation.name` invoke_agent, create_agent, invoke_workflow (OpenInference AGENT, CHAIN, ...) | none: a wrapper, its children count |
| scope `opentelemetry.instrumentation.sqlalchemy`, name `connect` | `db.pool`: it wraps `Engine.connect`, the pool checkout (measured) |
| any other span with `db.system.name` / `db.system`              | `db.query` (also redis) |
| HTTP client span (`http.request.method`/`http.method`) to an LLM path (`/chat/completions`, `/completions`, `/responses`, `/embeddings`, `/v1/messages`) | `provider`, extended to the caller's next step (the span ends at the response headers; the body streams after), TTFT and decode not split (`latprof.split_unknown`) |
| other CLIENT spans (HTTP, RPC, ...) and PRODUCER spans           | `tool` |
| CONSUMER span with a link to (or a parent that is) a message's send/create span in the file | `queue` from that span's start to the consumer span's start; a `receive` span's own duration is polling, no layer |
| ASGI `http send` / `http receive` spans (`asgi.event.type`)     | dropped: zero-length noise for gaps and sequences |
| scope `litellm`, name `raw_gen_ai_request` (LiteLLM's raw request and answer) | dropped: content only, the `litellm_request` span above it is the call |
| SERVER spans below the root, INTERNAL and other spans            | none: their children count, their own time stays uncovered |

A span that carries latprof's own layer (`latprof.layer`, which `latprof export --format otlp`
writes on every span) has that layer, whatever the table says: an explicit layer beats the
table and what it implies (`none`: no layer of its own, a wrapper). Its request root's CPU time
(`latprof.request.cpu_ns`) is read back too. A value outside the layer vocabulary is ignored,
and spans without the attribute - every stock trace - map as the table says.

An HTTP call inside a GenAI model span is that call's transport: it gets no layer of its own
(the SDK's layers count the time once). A request keeps from its root span only its service, the
proxy's request-start header when the span recorded it, and, for a server root with another server
span below it, what tells a proxy (`_root_attrs`): `latprof.analysis.ingress_inference` reads the
queue in front of the app from them.

`gen_ai.conversation.id`, on any span of a request, is never kept: each span that carries it
gets its keyed digest instead (`latprof.conversation.digest`, `latprof.digests`), and so do the
LLM calls of the request below it; the `context-growth` rule groups turns by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

from latprof.events import NO_ATTRS, Request, Segment
from latprof.layers import DB_POOL, DB_QUERY, MODEL, PROVIDER, QUEUE, SEGMENT_LAYERS, TOOL
from latprof.digests import conversation_digest
from latprof.semconv import (
    CONVERSATION_DIGEST,
    ERROR_TYPE,
    GEN_AI_CONVERSATION_ID,
    HTTP_REQUEST_HEADER_X_REQUEST_START,
    HTTP_REQUEST_HEADER_X_REQUEST_START_PY,
    HTTP_REQUEST_METHOD,
    HTTP_ROUTE,
    LLM_CALL_ID,
    QUEUE_SOURCE,
    SAMPLE_WEIGHT,
    SPAN_STATUS_ERROR,
    SPLIT_UNKNOWN,
    TTFT_KNOWN,
)
from latprof.collectors.traces import genai_spans
from latprof.collectors.traces.spans import KIND_CLIENT, KIND_CONSUMER, KIND_PRODUCER, KIND_SERVER, STATUS_ERROR, Span

#: Path suffixes of LLM API calls (docs/design.md "What is an LLM call"); first match wins.
DEFAULT_LLM_PATHS: tuple[str, ...] = ("/chat/completions", "/completions", "/responses", "/embeddings", "/v1/messages")

SQLALCHEMY_SCOPE = "opentelemetry.instrumentation.sqlalchemy"
GEN_AI_TTFT = genai_spans.GEN_AI_TTFT
#: bool on a `provider` segment made from an HTTP client span: its end was moved from the
#: response headers to the caller's next step.
ENDS_AT_NEXT_STEP = "latprof.llm.extended_to_next_step"
#: "server" on the segment of a server span below the request's root (a downstream service's).
SPAN_KIND = "latprof.span.kind"
#: str on a segment: the service (resource `service.name`) whose span it is.
SERVICE_NAME = "service.name"
#: Name of the `queue` segment made from a message's send span and its process span.
MESSAGING_QUEUE = "messaging queue"
#: Attributes of a request's root server span that tell a proxy, kept on the request when a server span runs below it:
#: Envoy puts `component: proxy` and `upstream_cluster` on its spans, Traefik `entry_point` on its EntryPoint
#: span. nginx's modules (ngx_otel_module, the contrib otel_ngx_module) carry none: only their scope, `nginx`.
PROXY_MARKS = ("component", "upstream_cluster", "entry_point")
#: str on such a request: its root span's instrumentation scope (the name the Jaeger and Zipkin mappings give it).
SCOPE_NAME = "otel.scope.name"
#: str on such a request: its root span's path, query left out (`url_path`).
URL_PATH = "url.path"
_REQUEST_START = (HTTP_REQUEST_HEADER_X_REQUEST_START, HTTP_REQUEST_HEADER_X_REQUEST_START_PY)
#: str on a span: latprof's layer of its time (one of report-v1's, or `NO_LAYER`), as `latprof export` writes it.
LATPROF_LAYER = "latprof.layer"
#: `LATPROF_LAYER` of a span that owns no time of its own (a request root, a wrapper, a connection hold).
NO_LAYER = "none"
#: int on a request's root span: the CPU time its handling thread spent on it, as `latprof export` writes it.
REQUEST_CPU_NS = "latprof.request.cpu_ns"
#: Each value of `LATPROF_LAYER` to the layer it names (one string object per layer, for `is` comparisons).
_EXPLICIT_LAYERS: Mapping[Any, str | None] = {**{layer: layer for layer in SEGMENT_LAYERS}, NO_LAYER: None}
_NOT_EXPLICIT = "?"

_SEND_OPERATIONS = frozenset({"send", "publish", "create"})
_GENAI_MARK_0, _GENAI_MARK_1, _GENAI_MARK_2 = genai_spans.MARKS
_DROP = "drop"  # classify(): not a segment at all
_LLM_HTTP = "llm-http"  # classify(): an HTTP client span to an LLM path
_GENAI_MODEL = "genai-model"  # classify(): a GenAI model call span


def url_path(attrs: Mapping[str, Any]) -> str:
    """The path of an HTTP client span's URL (`url.full`, `http.url`, `url.path`, `http.target`), query stripped."""
    url = attrs.get("url.full") or attrs.get("http.url")
    if isinstance(url, str):
        scheme = url.find("://")
        start = url.find("/", scheme + 3) if scheme >= 0 else url.find("/")
        path = url[start:] if start >= 0 else ""
    else:
        path = attrs.get("url.path") or attrs.get("http.target") or ""
        if not isinstance(path, str):
            return ""
    cut = path.find("?")
    return path if cut < 0 else path[:cut]


def classify(span: Span, llm_paths: Sequence[str] = DEFAULT_LLM_PATHS) -> str | None:
    """The layer of `span` by the module's table, or None (no layer of its own); internal markers
    `_GENAI_MODEL`, `_LLM_HTTP` and `_DROP` for the kinds `map_trace` treats specially. A span's
    own `LATPROF_LAYER` comes first."""
    attrs = span[9]
    if LATPROF_LAYER in attrs:
        value = attrs[LATPROF_LAYER]
        explicit = _EXPLICIT_LAYERS.get(value, _NOT_EXPLICIT) if type(value) is str else _NOT_EXPLICIT
        if explicit is not _NOT_EXPLICIT:
            return explicit
    # any of the GenAI instrumentations' marks (genai_spans.genai_kind): three lookups, not a call, on every span
    if _GENAI_MARK_0 in attrs or _GENAI_MARK_1 in attrs or _GENAI_MARK_2 in attrs:
        genai = genai_spans.genai_kind(attrs)
        if genai is not None:
            if genai == genai_spans.MODEL_CALL:
                return _GENAI_MODEL
            if genai == genai_spans.TOOL_CALL:
                return TOOL
            return None
    if "db.system.name" in attrs or "db.system" in attrs:
        if span[3] == "connect" and span[8] == SQLALCHEMY_SCOPE:  # name, scope
            return DB_POOL
        return DB_QUERY
    kind = span[4]
    if kind == KIND_CLIENT:
        if ("http.request.method" in attrs or "http.method" in attrs) and url_path(attrs).endswith(
            llm_paths if type(llm_paths) is tuple else tuple(llm_paths)
        ):
            return _LLM_HTTP
        return TOOL
    if kind == KIND_PRODUCER:
        return TOOL
    if "asgi.event.type" in attrs or genai_spans.is_raw_payload(span):
        return _DROP
    return None


def error_attrs(span: Span) -> Mapping[str, Any]:
    """The attributes of a span whose status is ERROR, saying so: `latprof.span.status_error`, and
    `error.type` from its `exception` event when the instrumentation set none (the type only: an
    exception's message may hold data)."""
    attrs = {**span.attrs, SPAN_STATUS_ERROR: True}
    if not attrs.get(ERROR_TYPE):
        for event in span.events:
            if event.name == "exception" and event.attrs.get("exception.type"):
                attrs[ERROR_TYPE] = str(event.attrs["exception.type"])
                break
    return attrs


def route_of(span: Span) -> str:
    """The route template of a request's root span (`GET /chat`), else its name."""
    attrs = span.attrs
    route = attrs.get(HTTP_ROUTE)
    if isinstance(route, str) and route:
        method = attrs.get("http.request.method") or attrs.get("http.method")
        return f"{method} {route}" if method else route
    return span.name


@dataclass(frozen=True)
class SpanFacts:
    """What `map_spans` noted while it visited every span, so that the trace inferences
    (`latprof.analysis.span_inference`) need not visit every segment again to find the few requests
    they read: the ids of the requests with a call (a `tool`, `provider` or `model` segment) that may
    have failed - error status, `error.type`, HTTP 429 or 5xx - and of those with a server span
    below their root (another service's); and the call segments themselves by instance and layer
    (`calls`), which the HTTP connection-limit inference groups by host. Only for a timeline whose
    every request was mapped from spans: an inference reading another timeline looks at every segment."""

    failed_calls: frozenset[str]
    downstream_servers: frozenset[str]
    #: The `tool`, `provider` and `model` segments by (instance, layer), in the order mapped.
    calls: Mapping[tuple[int, str], Sequence[Segment]] = field(default_factory=dict)


@dataclass
class TraceEvents:
    """Requests and their segments made from spans, and what could not be mapped."""

    requests: list[Request] = field(default_factory=list)
    segments_by_request: dict[str, list[Segment]] = field(default_factory=dict)
    segment_count: int = 0
    warnings: list[str] = field(default_factory=list)
    #: The emitting instances by the number the events carry as `pid`: service name, instance id, host, pid.
    instances: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: The requests `SpanFacts` names, as `map_trace` finds them.
    failed_calls: set[str] = field(default_factory=set)
    downstream_servers: set[str] = field(default_factory=set)
    calls: dict[tuple[int, str], list[Segment]] = field(default_factory=dict)

    @property
    def facts(self) -> SpanFacts:
        return SpanFacts(frozenset(self.failed_calls), frozenset(self.downstream_servers), self.calls)


class _Counts:
    __slots__ = ("duplicates", "missing_parent", "cycles", "skewed", "skew_max_ns", "skew_pairs", "instances", "by_resource", "services",
                 "first_token_lost")

    def __init__(self) -> None:
        self.duplicates = 0
        self.missing_parent = 0
        self.first_token_lost = 0
        self.cycles = 0
        self.skewed = 0
        self.skew_max_ns = 0
        self.skew_pairs: dict[tuple[str, str], int] = {}
        self.instances: dict[Any, int] = {}
        self.by_resource: dict[int, tuple[Mapping[str, Any], str, int]] = {}
        self.services: dict[str, Mapping[str, Any]] = {}


_NO_SPANS: list[Span] = []


def map_spans(spans: Iterable[Span], *, llm_paths: Sequence[str] = DEFAULT_LLM_PATHS, consume: bool = False) -> TraceEvents:
    """Group `spans` by trace and map each trace (`map_trace`); warnings say what was left out.

    With `consume` (`spans` a list no one else needs), the list is emptied once grouped and each
    trace's spans are let go once mapped: a million spans and the segments made of them are then not
    held at once (the memory freed by one is reused by the other)."""
    traces: dict[str, list[Span]] = {}
    consumers = False
    for span in spans:
        bucket = traces.get(span[0])
        if bucket is None:
            traces[span[0]] = [span]
        else:
            bucket.append(span)
        if span[4] == KIND_CONSUMER:
            consumers = True
    if consume and isinstance(spans, list):
        spans.clear()
    producers: dict[str, Span] = {}
    if consumers:  # messages: their send spans, for the queue time of their process spans
        for trace in traces.values():
            for span in trace:
                if span[4] == KIND_PRODUCER or span[9].get("messaging.operation.type") in _SEND_OPERATIONS:
                    producers[span[1]] = span
    out = TraceEvents()
    counts = _Counts()
    for trace_id, trace in traces.items():
        map_trace(trace_id, trace, out, counts, llm_paths, producers)
        if consume:
            traces[trace_id] = _NO_SPANS  # (a value replaced, not a key removed: the iteration goes on)
    out.instances = {
        number: {k: v for k, v in zip(("service.name", "service.instance.id", "host.name", "process.pid"), key) if v not in (None, "")}
        for key, number in counts.instances.items()
    }  # fmt: skip
    if counts.duplicates:
        out.warnings.append(f"{counts.duplicates} span(s) recorded twice under one id (same trace); kept the first")
    if counts.missing_parent:
        out.warnings.append(
            f"{counts.missing_parent} span(s) name a parent that is not in the input (a partial trace?): each is read"
            " as the root of a request of its own"
        )
    if counts.cycles:
        out.warnings.append(f"{counts.cycles} span(s) in parent cycles (no root above them); left out")
    if counts.first_token_lost:
        out.warnings.append(
            f"{counts.first_token_lost} LLM call span(s) lost their first chunk events (the tracer dropped events over its"
            " limit and kept the latest): their first token is unknown, so they are split into provider and model as"
            " non-streamed calls are; raise OTEL_SPAN_EVENT_COUNT_LIMIT above the chunks a stream sends (the default is"
            " 128) to measure it"
        )
    if counts.skewed:
        pairs = ", ".join(f"{child} under {parent}" for (child, parent), _ in sorted(counts.skew_pairs.items(), key=lambda kv: -kv[1])[:3])
        out.warnings.append(
            f"{counts.skewed} span(s) of one service lie outside their parent span of another service, by up to"
            f" {counts.skew_max_ns / 1e6:.1f} ms ({pairs}): clock skew between services? Clipped to their parent"
        )
    return out


def _service_attrs(service: str, counts: _Counts) -> Mapping[str, Any]:
    """A request root's attributes: its service, one mapping per service shared by its requests."""
    if not service:
        return NO_ATTRS
    attrs = counts.services.get(service)
    if attrs is None:
        attrs = counts.services[service] = MappingProxyType({SERVICE_NAME: service})
    return attrs


def _root_attrs(root: Span, attrs: Mapping[str, Any], downstream: bool) -> Mapping[str, Any]:
    """A request root's attributes beyond its service, for `latprof.analysis.ingress_inference`: the
    request-start header when the root span recorded it (the only header kept), and when the root is a server
    span with another server span below it (it may be a proxy in front of that service), the root's
    `PROXY_MARKS`, scope (`SCOPE_NAME`), method and path (query left out)."""
    span_attrs = root[9]
    out = dict(attrs)
    for key in _REQUEST_START:
        if key in span_attrs:
            out[key] = span_attrs[key]
    if downstream:
        for key in PROXY_MARKS:
            if key in span_attrs:
                out[key] = span_attrs[key]
        out[SCOPE_NAME] = root[8]
        method = span_attrs.get(HTTP_REQUEST_METHOD) or span_attrs.get("http.method")
        if method:
            out[HTTP_REQUEST_METHOD] = method
        out[URL_PATH] = url_path(span_attrs)
    return out


def _instance(span: Span, counts: _Counts) -> int:
    """A small number per emitting instance (service, instance id, host, pid): the requests' `pid`."""
    resource = span[13]
    cached = counts.by_resource.get(id(resource))
    if cached is not None and cached[0] is resource and cached[1] == span[7]:
        return cached[2]
    key = (span[7], resource.get("service.instance.id"), resource.get("host.name"), resource.get("process.pid"))
    number = counts.instances.get(key)
    if number is None:
        number = counts.instances[key] = len(counts.instances) + 1
    counts.by_resource[id(resource)] = (resource, span[7], number)  # one resource object per document part
    return number


def map_trace(
    trace_id: str,
    spans: Sequence[Span],
    out: TraceEvents,
    counts: _Counts,
    llm_paths: Sequence[str],
    producers: Mapping[str, Span],
) -> None:
    """Append one trace's requests and segments to `out`.

    Each span without a parent in the trace is a request root (the trace's id is the request
    id when it has one root). Every span below a root becomes a segment of that request, its
    layer by `classify`; a child hanging directly off the root has no parent segment.
    """
    by_id: dict[str, Span] = {span[1]: span for span in spans}
    if len(by_id) != len(spans):  # an id recorded twice: keep the first
        by_id = {}
        for span in spans:
            if span[1] in by_id:
                counts.duplicates += 1
            else:
                by_id[span[1]] = span
        spans = list(by_id.values())
    children: dict[str, list[Span]] = {}
    roots: list[Span] = []
    for span in spans:
        parent = span[2]
        if parent is None:
            roots.append(span)
        elif parent in by_id and parent != span[1]:
            kids = children.get(parent)
            if kids is None:
                children[parent] = [span]
            else:
                kids.append(span)
        else:
            counts.missing_parent += 1
            roots.append(span)
    reached = 0
    new = tuple.__new__
    failed = STATUS_ERROR  # a local: read on every span
    calls_of = out.calls  # (`SpanFacts.calls`)
    for root in roots:
        request_id = trace_id if len(roots) == 1 else f"{trace_id}:{root[1]}"
        segments: list[Segment] = []
        downstream = False  # a server span below the root: another service's, maybe behind a proxy
        failed_call = False  # a call that may have failed (`SpanFacts`)
        start_ns, end_ns = root[5], root[6]
        reached += 1
        root_id = root[1]
        # the request's conversation, digested: LLM calls below a span that names it get it too
        conversation = conversation_digest(root[9][GEN_AI_CONVERSATION_ID]) if GEN_AI_CONVERSATION_ID in root[9] else None
        # depth-first: (span, its parent span, inside an LLM model call)
        stack: list[tuple[Span, Span, bool]] = [(kid, root, False) for kid in children.get(root_id, ())]
        last_resource: Any = None  # the instance number of the last span's resource and service, reused
        last_service: Any = None
        pid = 0
        while stack:
            span, parent_span, in_llm = stack.pop()
            reached += 1
            layer = classify(span, llm_paths)
            if layer is _DROP:
                continue
            sid = span[1]
            parent_segment = None if parent_span is root else parent_span[1]
            if span[13] is not last_resource or span[7] is not last_service:  # (else `_instance` compares them)
                last_resource, last_service, pid = span[13], span[7], _instance(span, counts)
            if span[10] == failed:
                span = span._replace(attrs=error_attrs(span))
            if GEN_AI_CONVERSATION_ID in span[9]:  # never kept: its digest is
                span = span._replace(attrs=digested(span[9]))
                conversation = span[9].get(CONVERSATION_DIGEST) or conversation
            child_in_llm = in_llm
            s_start, s_end = span[5], span[6]
            if span[7] != parent_span[7] and (s_start < parent_span[5] - 1_000_000 or s_end > parent_span[6] + 1_000_000):
                counts.skewed += 1
                counts.skew_max_ns = max(counts.skew_max_ns, parent_span[5] - s_start, s_end - parent_span[6])
                pair = (span[7] or "?", parent_span[7] or "?")
                counts.skew_pairs[pair] = counts.skew_pairs.get(pair, 0) + 1
            if layer is _GENAI_MODEL:
                child_in_llm = True
                calls = _model_call(request_id, span, parent_segment, pid, counts)
                if conversation is not None and CONVERSATION_DIGEST not in calls[0][8]:
                    calls = [call._replace(attrs={**call[8], CONVERSATION_DIGEST: conversation}) for call in calls]
                segments.extend(calls)
                for call in calls:
                    if call[4] is not None:
                        calls_of.setdefault((pid, call[4]), []).append(call)
                if not failed_call and any(may_have_failed(c[8]) for c in calls):
                    failed_call = True
            elif layer is _LLM_HTTP:
                if in_llm:  # the SDK span above counts this time
                    segments.append(new(Segment, (request_id, sid, parent_segment, span[3], None, s_start, s_end, pid, span[9])))
                else:
                    child_in_llm = True
                    # a failed answer (429, 5xx, an error) streams no body: its span ends where the call did,
                    # and the time after it is the caller's (a retry's backoff, inferred later), not the provider's
                    if _failed_http(span):
                        failed_call = True  # (what `_failed_http` reads, `may_have_failed` does too)
                    else:
                        s_end = _next_step(span, parent_span, children.get(parent_span[1], ()))
                        if not failed_call and may_have_failed(span[9]):
                            failed_call = True
                    attrs = {**span[9], SPLIT_UNKNOWN: True, LLM_CALL_ID: sid, ENDS_AT_NEXT_STEP: s_end != span[6]}
                    call = new(Segment, (request_id, sid, parent_segment, span[3], PROVIDER, s_start, s_end, pid, attrs))
                    segments.append(call)
                    found = calls_of.get((pid, PROVIDER))
                    if found is None:
                        calls_of[(pid, PROVIDER)] = [call]
                    else:
                        found.append(call)
            else:
                if in_llm and layer is TOOL:
                    layer = None
                own: Mapping[str, Any] = span[9]
                if span[4] == KIND_SERVER:
                    own = {**own, SPAN_KIND: "server", SERVICE_NAME: span[7]}
                    downstream = True
                segment = new(Segment, (request_id, sid, parent_segment, span[3], layer, s_start, s_end, pid, own))
                segments.append(segment)
                if layer is TOOL:
                    found = calls_of.get((pid, TOOL))
                    if found is None:
                        calls_of[(pid, TOOL)] = [segment]
                    else:
                        found.append(segment)
                    if not failed_call and may_have_failed(own):
                        failed_call = True
            if span[4] == KIND_CONSUMER:
                queue = _messaging_queue(request_id, span, parent_segment, pid, producers)
                if queue is not None:
                    segments.append(queue)
            kids = children.get(sid)
            if kids:
                for kid in kids:
                    stack.append((kid, span, child_in_llm))
        if root[4] == KIND_CONSUMER:
            queue = _messaging_queue(request_id, root, None, _instance(root, counts), producers)
            if queue is not None:
                segments.append(queue)
                start_ns = min(start_ns, queue.start_ns)
        root_attrs = root[9]
        status = root_attrs.get("http.response.status_code") or root_attrs.get("http.status_code")
        kept = _service_attrs(root[7], counts)
        if downstream:
            out.downstream_servers.add(request_id)
        if failed_call:
            out.failed_calls.add(request_id)
        downstream = downstream and root[4] == KIND_SERVER  # a proxy's root is a server span
        if downstream or _REQUEST_START[0] in root_attrs or _REQUEST_START[1] in root_attrs:
            kept = _root_attrs(root, kept, downstream)
        if SAMPLE_WEIGHT in root_attrs:  # a request read one in k (ClickHouse's pick, a sampled capture exported) stands for k
            kept = {**kept, SAMPLE_WEIGHT: root_attrs[SAMPLE_WEIGHT]}
        out.requests.append(
            new(Request, (request_id, route_of(root), start_ns, end_ns, _instance(root, counts), _cpu_ns(root_attrs),
                          status if type(status) is int else None, kept))
        )  # fmt: skip
        if segments:
            out.segments_by_request[request_id] = segments
            out.segment_count += len(segments)
    if reached < len(by_id):
        counts.cycles += len(by_id) - reached


def _cpu_ns(attrs: Mapping[str, Any]) -> int | None:
    """A request root's CPU time from its span's `REQUEST_CPU_NS`, when it is a count of ns; else None (stock spans)."""
    cpu = attrs.get(REQUEST_CPU_NS)
    return cpu if type(cpu) is int and cpu >= 0 else None


def _model_call(request_id: str, span: Span, parent_segment: str | None, pid: int, counts: _Counts) -> list[Segment]:
    """A GenAI model span, read by its instrumentation's names (`genai_spans.read_llm_call`):
    `provider` until the first token when recorded, `model` after; without it `provider` with
    `latprof.ttft_known: false`. A Logfire stream's request span (it ends at the response
    object) is `provider` time of no call of its own. Prompts and completions are left out."""
    sid = span[1]
    call = genai_spans.read_llm_call(span)
    start, end, first = call.start_ns, call.end_ns, call.first_token_ns
    if call.first_token_lost:
        counts.first_token_lost += 1
    if call.stream_request:
        return [Segment(request_id, sid, parent_segment, span[3], PROVIDER, start, end, pid, call.attrs)]
    if first is not None:  # measured: the floor and decode rules read such calls
        attrs = {**call.attrs, LLM_CALL_ID: sid, TTFT_KNOWN: True}
        return [
            Segment(request_id, sid, parent_segment, span[3], PROVIDER, start, first, pid, attrs),
            Segment(request_id, f"{sid}.decode", parent_segment, span[3], MODEL, first, end, pid, attrs),
        ]
    attrs = {**call.attrs, LLM_CALL_ID: sid, TTFT_KNOWN: False}
    return [Segment(request_id, sid, parent_segment, span[3], PROVIDER, start, end, pid, attrs)]


def digested(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """`attrs` with `gen_ai.conversation.id` replaced by its keyed digest (`latprof.digests`,
    `latprof.conversation.digest`): the id itself is never kept."""
    out = {key: value for key, value in attrs.items() if key != GEN_AI_CONVERSATION_ID}
    digest = conversation_digest(attrs.get(GEN_AI_CONVERSATION_ID))
    if digest is not None:
        out[CONVERSATION_DIGEST] = digest
    return out


def may_have_failed(attrs: Mapping[str, Any]) -> bool:
    """True when a call's attributes (error status already marked by `map_trace`) say it may have
    failed: `latprof.span.status_error`, `error.type`, or HTTP 429 or 5xx (what
    `latprof.analysis.retries.failure_of` reads)."""
    if SPAN_STATUS_ERROR in attrs or ERROR_TYPE in attrs:
        return True
    # both status keys, unrolled: this runs on every call span
    status = attrs.get("http.response.status_code")
    if isinstance(status, int) and (status == 429 or status >= 500):
        return True
    status = attrs.get("http.status_code")
    return isinstance(status, int) and (status == 429 or status >= 500)


def _failed_http(span: Span) -> bool:
    """True when an HTTP client span's call failed: error status, or HTTP 429 or 5xx."""
    if span[10] == STATUS_ERROR:
        return True
    status = span[9].get("http.response.status_code") or span[9].get("http.status_code")
    return type(status) is int and (status == 429 or status >= 500)


def _next_step(span: Span, parent: Span, siblings: Sequence[Span]) -> int:
    """Where the caller's next step begins after an LLM HTTP span that ended at the response
    headers: the first sibling that starts after it ends, else the parent's end."""
    end = span[6]
    following = parent[6]
    for sibling in siblings:
        if sibling is not span and end <= sibling[5] < following and "asgi.event.type" not in sibling[9]:
            following = sibling[5]
    return max(end, following)


def _messaging_queue(request_id: str, span: Span, parent_segment: str | None, pid: int,
                     producers: Mapping[str, Span]) -> Segment | None:  # fmt: skip
    """The `queue` segment of a message's process span: from its send/create span's start to
    the process span's start (through a link, or the parent); None for `receive` spans, whose
    own duration is polling."""
    if span.attrs.get("messaging.operation.type") == "receive":
        return None
    sources = [link.span_id for link in span.links]
    if span[2] is not None:
        sources.append(span[2])
    for source in sources:
        producer = producers.get(source)
        if producer is not None and producer[5] < span[5]:
            return Segment(request_id, f"{span[1]}.queue", parent_segment, MESSAGING_QUEUE, QUEUE, producer[5], span[5], pid,
                           {QUEUE_SOURCE: "messaging", "messaging.destination.name": span.attrs.get("messaging.destination.name")})  # fmt: skip
    return None
