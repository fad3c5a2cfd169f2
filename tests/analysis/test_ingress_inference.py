"""The queue in front of the app (latprof.analysis.ingress_inference): a proxy's X-Request-Start on the app's
server span (measured), a proxy's span above it (inferred: Envoy, nginx, Traefik, a proxy written in Python),
and the shapes that must not read as one. Spans are built as the trace readers yield them and mapped by the
tracemap, as `latprof analyze` does."""

from __future__ import annotations

import heapq
import itertools
import json
from pathlib import Path
from typing import Any, Sequence

import orjson
import pytest

from timelines import analysed, req, seg

from latprof.analysis.inference import INFERRED, INFERRED_CONCURRENCY, QUEUE_SOURCE_DOWNSTREAM, infer_queueing
from latprof.analysis.ingress_inference import (
    FORWARDED_TO_APP,
    MAX_QUEUE_NS,
    QUEUE_PROXY,
    QUEUE_READ_FROM,
    infer_ingress_queue,
    parse_request_start,
    proxy_hop,
)
from latprof.analysis.requests import analyze, layer_times_ms
from latprof.analysis.span_inference import infer_from_spans
from latprof.analysis.timeline import RequestTimeline, Timeline
from latprof.collectors.traces.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, Span
from latprof.collectors.traces.tracemap import map_spans
from latprof.engine import run_rules
from latprof.layers import DB_QUERY, QUEUE, TOOL, UNATTRIBUTED
from latprof.pipeline import default_rules, run_diagnosis
from latprof.report.model import build_report
from latprof.rules.request_queueing import RequestQueueing
from latprof.semconv import HTTP_REQUEST_HEADER_X_REQUEST_START, HTTP_REQUEST_HEADER_X_REQUEST_START_PY, QUEUE_SOURCE

T0_S = 1_790_000_000  # the origin, in epoch seconds
T0 = T0_S * 1_000_000_000
MS = 1_000_000
_ids = itertools.count(1)
FLASK = "opentelemetry.instrumentation.flask"


def ms(t: float) -> int:
    return T0 + int(round(t * MS))


_RESOURCES: dict[str, dict[str, Any]] = {}


def span(name: str, start: float, end: float, *, parent: Span | None = None, kind: int = KIND_INTERNAL, trace: str = "a" * 32,
         scope: str = "", service: str = "app", **attrs: Any) -> Span:  # fmt: skip
    """A span as a reader yields it: one resource mapping per service, shared by its spans."""
    resource = _RESOURCES.setdefault(service, {"service.name": service})
    return Span(trace, f"{next(_ids):016x}", parent.span_id if parent else None, name, kind, ms(start), ms(end), service, scope,
                attrs, resource=resource)  # fmt: skip


def app(start: float, end: float, *, parent: Span | None = None, trace: str = "a" * 32, path: str = "/chat",
        **attrs: Any) -> list[Span]:  # fmt: skip
    """The app's Flask server span (old semantic conventions, as 0.66b1 writes them by default) and a query inside."""
    server = span(f"GET {path}", start, end, parent=parent, kind=KIND_SERVER, trace=trace, scope=FLASK,
                  **{"http.method": "GET", "http.target": path, "http.route": path, "http.status_code": 200,
                     **attrs})  # fmt: skip
    query = span("SELECT", start + 2, start + 7, parent=server, kind=KIND_CLIENT, trace=trace, **{"db.system": "postgresql"})
    return [server, query]


def timeline_of(spans: Sequence[Span]) -> Timeline:
    events = map_spans(spans)
    requests = [RequestTimeline(r, tuple(events.segments_by_request.get(r.request_id, ()))) for r in events.requests]
    return Timeline("otlp", ["<test>"], sorted(requests, key=lambda rt: rt.request.start_ns), warnings=list(events.warnings))


def only(tl: Timeline) -> RequestTimeline:
    [rt] = tl.requests
    return rt


def times(rt: RequestTimeline) -> dict[str, float]:
    return {k: round(v, 3) for k, v in layer_times_ms(rt).items()}


