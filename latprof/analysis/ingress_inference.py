"""The queue in front of the app, from traces: a proxy's request-start header, or a proxy's span above the app's.

Stock spans start when the app's instrumentation starts on a request: time in the accept backlog,
waiting for a free worker, is before any span and invisible (`infer_queueing` can only warn that
spans ran back to back). Two things a trace may carry show it.

**The request-start header (measured).** A proxy stamps the time it received (or forwarded) the
request: nginx `proxy_set_header X-Request-Start "t=${msec}";`, Heroku's router, the New Relic and
Datadog conventions: `t=` (optional) then seconds, milliseconds or microseconds since the epoch,
told apart by magnitude (`parse_request_start`). A stock server instrumentation records it when told
to (`OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST=x-request-start`), as
`http.request.header.x-request-start` (`x_request_start` from the Python instrumentations): a list of
strings, read on the request's root span only (the app's own server span, the proxy untraced; a
traced proxy's root may carry one from a proxy further out), and no other header is read. The time
from the stamp to the span's start becomes a `queue` segment (`latprof.queue.source: header`) and
the request starts at the stamp, as `latprof run`'s hooks start it: latency is what the client
waited from the proxy on (report-v1: a request starts when it reached the server, time before its
handler is `queue`), and a segment before the request's start would be clipped away, leaving the
tail cohort blind to the very wait that made it. It is measured:
the proxy timed the request's arrival for this purpose, as it does for the queue-time metrics of APM
vendors, and `latprof run` reads the same header as measured. A stamp after the span's start (the
proxy's clock ahead of the app's) is read as no queue; one more than `MAX_QUEUE_NS` before it (a
wrong unit, a clock far behind) or one that names no time is ignored; warnings count both.

**A proxy's span above the app's (inferred).** When the request's root is a proxy's server span
(Envoy, nginx's OpenTelemetry modules, Traefik; its own `service.name`) and the app's server span
runs below it - under the proxy's client span (Envoy's upstream span, Traefik's `ReverseProxy`, an
httpx call of a proxy written in Python), or directly (nginx, one span per request) - the time from
that client span's start (else the root's) to the app's span's start is a `queue` segment
(`latprof.queue.source: proxy`), and the proxy's client span owns no layer (it is not a tool call:
the service behind it is the one diagnosed). The proxy is recognised by what its spans carry
(`proxy_evidence`): Envoy's `component: proxy` or `upstream_cluster`, Traefik's `entry_point` or
`traefik.*` names, the `nginx` scope; or by its shape: its spans do nothing but forward one request
to the app, with the same method and path. It is inferred, as `infer_queueing` reads a caller's
client span above a called server span: no span times the wait. Two spans of two processes (often
two hosts, two clocks) bound it, and what fills it - the connection to the app, the network hop, the
proxy's own queue for an upstream connection, the app's accept backlog, a worker to be free - is
read as queue because the parent only forwards. When `infer_queueing` already inferred the same
interval (the app at a fixed concurrency), its segment gives way to this one, which keeps its
numbers as corroboration.

**What they cannot tell.** Where in front of the app the request waited (backlog, busy workers, the
proxy's upstream pool, the hop); time inside the app's server before its instrumentation started
(an asyncio server whose loop was blocked - `event_loop`, not `queue` - looks the same: `latprof
run` tells them apart); clock skew between proxy and app, which adds to the queue or hides it. A
proxy that rewrites the path and carries no marks, a proxy deeper in the trace (a sidecar in front
of a called service: `infer_queueing`'s ground), and requests without a stamp or a traced proxy
show no queue.
"""

from __future__ import annotations

import dataclasses
import decimal
from typing import Any, Iterable, Mapping, Sequence

import orjson

