"""The layer table for trace spans (latprof.collectors.traces.tracemap) on hand-built spans with known answers."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from typing import Any

from latprof.analysis.requests import layer_times_ms
from latprof.events import Request
from latprof.layers import DB_POOL, DB_QUERY, MODEL, PROVIDER, QUEUE, RETRY, TOOL, UNATTRIBUTED
from latprof.semconv import ERROR_TYPE, LLM_CALL_ID, SPAN_STATUS_ERROR, SPLIT_UNKNOWN, TTFT_KNOWN
from latprof.collectors.traces.spans import KIND_CLIENT, KIND_CONSUMER, KIND_INTERNAL, KIND_PRODUCER, KIND_SERVER, STATUS_ERROR, Span, SpanEvent, SpanLink
from latprof.analysis.inference import INFERRED
from latprof.analysis.span_inference import infer_from_spans
from latprof.analysis.timeline import RequestTimeline, Timeline, build_timeline
from latprof.capture.reader import CaptureData, read_captures
from latprof.collectors.traces.tracemap import ENDS_AT_NEXT_STEP, SQLALCHEMY_SCOPE, classify, map_spans, route_of, url_path

T0 = 1_790_000_000_000_000_000
_ids = itertools.count(1)
FASTAPI = "opentelemetry.instrumentation.fastapi"
HTTPX = "opentelemetry.instrumentation.httpx"


def ms(t: float) -> int:
    return T0 + int(t * 1_000_000)


def span(name: str, start: float, end: float, *, parent: Span | None = None, kind: int = KIND_INTERNAL, trace: str = "a" * 32,
         scope: str = "", service: str = "api", links: tuple[SpanLink, ...] = (), **attrs: Any) -> Span:  # fmt: skip
    return Span(trace, f"{next(_ids):016x}", parent.span_id if parent else None, name, kind, ms(start), ms(end), service,
                scope, attrs, links=links)  # fmt: skip


def server(start: float, end: float, **kw: Any) -> Span:
    return span("GET /chat", start, end, kind=KIND_SERVER, scope=FASTAPI,
                **{"http.route": "/chat", "http.request.method": "GET", "http.response.status_code": 200, **kw})  # fmt: skip


def http(url: str, start: float, end: float, parent: Span) -> Span:
    return span("POST", start, end, parent=parent, kind=KIND_CLIENT, scope=HTTPX, **{"http.request.method": "POST", "url.full": url})


def breakdown(spans: list[Span]) -> dict[str, float]:
    events = map_spans(spans)
    [request] = events.requests
    rt = RequestTimeline(request, tuple(events.segments_by_request.get(request.request_id, ())))
    return {k: round(v, 3) for k, v in layer_times_ms(rt).items()}


def test_a_stock_fastapi_sqlalchemy_trace_gets_pool_query_provider_and_unattributed_gaps():
    root = server(0, 1000)
    connect = span("connect", 5, 405, parent=root, kind=KIND_CLIENT, scope=SQLALCHEMY_SCOPE, **{"db.system.name": "postgresql"})
    select = span("SELECT test", 410, 430, parent=root, kind=KIND_CLIENT, scope=SQLALCHEMY_SCOPE, **{"db.system.name": "postgresql"})
    llm = http("http://127.0.0.1:9/v1/chat/completions?x=1", 430, 600, root)  # ends at the headers
    insert = span("INSERT test", 900, 950, parent=root, kind=KIND_CLIENT, **{"db.system": "postgresql"})
    noise = span("GET /chat http send", 990, 990, parent=root, **{"asgi.event.type": "http.response.start"})
    times = breakdown([root, connect, select, llm, insert, noise])
    # the LLM call runs on to the caller's next step (the INSERT at 900)
    assert times == {DB_POOL: 400.0, DB_QUERY: 70.0, PROVIDER: 470.0, UNATTRIBUTED: 60.0}
    events = map_spans([root, connect, select, llm, insert, noise])
    [request] = events.requests
    assert (request.request_id, request.route, request.status_code, request.cpu_ns) == ("a" * 32, "GET /chat", 200, None)
    by_name = {s.name: s for s in events.segments_by_request[request.request_id]}
    assert "GET /chat http send" not in by_name  # ASGI noise is dropped
    provider = by_name["POST"]
    assert provider.attrs[SPLIT_UNKNOWN] is True and provider.attrs[ENDS_AT_NEXT_STEP] is True
    assert provider.attrs[LLM_CALL_ID] == llm.span_id and provider.end_ns == ms(900)
    assert provider.parent_id is None  # hangs off the request root


def test_other_http_calls_are_tools_and_an_llm_path_is_matched_on_the_path_only():
    root = server(0, 300)
    tool = http("http://127.0.0.1:9/customers/chat/completions-report", 10, 110, root)
    llm_host_tool = http("http://llm.local/v1/search", 110, 200, root)  # the host says nothing
    assert classify(tool) == TOOL and classify(llm_host_tool) == TOOL
    assert breakdown([root, tool, llm_host_tool]) == {TOOL: 190.0, UNATTRIBUTED: 110.0}
    assert url_path({"url.full": "https://h:1/openai/deployments/x/chat/completions?api-version=1"}).endswith("/chat/completions")
    assert url_path({"http.target": "/v1/embeddings?x"}) == "/v1/embeddings"


def test_genai_spans_split_at_the_first_chunk_and_wrappers_own_nothing():
    root = server(0, 1000)
    agent = span("invoke_agent helper", 0, 1000, parent=root, **{"gen_ai.operation.name": "invoke_agent"})
    chat = span("chat gpt-x", 10, 510, parent=agent, kind=KIND_CLIENT,
                **{"gen_ai.operation.name": "chat", "gen_ai.response.time_to_first_chunk": 0.2, "gen_ai.request.model": "gpt-x"})  # fmt: skip
    inner_http = http("http://127.0.0.1:9/v1/chat/completions", 12, 300, chat)  # the SDK's own request
    tool = span("execute_tool lookup", 520, 700, parent=agent, **{"gen_ai.operation.name": "execute_tool"})
    unstreamed = span("chat gpt-x", 700, 990, parent=agent, kind=KIND_CLIENT, **{"gen_ai.operation.name": "chat"})
    times = breakdown([root, agent, chat, inner_http, tool, unstreamed])
    assert times == {PROVIDER: 200.0 + 290.0, MODEL: 300.0, TOOL: 180.0, UNATTRIBUTED: 30.0}
    segments = map_spans([root, agent, chat, inner_http, tool, unstreamed]).segments_by_request["a" * 32]
    [later] = [s for s in segments if s.start_ns == ms(700)]
    assert later.attrs[TTFT_KNOWN] is False  # no first-chunk time: the analysis estimates its decode
    [first] = [s for s in segments if s.start_ns == ms(10) and s.layer == PROVIDER]
    assert first.attrs[TTFT_KNOWN] is True  # measured: the provider-floor rule reads it
    [transport] = [s for s in segments if s.segment_id == inner_http.span_id]
    assert transport.layer is None


def test_a_message_queue_is_the_time_from_send_to_process_through_the_link():
    producer_root = server(0, 50)
    send = span("orders send", 10, 12, parent=producer_root, kind=KIND_PRODUCER, **{"messaging.operation.type": "send"})
    consumer = span("orders process", 400, 500, kind=KIND_CONSUMER, trace="b" * 32, links=(SpanLink("a" * 32, send.span_id),),
                    **{"messaging.operation.type": "process", "messaging.destination.name": "orders"})  # fmt: skip
    work = span("SELECT", 410, 490, parent=consumer, trace="b" * 32, kind=KIND_CLIENT, **{"db.system.name": "postgresql"})
    receive = span("orders receive", 300, 390, kind=KIND_CONSUMER, trace="c" * 32, **{"messaging.operation.type": "receive"})
    events = map_spans([producer_root, send, consumer, work, receive])
    by_id = {r.request_id: r for r in events.requests}
    processed = by_id["b" * 32]
    assert processed.start_ns == ms(10) and processed.end_ns == ms(500)  # it arrived when it was sent
    rt = RequestTimeline(processed, tuple(events.segments_by_request["b" * 32]))
    assert {k: round(v, 3) for k, v in layer_times_ms(rt).items()} == {QUEUE: 390.0, DB_QUERY: 80.0, UNATTRIBUTED: 20.0}
    assert "c" * 32 not in events.segments_by_request  # a receive span's polling is no queue


def test_spans_consumed_by_mapping_map_as_when_kept():
    """`read_captures` lets each trace's spans go once mapped (`consume`): the same requests and segments,
    messages whose send span is in a trace mapped before them included, and the list it was given emptied."""
    producer_root = server(0, 50)
    send = span("orders send", 10, 12, parent=producer_root, kind=KIND_PRODUCER, **{"messaging.operation.type": "send"})
    consumer = span("orders process", 400, 500, kind=KIND_CONSUMER, trace="b" * 32, links=(SpanLink("a" * 32, send.span_id),),
                    **{"messaging.operation.type": "process", "messaging.destination.name": "orders"})  # fmt: skip
    work = span("SELECT", 410, 490, parent=consumer, trace="b" * 32, kind=KIND_CLIENT, **{"db.system.name": "postgresql"})
    other = server(600, 700, trace="d" * 32)
    spans = [producer_root, send, other, consumer, work, span("x", 610, 620, parent=other, trace="d" * 32)]
    kept = map_spans(spans)
    given = list(spans)
    consumed = map_spans(given, consume=True)
    assert given == []
    assert consumed.requests == kept.requests and len(kept.requests) == 3
    assert consumed.segments_by_request == kept.segments_by_request and consumed.warnings == kept.warnings
    assert {r.request_id: r.start_ns for r in consumed.requests}["b" * 32] == ms(10)  # the queue from the send span


def test_routes_come_from_the_route_template_and_methods_of_either_convention():
    assert route_of(server(0, 1)) == "GET /chat"
    old = span("x", 0, 1, kind=KIND_SERVER, **{"http.route": "/items/{id}", "http.method": "PUT"})
    assert route_of(old) == "PUT /items/{id}"
    assert route_of(span("process job", 0, 1, kind=KIND_CONSUMER)) == "process job"


def test_broken_traces_are_mapped_with_warnings_not_errors():
    root = server(0, 100)
    orphan = span("SELECT", 10, 20, kind=KIND_CLIENT, **{"db.system.name": "postgresql"})
    orphan = orphan._replace(parent_id="f" * 16)  # its parent is not in the file
    a = span("a", 0, 10, trace="d" * 32)
    b = span("b", 0, 10, trace="d" * 32)
    a, b = a._replace(parent_id=b.span_id), b._replace(parent_id=a.span_id)  # a cycle
    dup = root._replace(name="again")
    other_service = span("GET /tool", -30, 80, parent=root, kind=KIND_SERVER, service="tools")  # 30 ms before its parent
    events = map_spans([root, orphan, a, b, dup, other_service])
    text = " | ".join(events.warnings)
    assert "1 span(s) name a parent that is not in the input" in text
    assert "2 span(s) in parent cycles" in text
    assert "1 span(s) recorded twice" in text
    assert "clock skew" in text and "tools under api" in text and "30.0 ms" in text
    ids = sorted(r.request_id for r in events.requests)
    assert ids == sorted([f"{'a' * 32}:{root.span_id}", f"{'a' * 32}:{orphan.span_id}"])


def test_requests_of_each_service_instance_get_their_own_pid():
    one = server(0, 10)._replace(resource={"service.instance.id": "i-1"})
    two = server(0, 10)._replace(trace_id="e" * 32, resource={"service.instance.id": "i-2"})
    three = server(20, 30)._replace(trace_id="9" * 32, resource={"service.instance.id": "i-1"})
    pids = {r.request_id[:1]: r.pid for r in map_spans([one, two, three]).requests}
    assert pids["a"] == pids["9"] != pids["e"]
    assert isinstance(map_spans([one]).requests[0], Request)


def test_the_instances_behind_the_pids_are_kept_with_their_service():
    one = server(0, 10)._replace(resource={"service.instance.id": "i-1", "host.name": "h"})
    call = span("SELECT", 1, 2, parent=one, kind=KIND_CLIENT, service="db-svc", **{"db.system.name": "postgresql"})
    events = map_spans([one, call])
    [segment] = events.segments_by_request["a" * 32]
    assert events.instances[events.requests[0].pid] == {"service.name": "api", "service.instance.id": "i-1", "host.name": "h"}
    assert events.instances[segment.pid] == {"service.name": "db-svc"}


def test_an_errored_span_says_so_with_its_exception_type_but_not_its_message():
    root = server(0, 300)
    failed = span("GET", 10, 50, parent=root, kind=KIND_CLIENT, **{"http.request.method": "GET", "url.full": "http://127.0.0.1:9/x"})
    failed = failed._replace(status_code=STATUS_ERROR, events=(SpanEvent("exception", ms(49), {"exception.type": "httpx.ReadTimeout", "exception.message": "secret"}),))
    typed = span("GET", 60, 90, parent=root, kind=KIND_CLIENT, **{"http.request.method": "GET", "error.type": "500"})._replace(status_code=STATUS_ERROR)
    fine = span("GET", 100, 120, parent=root, kind=KIND_CLIENT, **{"http.request.method": "GET"})
    events = map_spans([root, failed, typed, fine])
    by_id = {s.segment_id: s for s in events.segments_by_request[events.requests[0].request_id]}
    assert by_id[failed.span_id].attrs[SPAN_STATUS_ERROR] is True
    assert by_id[failed.span_id].attrs[ERROR_TYPE] == "httpx.ReadTimeout"
    assert "secret" not in repr(by_id[failed.span_id].attrs)
    assert by_id[typed.span_id].attrs[ERROR_TYPE] == "500"  # the instrumentation's own, kept
    assert SPAN_STATUS_ERROR not in by_id[fine.span_id].attrs


def _mapped_timeline(spans: list[Span]) -> Timeline:
    events = map_spans(spans)
    data = CaptureData(inputs=["traces.json"], headers=[{"source": "otlp"}], requests=events.requests,
                       segments_by_request=events.segments_by_request, span_facts=events.facts)  # fmt: skip
    return build_timeline(data)


def _faulty_traces() -> tuple[list[Span], dict[str, str]]:
    """Spans of requests with calls that failed in each way `SpanFacts` knows, healthy ones, and a backend running one
    request at a time behind client spans; with the trace id of each kind."""
    spans: list[Span] = []
    traces: dict[str, str] = {}

    def root(kind: str, at: float, n: int = 0) -> Span:
        trace = f"{len(traces) + 1:032x}"
        traces[f"{kind}{n}" if n else kind] = trace
        r = server(at, at + 400, trace=trace)
        spans.append(r)
        return r

    def call(parent: Span, start: float, end: float, **attrs: Any) -> Span:
        c = span("GET /search", start, end, parent=parent, kind=KIND_CLIENT, trace=parent.trace_id,
                 **{"http.request.method": "GET", "server.address": "search.internal", **attrs})  # fmt: skip
        spans.append(c)
        return c

    r = root("tool_503", 0)
    call(r, 10, 20, **{"http.response.status_code": 503})
    call(r, 120, 130, **{"http.response.status_code": 200})  # the retry, after a 100 ms backoff
    r = root("llm_429", 5)
    spans.append(http("http://127.0.0.1:9/v1/chat/completions", 10, 15, r)._replace(trace_id=r.trace_id,
                      attrs={"http.request.method": "POST", "url.full": "http://127.0.0.1:9/v1/chat/completions",
                             "http.response.status_code": 429}))  # fmt: skip
    spans.append(http("http://127.0.0.1:9/v1/chat/completions", 300, 390, r)._replace(trace_id=r.trace_id))
    r = root("status_error", 8)
    call(r, 10, 20)._replace(status_code=STATUS_ERROR)
    spans[-1] = spans[-1]._replace(status_code=STATUS_ERROR)
    call(r, 60, 70)
    r = root("genai_error_type", 9)
    spans.append(span("chat gpt-4o", 10, 200, parent=r, kind=KIND_CLIENT, trace=r.trace_id,
                      **{"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "error.type": "RateLimitError"}))  # fmt: skip
    for n in range(3):
        r = root("healthy", 12 + n, n + 1)
        call(r, 20, 30)
        call(r, 40, 50)
    for n in range(5):  # a backend serving one request at a time: each of its server spans starts as the last ends
        r = root("downstream", 1000 + n, n + 1)
        c = call(r, 1001 + n, 1001 + 100 * (n + 1))
        spans.append(span("GET /search", 1001 + 100 * n, 1001 + 100 * (n + 1), parent=c, kind=KIND_SERVER, trace=r.trace_id,
                          service="search", **{"http.route": "/search", "http.request.method": "GET"}))  # fmt: skip
    return spans, traces


def test_mapping_notes_the_requests_with_a_call_that_may_have_failed_and_those_with_a_server_below_the_root():
    spans, traces = _faulty_traces()
    facts = map_spans(spans).facts
    assert facts.failed_calls == {traces[k] for k in ("tool_503", "llm_429", "status_error", "genai_error_type")}
    assert facts.downstream_servers == {traces[f"downstream{n}"] for n in range(1, 6)}


def test_the_trace_inferences_find_the_same_with_the_mapping_facts_as_by_reading_every_segment():
    timeline = _mapped_timeline(_faulty_traces()[0])
    assert timeline.span_facts is not None
    with_facts = infer_from_spans(timeline)
    without = infer_from_spans(dataclasses.replace(timeline, span_facts=None))
    assert [(rt.request, rt.segments) for rt in with_facts.requests] == [(rt.request, rt.segments) for rt in without.requests]
    assert with_facts.warnings == without.warnings
    inferred = Counter(s.layer for rt in with_facts.requests for s in rt.segments if s.attrs.get(INFERRED))
    assert inferred[RETRY] == 3 and inferred[QUEUE] >= 3, inferred  # both were found: the comparison is not of nothing


def test_a_capture_read_with_trace_files_gets_no_mapping_facts(tmp_path):
    capture = tmp_path / "run.jsonl"
    capture.write_text(
        '{"type": "header", "schema": "latprof.capture/1", "source": "run"}\n'
        '{"type": "request", "request_id": "r1", "route": "GET /x", "start_ns": 1, "end_ns": 2, "pid": 1}\n'
    )
    traces = tmp_path / "traces.json"
    traces.write_text(
        '{"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]},'
        ' "scopeSpans": [{"scope": {"name": "x"}, "spans": [{"traceId": "' + "a" * 32 + '", "spanId": "' + "b" * 16 + '",'
        ' "name": "GET /y", "kind": 2, "startTimeUnixNano": "5", "endTimeUnixNano": "9"}]}]}]}\n'
    )
    assert build_timeline(read_captures([traces])).span_facts is not None
    mixed = build_timeline(read_captures([capture, traces]))
    assert len(mixed.requests) == 2 and mixed.span_facts is None  # the capture's request was not mapped: no facts for it