def queues(tl: Timeline) -> list[Any]:
    return [s for rt in tl.requests for s in rt.segments if s.layer == QUEUE]


# --- the request-start value ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected_ns",
    [
        ("t=1790000000.123", 1_790_000_000_123_000_000),  # nginx `t=${msec}`: seconds, ms resolution
        ("1790000000.5", 1_790_000_000_500_000_000),  # bare seconds
        ("1790000000123", 1_790_000_000_123_000_000),  # Heroku: integer milliseconds
        ("t=1790000000123456", 1_790_000_000_123_456_000),  # microseconds (New Relic accepts them)
        ("t=1790000000123456789", 1_790_000_000_123_456_789),  # nanoseconds
        (" T= 1790000000.25 ", 1_790_000_000_250_000_000),
        (["t=1790000000.123"], 1_790_000_000_123_000_000),  # the attribute: a list of strings
        (("t=1790000000.2", "t=1790000000.1"), 1_790_000_000_100_000_000),  # two stamps: the earliest (outermost proxy)
        ("t=1790000000.2, t=1790000000.1", 1_790_000_000_100_000_000),  # a folded header
        ('["t=1790000000.123"]', 1_790_000_000_123_000_000),  # a list the Jaeger/Zipkin mappings wrote as JSON
        (1790000000123, 1_790_000_000_123_000_000),  # a number
        (["garbage", "t=1790000000.123"], 1_790_000_000_123_000_000),
    ],
)
def test_a_request_start_is_read_in_seconds_ms_us_or_ns_by_its_magnitude(value: Any, expected_ns: int) -> None:
    assert parse_request_start(value) == expected_ns


@pytest.mark.parametrize("value", ["", "t=", "abc", "t=-5", "t=0", "nan", "inf", "t=1e400", None, True, {}, [], ["x"],
                                   "[not json", '{"t": 1}', b"t=1790000000"])  # fmt: skip
def test_a_value_that_names_no_time_is_none(value: Any) -> None:
    assert parse_request_start(value) is None


# --- the header on the app's own server span (the proxy untraced): measured --------------------------


def test_the_header_on_the_root_span_is_measured_queue_and_the_request_starts_at_the_stamp() -> None:
    stamp_s = T0_S + 0.060  # the proxy stamped the request 40 ms before the app's span started at 100 ms
    tl = timeline_of(app(100, 200, **{HTTP_REQUEST_HEADER_X_REQUEST_START_PY: [f"t={stamp_s:.3f}"]}))
    rt = only(infer_ingress_queue(tl))
    [queue] = [s for s in rt.segments if s.layer == QUEUE]
    assert (queue.start_ns, queue.end_ns) == (ms(60), ms(100)) and rt.request.start_ns == ms(60)
    assert queue.attrs[QUEUE_SOURCE] == "header" and queue.attrs[QUEUE_READ_FROM] == HTTP_REQUEST_HEADER_X_REQUEST_START_PY
    assert INFERRED not in queue.attrs  # the proxy timed it
    assert times(rt) == {QUEUE: 40.0, DB_QUERY: 5.0, UNATTRIBUTED: 95.0}


def test_the_semantic_conventions_dash_form_is_read_too_and_heroku_milliseconds() -> None:
    tl = timeline_of(app(100, 200, **{HTTP_REQUEST_HEADER_X_REQUEST_START: str(T0_S * 1000 + 75)}))
    rt = only(infer_ingress_queue(tl))
    assert rt.request.start_ns == ms(75) and times(rt)[QUEUE] == 25.0


def test_a_root_span_without_the_header_is_left_alone() -> None:
    tl = timeline_of(app(100, 200))
    assert infer_ingress_queue(tl) is tl


def test_no_other_header_is_kept_from_the_root_span() -> None:
    tl = timeline_of(app(100, 200, **{HTTP_REQUEST_HEADER_X_REQUEST_START: ["t=1790000000.05"],
                                      "http.request.header.authorization": ["Bearer secret"]}))  # fmt: skip
    attrs = only(tl).request.attrs
    assert HTTP_REQUEST_HEADER_X_REQUEST_START in attrs and "http.request.header.authorization" not in attrs