from latprof.analysis.inference import INFERRED, INFERRED_CONCURRENCY, INFERRED_FROM, INFERRED_SERVICE, QUEUE_SOURCE_DOWNSTREAM
from latprof.analysis.timeline import RequestTimeline, Timeline
from latprof.collectors.traces.tracemap import PROXY_MARKS, SCOPE_NAME, SERVICE_NAME, SPAN_KIND, URL_PATH, url_path
from latprof.events import Segment
from latprof.layers import QUEUE
from latprof.semconv import (
    HTTP_REQUEST_HEADER_X_REQUEST_START,
    HTTP_REQUEST_HEADER_X_REQUEST_START_PY,
    HTTP_REQUEST_METHOD,
    QUEUE_SOURCE,
)

#: The request-start attributes read, in this order (semconv: the header's `-`, then the Python instrumentations' `_`).
REQUEST_START_ATTRIBUTES = (HTTP_REQUEST_HEADER_X_REQUEST_START, HTTP_REQUEST_HEADER_X_REQUEST_START_PY)
#: A queue longer than this is not believed (a wrong unit, or the proxy's clock far behind the app's):
#: proxies give up on an upstream long before (nginx's `proxy_read_timeout` 60 s, Heroku's router 30 s),
#: and `latprof run`'s hooks ignore X-Request-Start values older than the same 10 minutes.
MAX_QUEUE_NS = 600 * 1_000_000_000
#: A stamp later than the span's start by more than this is worth a clock-skew warning; less is
#: rounding between two clocks that NTP keeps within a millisecond or so.
SKEW_WARNING_NS = 1_000_000
#: An X-Request-Start number below the first bound counts seconds since the epoch (1e11 s is the year
#: 5138), below the second milliseconds, below the third microseconds, else nanoseconds: (bound, ns per unit).
_UNITS = tuple((decimal.Decimal(bound), per_unit) for bound, per_unit in ((10**11, 10**9), (10**14, 10**6), (10**17, 10**3)))
#: Nanoseconds since the epoch stay below this until the year 2286: a larger number names no time.
_NS_BOUND = decimal.Decimal(10**19)

QUEUE_SOURCE_HEADER = "header"
QUEUE_SOURCE_PROXY = "proxy"
#: str on a `queue` segment from the header: the span attribute its start was read from.
QUEUE_READ_FROM = "latprof.queue.read_from"
#: str on a `queue` segment from a proxy's span: the proxy's service and what recognised it.
QUEUE_PROXY = "latprof.queue.proxy"
#: bool on a proxy's client span this module took the layer from: it forwarded the request to the app.
FORWARDED_TO_APP = "latprof.ingress.forwarded"
HEADER_QUEUE = "queue before the server (X-Request-Start)"  # the name `latprof run`'s hooks give it
PROXY_QUEUE = "queue between the proxy and the app (inferred)"
SOURCE_PROXY = "the time from a proxy's span to the start of the app's server span below it"
#: What recognises a proxy's span by its attributes (`proxy_evidence`).
_COMPONENT, _UPSTREAM_CLUSTER, _ENTRY_POINT = PROXY_MARKS
_TRAEFIK_NAMES = (_ENTRY_POINT, "traefik.router.name", "traefik.service.name")
_NGINX_SCOPE = "nginx"


def parse_request_start(value: Any) -> int | None:
    """The wall-clock ns an X-Request-Start value names, or None when it names no time.

    `value` as a trace holds it: a list of strings (the attribute), one string (a header, or a
    list the Jaeger and Zipkin mappings wrote as JSON), or a number. Each value is `t=` (optional)
    then a positive number whose magnitude gives its unit (`_UNITS`); of several, the earliest (the
    outermost proxy's stamp)."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    if isinstance(value, (list, tuple)):
        found = [t for t in (parse_request_start(v) for v in value) if t is not None]
        return min(found) if found else None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    times = [t for t in (_one_time(part) for part in str(value).split(",")) if t is not None]
    return min(times) if times else None


def _one_time(text: str) -> int | None:
    """One `t=<number>` (or bare number) in epoch s, ms, µs or ns, as ns; None when it is not one.

    Read as a decimal, not a float: a float of epoch seconds is off by up to ~200 ns once scaled."""
    text = text.strip()
    if text[:2].lower() == "t=":
        text = text[2:].strip()
    try:
        number = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return None
    if not number.is_finite() or number <= 0:
        return None
    for bound, ns_per_unit in _UNITS:
        if number < bound:
            return int(number * ns_per_unit)
    return int(number) if number < _NS_BOUND else None


def request_start_of(attrs: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(attribute, value) of the request-start header a request's root recorded, or None."""
    for key in REQUEST_START_ATTRIBUTES:
        value = attrs.get(key)
        if value is not None:
            return key, value
    return None