def test_a_stamp_after_the_span_started_is_no_queue_and_a_clock_warning() -> None:
    """The proxy's clock 5 ms ahead of the app's: no negative queue, the request keeps its start."""
    tl = timeline_of(app(100, 200, **{HTTP_REQUEST_HEADER_X_REQUEST_START: [f"t={T0_S + 0.105:.3f}"]}))
    out = infer_ingress_queue(tl)
    rt = only(out)
    assert not queues(out) and rt.request.start_ns == ms(100)
    [warning] = out.warnings
    assert "after their server span started, by up to 5.0 ms" in warning and "clock" in warning


def test_a_stamp_a_hair_after_the_span_is_no_queue_without_a_warning() -> None:
    tl = timeline_of(app(100, 200, **{HTTP_REQUEST_HEADER_X_REQUEST_START: [f"t={T0_S}.1003"]}))
    out = infer_ingress_queue(tl)
    assert not queues(out) and not out.warnings


@pytest.mark.parametrize("value, words", [(["t=1790000000.1", "junk"][1:], "names no time"),
                                          ([f"t={T0_S - 7200}"], "more than 10 minutes before")])  # fmt: skip
def test_an_unreadable_or_implausible_stamp_is_ignored_with_a_warning(value: Any, words: str) -> None:
    tl = timeline_of(app(100, 200, **{HTTP_REQUEST_HEADER_X_REQUEST_START: value}))
    out = infer_ingress_queue(tl)
    assert not queues(out) and only(out).request.start_ns == ms(100)
    [warning] = out.warnings
    assert words in warning and warning.startswith("1 request(s)")
    assert MAX_QUEUE_NS == 600 * 1_000_000_000


def test_moved_starts_keep_the_requests_in_arrival_order() -> None:
    first = app(100, 200, trace="b" * 32)  # no stamp
    second = app(110, 200, trace="c" * 32, **{HTTP_REQUEST_HEADER_X_REQUEST_START: [f"t={T0_S + 0.050:.3f}"]})
    out = infer_ingress_queue(timeline_of(first + second))
    assert [rt.request.request_id for rt in out.requests] == ["c" * 32, "b" * 32]


# --- a proxy's span above the app's server span: inferred ---------------------------------------------


def envoy(trace: str, arrival: float, forwarded: float, start: float, end: float) -> list[Span]:
    """Envoy's ingress span (component: proxy), its upstream span (spawn_upstream_span), the app below."""
    root = span("ingress", arrival, end + 1, kind=KIND_SERVER, trace=trace, service="edge",
                **{"component": "proxy", "node_id": "edge-1", "http.method": "GET", "http.url": "http://edge/chat",
                   "http.protocol": "HTTP/1.1", "upstream_cluster": "app", "http.status_code": "200"})  # fmt: skip
    upstream = span("router app egress", forwarded, end + 0.5, parent=root, kind=KIND_CLIENT, trace=trace, service="edge",
                    **{"component": "proxy", "upstream_cluster": "app", "upstream_address": "10.0.0.7:8000"})  # fmt: skip
    return [root, upstream, *app(start, end, parent=upstream, trace=trace)]


def nginx(trace: str, arrival: float, start: float, end: float) -> list[Span]:
    """ngx_otel_module's one span per request (scope `nginx`, no proxy attribute), the app right below it."""
    root = span("/chat", arrival, end + 1, kind=KIND_SERVER, trace=trace, scope="nginx", service="unknown_service:nginx",
                **{"http.method": "GET", "http.target": "/chat", "http.route": "/", "http.status_code": 200,
                   "net.sock.peer.addr": "10.0.0.2"})  # fmt: skip
    return [root, *app(start, end, parent=root, trace=trace)]


def traefik(trace: str, arrival: float, forwarded: float, start: float, end: float) -> list[Span]:
    """Traefik 3's EntryPoint (server), Router and Service (internal), ReverseProxy (client) spans, the app below."""
    root = span("EntryPoint", arrival, end + 1, kind=KIND_SERVER, trace=trace, service="traefik",
                **{"entry_point": "web", "http.request.method": "GET", "url.path": "/chat",
                   "http.response.status_code": 200})  # fmt: skip
    router = span("Router", arrival + 0.1, end + 0.8, parent=root, trace=trace, service="traefik",
                  **{"traefik.router.name": "app@docker", "http.route": "PathPrefix(`/`)"})  # fmt: skip
    service = span("Service", arrival + 0.2, end + 0.7, parent=router, trace=trace, service="traefik",
                   **{"traefik.service.name": "app@docker"})  # fmt: skip
    proxy = span("ReverseProxy", forwarded, end + 0.5, parent=service, kind=KIND_CLIENT, trace=trace, service="traefik",
                 **{"http.request.method": "GET", "url.full": "http://10.0.0.7:8000/chat",
                    "server.address": "10.0.0.7"})  # fmt: skip
    return [root, router, service, proxy, *app(start, end, parent=proxy, trace=trace)]


def python_proxy(trace: str, arrival: float, forwarded: float, start: float, end: float, *, upstream_path: str = "/chat",
                 extra: Sequence[str] = ()) -> list[Span]:  # fmt: skip
    """A reverse proxy written in Python (Starlette + httpx, stock instrumentations): no mark, only its shape."""
    root = span("GET /{path:path}", arrival, end + 1, kind=KIND_SERVER, trace=trace, service="py-proxy",
                scope="opentelemetry.instrumentation.asgi",
                **{"http.method": "GET", "http.target": "/chat", "http.route": "/{path:path}",
                   "http.status_code": 200})  # fmt: skip
    call = span("GET", forwarded, end + 0.5, parent=root, kind=KIND_CLIENT, trace=trace, service="py-proxy",
                scope="opentelemetry.instrumentation.httpx",
                **{"http.method": "GET", "http.url": f"http://127.0.0.1:8000{upstream_path}"})  # fmt: skip
    spans = [root, call, *app(start, end, parent=call, trace=trace, path=upstream_path)]
    for name in extra:  # the proxy's own work besides forwarding
        spans.append(span(name, arrival + 0.1, arrival + 0.4, parent=root, kind=KIND_CLIENT, trace=trace, service="py-proxy",
                          **{"db.system": "redis"}))  # fmt: skip
    return spans


@pytest.mark.parametrize(
    "build, queue_from, evidence",
    [
        (lambda: envoy("e" * 32, 0, 2, 122, 222), 2, "edge (envoy: component=proxy)"),
        (lambda: nginx("f" * 32, 0, 120, 220), 0, "unknown_service:nginx (nginx: scope nginx)"),
        (lambda: traefik("d" * 32, 0, 2, 122, 222), 2, "traefik (traefik: entry_point)"),
        (lambda: python_proxy("c" * 32, 0, 2, 122, 222), 2,
         "py-proxy (its spans only forward the request, same method and path)"),
    ],
    ids=["envoy", "nginx", "traefik", "python"],
)
def test_a_proxy_span_above_the_app_gives_inferred_queue_and_its_client_span_is_no_tool(build: Any, queue_from: float,
                                                                                      evidence: str) -> None:  # fmt: skip
    tl = timeline_of(build())
    rt = only(infer_ingress_queue(tl))
    [queue] = [s for s in rt.segments if s.layer == QUEUE]
    assert (queue.start_ns, queue.end_ns) == (ms(queue_from), ms(120 if queue_from == 0 else 122))
    assert queue.attrs[INFERRED] is True and queue.attrs[QUEUE_SOURCE] == "proxy" and queue.attrs[QUEUE_PROXY] == evidence
    layers = times(rt)
    assert TOOL not in layers, layers  # the proxy's call to the app is not a tool call: the app's time is its own
    assert layers[QUEUE] == 120.0 and layers[DB_QUERY] == 5.0
    forwarded = [s for s in rt.segments if s.attrs.get(FORWARDED_TO_APP)]
    assert all(s.layer is None for s in forwarded) and len(forwarded) == (0 if queue_from == 0 else 1)