def proxy_evidence(root_attrs: Mapping[str, Any], proxy_segments: Iterable[Segment]) -> str | None:
    """What says a request's root span is a proxy's, in words (`envoy: component=proxy`), or None.

    Envoy puts `component: proxy` (and `upstream_cluster` on upstream spans) on its spans, Traefik
    `entry_point` on its EntryPoint span and `traefik.router.name` / `traefik.service.name` on its
    Router and Service spans; nginx's modules carry no such attribute, only their scope `nginx`.
    Old OpenTracing instrumentations also set `component` (`http`, `grpc`): only `proxy` counts."""
    for attrs in (root_attrs, *(s.attrs for s in proxy_segments)):
        if attrs.get(_COMPONENT) == "proxy":
            return "envoy: component=proxy"
        if _UPSTREAM_CLUSTER in attrs:
            return f"envoy: {_UPSTREAM_CLUSTER}"
        for name in _TRAEFIK_NAMES:
            if name in attrs:
                return f"traefik: {name}"
    if root_attrs.get(SCOPE_NAME) == _NGINX_SCOPE:
        return "nginx: scope nginx"
    return None


def _method(attrs: Mapping[str, Any]) -> Any:
    return attrs.get(HTTP_REQUEST_METHOD) or attrs.get("http.method")


@dataclasses.dataclass(frozen=True)
class ProxyHop:
    """A request forwarded by a proxy (the request's root) to the app's server span below it."""

    app: Segment
    #: The proxy's client span the request was forwarded through; None when the root's span did it itself.
    forward: Segment | None
    #: The proxy's layered segments above the app's span (the client span and any other), which lose their layer.
    relayered: tuple[Segment, ...]
    #: What recognised the proxy (`proxy_evidence`, or the shape).
    evidence: str


def proxy_hop(rt: RequestTimeline) -> ProxyHop | None:
    """The app's server span below a proxy at the request's root, or None (module docstring).

    The app's span is the only server span of another instance whose ancestors are all the
    proxy's. The proxy is recognised by its marks (`proxy_evidence`), or else by its shape: every
    span of the proxy outside the app's is an ancestor of it (it did nothing but forward), and the
    root and the app's span carry the same method and path. Its client span is the app span's
    nearest ancestor with a layer (`tool` as the tracemap mapped it)."""
    request = rt.request
    root_attrs = request.attrs
    if SCOPE_NAME not in root_attrs:  # the tracemap keeps it only for a server root with a server span below
        return None
    by_id = {s.segment_id: s for s in rt.segments}
    proxy_pid = request.pid

    def ancestors(segment: Segment) -> list[Segment] | None:
        """Its ancestors up to the root, when all are the proxy's; else None."""
        out: list[Segment] = []
        parent = segment.parent_id
        while parent is not None and len(out) < 64:
            above = by_id.get(parent)
            if above is None or above.pid != proxy_pid:
                return None
            out.append(above)
            parent = above.parent_id
        return out

    apps: list[tuple[Segment, list[Segment]]] = []
    for s in rt.segments:
        if s.layer is None and s.pid != proxy_pid and s.attrs.get(SPAN_KIND) == "server":
            chain = ancestors(s)
            if chain is not None:
                apps.append((s, chain))
    if len(apps) != 1:  # none, or a fan-out / retried attempts: not one request handed on
        return None
    app, chain = apps[0]
    layered = tuple(s for s in chain if s.layer is not None)
    evidence = proxy_evidence(root_attrs, chain)
    if evidence is None and _forwards_only(rt, app, chain, by_id) and _same_request(root_attrs, app.attrs):
        evidence = "its spans only forward the request, same method and path"
    if evidence is None:
        return None
    return ProxyHop(app, layered[0] if layered else None, layered, evidence)