def test_the_header_on_an_app_span_below_a_proxy_is_not_read_the_proxy_span_is() -> None:
    spans = envoy("e" * 32, 0, 2, 122, 222)
    spans[2] = spans[2]._replace(attrs={**spans[2].attrs, HTTP_REQUEST_HEADER_X_REQUEST_START: ["t=1789999999.0"]})
    rt = only(infer_ingress_queue(timeline_of(spans)))
    assert [s.attrs[QUEUE_SOURCE] for s in rt.segments if s.layer == QUEUE] == ["proxy"] and rt.request.start_ns == ms(0)


# --- shapes that are not a proxy in front of the app ---------------------------------------------------


def gateway(trace: str, start: float, called: float, served: float, end: float, *, path: str = "/search") -> list[Span]:
    """An ordinary service: its handler calls another service (httpx) at another path, then answers."""
    root = span("GET /chat", start, end, kind=KIND_SERVER, trace=trace, service="gateway",
                scope="opentelemetry.instrumentation.fastapi",
                **{"http.method": "GET", "http.target": "/chat", "http.route": "/chat", "http.status_code": 200})  # fmt: skip
    call = span("GET", called, served + 101, parent=root, kind=KIND_CLIENT, trace=trace, service="gateway",
                **{"http.method": "GET", "http.url": f"http://backend:8000{path}"})  # fmt: skip
    return [root, call, *app(served, served + 100, parent=call, trace=trace, path=path)]


def test_an_app_calling_another_service_is_no_ingress_queue() -> None:
    tl = timeline_of(gateway("a" * 32, 0, 5, 125, 240))
    assert proxy_hop(only(tl)) is None
    assert infer_ingress_queue(tl) is tl
    assert times(only(tl))[TOOL] > 100  # the call stays a tool call


def test_a_service_that_forwards_the_same_path_but_does_work_of_its_own_is_no_proxy() -> None:
    tl = timeline_of(python_proxy("c" * 32, 0, 2, 122, 222, extra=["GET session"]))
    assert proxy_hop(only(tl)) is None and infer_ingress_queue(tl) is tl


def test_a_proxy_that_rewrites_the_path_and_carries_no_mark_is_not_recognised() -> None:
    tl = timeline_of(python_proxy("c" * 32, 0, 2, 122, 222, upstream_path="/v2/chat"))
    assert infer_ingress_queue(tl) is tl


def test_a_traced_client_calling_the_app_is_no_proxy() -> None:
    """A load generator's client span as the root, the same path below: a caller, not a proxy's server span."""
    root = span("GET", 0, 230, kind=KIND_CLIENT, service="loadgen", **{"http.method": "GET", "http.url": "http://app/chat"})
    tl = timeline_of([root, *app(120, 220, parent=root)])
    assert proxy_hop(only(tl)) is None and infer_ingress_queue(tl) is tl


def test_a_proxy_that_tried_the_app_twice_reads_no_queue() -> None:
    """Two attempts (a retry): which wait was the queue is not one reading."""
    spans = envoy("e" * 32, 0, 2, 122, 222)
    second = span("router app egress", 230, 300, parent=spans[0], kind=KIND_CLIENT, trace="e" * 32, service="edge",
                  component="proxy", upstream_cluster="app")  # fmt: skip
    tl = timeline_of(spans + [second, *app(240, 290, parent=second, trace="e" * 32)])
    assert proxy_hop(only(tl)) is None and infer_ingress_queue(tl) is tl


def test_the_app_span_started_before_the_proxy_forwarded_it_is_no_negative_queue() -> None:
    """The app's clock 3 ms behind the proxy's: no queue, the client span still loses its layer."""
    rt = only(infer_ingress_queue(timeline_of(envoy("e" * 32, 0, 10, 7, 107))))
    assert not [s for s in rt.segments if s.layer == QUEUE]
    assert TOOL not in times(rt)


# --- across requests: the verdict, and what infer_queueing guessed ----------------------------------------