def _forwards_only(rt: RequestTimeline, app: Segment, chain: Sequence[Segment], by_id: Mapping[str, Segment]) -> bool:
    """True when the proxy's only spans outside the app's are the app's ancestors (`by_id`: the request's segments by id)."""
    on_path = {s.segment_id for s in chain}
    inside = {app.segment_id}
    for s in rt.segments:
        if s.pid != rt.request.pid or s.segment_id in on_path:
            continue
        # the app's own calls back through the proxy's instance (its egress) are the app's
        parent, hops = s.parent_id, 0
        while parent is not None and parent not in inside and hops < 64:
            parent = by_id[parent].parent_id if parent in by_id else None
            hops += 1
        if parent is None:
            return False
    return True


def _same_request(root_attrs: Mapping[str, Any], app_attrs: Mapping[str, Any]) -> bool:
    """True when the proxy's request and the app's carry the same method and path."""
    method, path = _method(root_attrs), root_attrs.get(URL_PATH)
    return bool(method) and bool(path) and method == _method(app_attrs) and path == url_path(app_attrs)


@dataclasses.dataclass
class _Notes:
    """What the header readings could not use, for the warnings."""

    unreadable: int = 0
    implausible: int = 0
    ahead: int = 0
    ahead_max_ns: int = 0
    #: Requests with a usable header, by service.
    measured: dict[str, int] = dataclasses.field(default_factory=dict)
    requests: dict[str, int] = dataclasses.field(default_factory=dict)

    def warnings(self) -> list[str]:
        out = []
        if self.unreadable:
            out.append(f"{self.unreadable} request(s) carried an X-Request-Start that names no time: ignored")
        if self.implausible:
            out.append(
                f"{self.implausible} request(s) carried an X-Request-Start more than {MAX_QUEUE_NS // 60_000_000_000} minutes"
                " before their server span started (a wrong unit, or the proxy's clock behind the app's): ignored"
            )
        if self.ahead:
            out.append(
                f"{self.ahead} request(s) carried an X-Request-Start after their server span started, by up to"
                f" {self.ahead_max_ns / 1e6:.1f} ms (the proxy's clock ahead of the app's?): read as no queue"
            )
        return out


def _header_queue(rt: RequestTimeline, notes: _Notes) -> tuple[Segment | None, int] | None:
    """(queue segment or None, the stamp) from the root's request-start header; None without a usable one."""
    found = request_start_of(rt.request.attrs)
    if found is None:
        return None
    key, value = found
    stamp = parse_request_start(value)
    start = rt.request.start_ns
    if stamp is None:
        notes.unreadable += 1
        return None
    if start - stamp > MAX_QUEUE_NS:
        notes.implausible += 1
        return None
    if stamp >= start:
        if stamp - start > SKEW_WARNING_NS:
            notes.ahead += 1
            notes.ahead_max_ns = max(notes.ahead_max_ns, stamp - start)
        return None, start
    attrs = {QUEUE_SOURCE: QUEUE_SOURCE_HEADER, QUEUE_READ_FROM: key}
    request = rt.request
    return Segment(request.request_id, f"{request.request_id}.header_queue", None, HEADER_QUEUE, QUEUE, stamp, start,
                   request.pid, attrs), stamp  # fmt: skip