def one_worker(n: int = 240, *, workers: int = 1, service_ms: float = 50.0, burst: int = 6, every: int = 20,
               hop_ms: float = 0.8) -> list[tuple[float, float, float]]:  # fmt: skip
    """(arrival, start, end) of requests to an app of `workers` sync workers, FIFO: one request every
    200 ms, and every `every` a burst of `burst` more at once (they wait in the backlog)."""
    free = [0.0] * workers
    heapq.heapify(free)
    out, t = [], 0.0
    for i in range(n):
        t += 0.2 if i % every in range(1, burst + 1) else 200.0
        start = max(t + hop_ms, heapq.heappop(free) + 1.3)  # a sync worker takes ~1.3 ms to accept the next one
        heapq.heappush(free, start + service_ms)
        out.append((t, start, start + service_ms))
    return out


def report_for(tl: Timeline) -> Any:
    analysis = analyze(infer_from_spans(tl), warmup_s=0)
    findings = run_rules(analysis, default_rules())
    return analysis, findings, build_report(analysis, findings)


def test_an_app_behind_envoy_with_a_backlog_is_queue_inferred_from_the_proxy_not_downstream() -> None:
    spans = [s for i, (t, start, end) in enumerate(one_worker()) for s in envoy(f"{i:032x}", t, t + 0.3, start, end)]
    tl = timeline_of(spans)
    assert any(s.attrs.get(QUEUE_SOURCE) == QUEUE_SOURCE_DOWNSTREAM for s in queues(infer_queueing(tl)))  # what it would guess
    analysis, findings, report = report_for(tl)
    sources = {s.attrs[QUEUE_SOURCE] for rt in analysis.timeline.requests for s in rt.segments if s.layer == QUEUE}
    assert sources == {"proxy"}  # infer_queueing's segments gave way
    assert all(s.attrs.get(INFERRED_CONCURRENCY) == 1 for s in queues(analysis.timeline) if s.end_ns - s.start_ns > 10 * MS)
    assert (report.verdict.layer, report.verdict.rule) == (QUEUE, "request-queueing"), report.verdict
    [finding] = [f for f in findings if f.rule == "request-queueing"]
    evidence = finding.evidence
    assert evidence["inferred"] is True and evidence["proxies"] == ["edge (envoy: component=proxy)"]
    assert evidence["queue_sources"] == {"proxy": len(analysis.requests)}
    assert evidence["services_at_fixed_concurrency"] == ["app (1 at a time)"]  # corroboration
    assert finding.summary.startswith("Inferred") and "edge (envoy: component=proxy)" in finding.summary
    assert finding.confidence <= 0.6


def test_an_app_with_room_behind_a_proxy_has_no_queue_verdict() -> None:
    spans = [s for i, (t, start, end) in enumerate(one_worker(workers=8)) for s in envoy(f"{i:032x}", t, t + 0.3, start, end)]
    _, findings, report = report_for(timeline_of(spans))
    assert report.verdict.layer != QUEUE and not [f for f in findings if f.rule == "request-queueing"]


def stamped(n: int = 240, *, workers: int = 1, key: str = HTTP_REQUEST_HEADER_X_REQUEST_START_PY) -> list[Span]:
    """The app's root spans, each with the stamp a proxy put on it when the request arrived."""
    return [s for i, (t, start, end) in enumerate(one_worker(n, workers=workers))
            for s in app(start, end, trace=f"{i:032x}", **{key: [f"t={T0_S + t / 1000:.6f}"]})]  # fmt: skip


def test_an_app_with_a_backlog_and_the_header_is_queue_measured_and_the_back_to_back_warning_goes() -> None:
    tl = timeline_of(stamped())
    [warning] = infer_queueing(tl).warnings  # the spans alone: queued, or a closed loop?
    assert "fixed concurrency of 1" in warning
    analysis, findings, report = report_for(tl)
    assert not [w for w in analysis.timeline.warnings if "fixed concurrency" in w]  # the stamps tell
    assert (report.verdict.layer, report.verdict.rule) == (QUEUE, "request-queueing"), report.verdict
    [finding] = [f for f in findings if f.rule == "request-queueing"]
    assert "inferred" not in finding.evidence and not finding.summary.startswith("Inferred")
    assert finding.evidence["request_start_read_from"] == [HTTP_REQUEST_HEADER_X_REQUEST_START_PY]
    assert list(finding.evidence["queue_sources"]) == ["header"]
    assert "request-start header" in finding.summary and HTTP_REQUEST_HEADER_X_REQUEST_START_PY in finding.summary
    assert finding.confidence > 0.6


def test_an_app_with_room_and_the_header_has_no_queue_verdict() -> None:
    _, findings, report = report_for(timeline_of(stamped(workers=8)))
    assert report.verdict.layer != QUEUE and not [f for f in findings if f.rule == "request-queueing"]


def test_a_called_service_at_a_fixed_concurrency_stays_a_downstream_inference() -> None:
    """An app-to-app call is not ingress: infer_queueing's conditions hold, and its reading stands."""
    spans = [s for i, (t, start, end) in enumerate(one_worker(service_ms=100))
             for s in gateway(f"{i:032x}", t, t + 0.3, start, end + 2)]  # fmt: skip
    analysis, findings, report = report_for(timeline_of(spans))
    assert {s.attrs[QUEUE_SOURCE] for s in queues(analysis.timeline)} == {QUEUE_SOURCE_DOWNSTREAM}
    [finding] = [f for f in findings if f.rule == "request-queueing"]
    assert "proxies" not in finding.evidence and finding.evidence["services_at_fixed_concurrency"] == ["app (1 at a time)"]


def test_a_measured_header_queue_is_not_made_an_inference_by_a_few_inferred_segments_elsewhere() -> None:
    """Most queue time from the header; a few requests also waited in front of a called service (inferred)."""
    requests = []
    for i in range(200):
        t, wait = i * 100.0, 400.0 + i if i % 20 == 19 else 2.0
        segs = [seg(QUEUE, t, t + wait, **{QUEUE_SOURCE: "header", QUEUE_READ_FROM: HTTP_REQUEST_HEADER_X_REQUEST_START})]
        if i % 40 == 7:
            segs.append(seg(QUEUE, t + wait + 10, t + wait + 12, **{QUEUE_SOURCE: QUEUE_SOURCE_DOWNSTREAM, INFERRED: True,
                                                                      INFERRED_CONCURRENCY: 1}))  # fmt: skip
        requests.append(req(t, t + wait + 50, *segs))
    [finding] = RequestQueueing().check(analysed(requests))
    assert "inferred" not in finding.evidence and not finding.summary.startswith("Inferred") and finding.confidence > 0.6
    assert finding.evidence["queue_sources"] == {"header": 200, "downstream": 5}


# --- from a file, as `latprof analyze` reads it ------------------------------------------------------------


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, list):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    if isinstance(value, int):
        return {"intValue": str(value)}
    return {"stringValue": str(value)}


def test_an_otlp_file_with_the_header_as_a_string_array_gives_a_measured_queue_verdict(tmp_path: Path) -> None:
    """OTLP JSON as the Collector's file exporter writes it: the header attribute an `arrayValue`."""
    spans = stamped()
    lines = []
    for s in spans:
        doc = {"traceId": s.trace_id, "spanId": s.span_id, "name": s.name, "kind": s.kind,
               "startTimeUnixNano": str(s.start_ns), "endTimeUnixNano": str(s.end_ns),
               "attributes": [{"key": k, "value": _value(v)} for k, v in s.attrs.items()], "status": {}}  # fmt: skip
        if s.parent_id:
            doc["parentSpanId"] = s.parent_id
        lines.append({"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": _value("app")}]},
                                         "scopeSpans": [{"scope": {"name": s.scope}, "spans": [doc]}]}]})  # fmt: skip
    path = tmp_path / "traces.otlp.jsonl"
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    report = run_diagnosis([path], warmup_s=0).report
    assert (report.verdict.layer, report.verdict.rule) == (QUEUE, "request-queueing"), report.verdict
    [finding] = [f for f in report.findings if f.rule == "request-queueing"]
    assert json.loads(json.dumps(finding.evidence))["request_start_read_from"] == [HTTP_REQUEST_HEADER_X_REQUEST_START_PY]