def _proxy_queue(rt: RequestTimeline, hop: ProxyHop) -> tuple[Segment, ...]:
    """The request's segments with the proxy's client span layer-less and the queue in front of the app
    added (in place of `infer_queueing`'s for the same span, whose numbers it keeps)."""
    app = hop.app
    start = hop.forward.start_ns if hop.forward is not None else rt.request.start_ns
    downstream_id = f"{app.segment_id}.queue"
    attrs: dict[str, Any] = {INFERRED: True, INFERRED_FROM: SOURCE_PROXY, QUEUE_SOURCE: QUEUE_SOURCE_PROXY,
                             QUEUE_PROXY: f"{rt.request.attrs.get(SERVICE_NAME) or 'a proxy'} ({hop.evidence})"}  # fmt: skip
    relayered = {s.segment_id for s in hop.relayered}
    kept: list[Segment] = []
    for s in rt.segments:
        if s.segment_id == downstream_id and s.layer == QUEUE and s.attrs.get(QUEUE_SOURCE) == QUEUE_SOURCE_DOWNSTREAM:
            attrs[INFERRED_CONCURRENCY] = s.attrs.get(INFERRED_CONCURRENCY)
            attrs[INFERRED_SERVICE] = s.attrs.get(INFERRED_SERVICE)
        elif s.segment_id in relayered:
            kept.append(s._replace(layer=None, attrs={**s.attrs, FORWARDED_TO_APP: True}))
        else:
            kept.append(s)
    if 0 < app.start_ns - start <= MAX_QUEUE_NS:
        parent = hop.forward.segment_id if hop.forward is not None else None
        kept.append(Segment(rt.request.request_id, f"{app.segment_id}.ingress_queue", parent, PROXY_QUEUE, QUEUE, start,
                            app.start_ns, app.pid, attrs))  # fmt: skip
    return tuple(kept)


def infer_ingress_queue(timeline: Timeline) -> Timeline:
    """The timeline with the queue in front of the app each request's trace shows (module docstring):
    from a proxy's span above the app's server span, and from the request-start header on the root
    span (the request then starts at the stamp); the same timeline when no request shows one.

    Runs after `infer_queueing`: the segment it inferred for an app span below a proxy is replaced,
    and its warning that a service's root spans ran back to back is dropped for a service whose
    requests' stamps show what the spans could not (whether they queued before them)."""
    notes = _Notes()
    changed: dict[int, RequestTimeline] = {}
    for i, rt in enumerate(timeline.requests):
        attrs = rt.request.attrs
        service = str(attrs.get(SERVICE_NAME) or "")
        notes.requests[service] = notes.requests.get(service, 0) + 1
        if SCOPE_NAME not in attrs and REQUEST_START_ATTRIBUTES[0] not in attrs and REQUEST_START_ATTRIBUTES[1] not in attrs:
            continue
        request, segments = rt.request, rt.segments
        hop = proxy_hop(rt)
        if hop is not None:
            segments = _proxy_queue(rt, hop)
        header = _header_queue(rt, notes)
        if header is not None:
            queue, stamp = header
            notes.measured[service] = notes.measured.get(service, 0) + 1
            if queue is not None:
                request, segments = request._replace(start_ns=stamp), segments + (queue,)
        if request is not rt.request or segments is not rt.segments:
            changed[i] = RequestTimeline(request, segments)
    warnings = notes.warnings()
    if not changed and not warnings:
        return timeline
    requests = [changed.get(i, rt) for i, rt in enumerate(timeline.requests)]
    requests.sort(key=lambda rt: rt.request.start_ns)
    resolved = [s for s, n in notes.measured.items() if s and 2 * n >= notes.requests.get(s, 0)]
    kept = [w for w in timeline.warnings if not _resolved_by_header(w, resolved)]
    return dataclasses.replace(timeline, requests=requests, warnings=kept + warnings)


def _resolved_by_header(warning: str, services: Sequence[str]) -> bool:
    """True for `infer_queueing`'s warning that one of `services` ran at a fixed concurrency with its root
    spans back to back: queued in front, or a closed loop? The stamps of its requests tell."""
    return "ran at a fixed concurrency" in warning and any(warning.startswith(f"{s}: ") for s in services)
