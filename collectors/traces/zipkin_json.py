"""Read Zipkin v2 JSON traces (the Zipkin API's responses, what Zipkin exporters send) into `Span`s.

Accepted, told apart by content and never by file name:

- a JSON array of spans (`/api/v2/trace/{id}`, an exporter's POST body to `/api/v2/spans`);
- a JSON array of arrays of spans, one per trace (`/api/v2/traces`);
- one document (compact or pretty-printed), or JSON Lines of such arrays;
- any of those gzip-compressed (told by the magic bytes).

Field meanings follow Zipkin's v2 API (zipkin-api `zipkin2-api.yaml`): hex ids (a 64-bit trace id
has 16 digits; shorter ids are left-padded, as Zipkin pads them), `timestamp` and `duration` in
microseconds, `kind` absent for a local (internal) span, string-valued `tags`. The OpenTelemetry
to Zipkin mapping is read back: `otel.status_code` and `error` tags to the status,
`otel.scope.name` (or the deprecated `otel.library.name`) to the scope, the remote endpoint of
a client or producer span to `server.address` / `server.port` / `peer.service`, annotations to
events (with the attributes of the encodings OpenTelemetry's exporters write), and the numeric
attributes latprof reads (status codes, ports, token counts) from their text back to numbers.
Damage costs as little as it can: a span that cannot be read is skipped and a tag or annotation
that cannot be read is dropped, each counted into one warning per reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import orjson

from latprof.capture.files import gc_paused
from latprof.collectors.traces._tracefile import first_keys as _first_keys, has_key as _has_key, hex_id as _hex_id, json_type as _json_type, micros_ns as _micros_ns
from latprof.collectors.traces._tracefile import SHARED_MAX as _SHARED_MAX, ReaderState, TraceRead
from latprof.collectors.traces._tracefile import FLOAT_ATTRIBUTES as _FLOAT_TAGS, INT_ATTRIBUTES as _INT_TAGS, number_attribute as _number_tag
from latprof.collectors.traces._tracefile import ZERO_SPAN_ID as _ZERO_SPAN_ID, ZERO_TRACE_ID as _ZERO_TRACE_ID, sniff_text as _sniff_text
from latprof.errors import InputError
from latprof.events import NO_ATTRS
from latprof.collectors.traces.spans import (
    KIND_CLIENT,
    KIND_INTERNAL,
    KIND_NAMES,
    KIND_PRODUCER,
    KIND_UNSPECIFIED,
    STATUS_UNSET,
    Span,
    SpanEvent,
)

#: How far into a file `sniff` looks for the keys of a span.
_SNIFF_KEY_WINDOW = 4096
_DIGIT_CHARS = tuple("0123456789")


@dataclass
class ZipkinRead(TraceRead):
    """The spans of one Zipkin JSON file, and what was skipped to read them (`documents`: span lists
    read, each trace of an array of traces; a flat array of spans is one)."""


def sniff(head: bytes) -> bool:
    """True when `head` (the first up to 64 KiB of a file, decompressed) looks like Zipkin v2 JSON spans.

    That is: after optional whitespace (and a UTF-8 byte order mark) a JSON array of objects, or
    of arrays of objects, whose first few KiB hold the keys `"traceId"` and `"id"`, and neither
    OTLP's `"resourceSpans"` / `"spanId"` nor Jaeger's `"traceID"` with `"spans"` / `"processes"`
    as keys. No parse: a latprof capture (`{"type": "header", ...`), OTLP JSON and Jaeger JSON
    are False.
    """
    text = _sniff_text(head)
    if not text.startswith(b"["):
        return False
    inner = text[1:].lstrip()
    if inner.startswith(b"["):
        inner = inner[1:].lstrip()
    if not inner.startswith(b"{"):
        return False
    window = text[:_SNIFF_KEY_WINDOW]
    if _has_key(window, b'"resourceSpans"') or _has_key(window, b'"resource_spans"') or _has_key(window, b'"spanId"'):
        return False  # OTLP JSON (requests, or bare spans)
    if _has_key(window, b'"traceID"') and (_has_key(window, b'"spans"') or _has_key(window, b'"processes"')):
        return False  # Jaeger traces
    return _has_key(window, b'"traceId"') and _has_key(window, b'"id"')


def read_zipkin_json(path: str | os.PathLike[str]) -> ZipkinRead:
    """Read the Zipkin v2 JSON spans in `path` (plain or gzip) into spans, in file order.

    Raises `InputError` (one line, naming the file, and the line where one applies) for a
    missing or unreadable file, an empty one, one that is not Zipkin JSON, a document that is
    truncated, a line of JSON Lines that is not valid JSON before the last, or a file holding no
    readable span. The cyclic garbage collector is paused while the spans are built.
    """
    reader = _Reader(os.fspath(path))
    with gc_paused():
        reader.read()
    return reader.result()


def _annotation(value: str) -> tuple[str, Mapping[str, Any]]:
    """An annotation's value as an event's name and attributes.

    OpenTelemetry's Python exporter writes an event with attributes as `{"name": {attributes}}`
    (JSON), the Collector's as `name|{attributes}|dropped count`; any other value is the name.
    """
    if value.startswith("{") and value.endswith("}"):
        try:
            doc = orjson.loads(value)
        except orjson.JSONDecodeError:
            doc = None
        if type(doc) is dict and len(doc) == 1:
            ((name, attrs),) = doc.items()
            if type(attrs) is dict:
                return name, attrs or NO_ATTRS
    elif value.endswith(_DIGIT_CHARS) and "|{" in value:
        head, _, dropped = value.rpartition("|")
        name, _, body = head.partition("|{")
        if body.endswith("}") and dropped.isascii() and dropped.isdigit():
            try:
                attrs = orjson.loads("{" + body)
            except orjson.JSONDecodeError:
                attrs = None
            if type(attrs) is dict:
                return name, attrs or NO_ATTRS
    return value, NO_ATTRS


class _Reader(ReaderState):
    """The state of reading one file: spans so far, shared objects, and counts of what was skipped."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        #: Service name to the resource mapping all its spans share.
        self.resources: dict[str, Mapping[str, Any]] = {}
        #: The span ids kept, by trace id, to keep only the first of a repeated id.
        self.seen: dict[str, set[str]] = {}
        self.repeated = 0
        self.repeated_shared = 0

    # --- files ----------------------------------------------------------------------------

    def read(self) -> None:
        docs = self.read_values("Zipkin JSON spans")
        self._check_first(docs[0][1])
        for _, doc in docs:
            self._take(doc)
        if len(self.shared) > _SHARED_MAX:
            self.shared.clear()

    def _check_first(self, doc: Any) -> None:
        """Raise unless the file's first JSON value is an array of spans or of traces."""
        if type(doc) is list:
            first: Any = doc[0] if doc else None
            if type(first) is list:
                first = first[0] if first else None
            if first is None or (type(first) is dict and ("traceId" in first or "id" in first)):
                return  # an empty array (or trace): no spans, said at the end
            if type(first) is dict:
                keys = _first_keys(first)
                described = f"its keys: {keys}" if keys else "it is empty"
                reason = f"its first array element is not a span (no traceId or id; {described})"
            else:
                reason = f"its first array element is a JSON {_json_type(first)}, not a span object"
        elif type(doc) is dict:
            keys = _first_keys(doc)
            reason = f"it is a JSON object ({f'its keys: {keys}' if keys else 'empty'}), not an array of spans"
        else:
            reason = f"it starts with a JSON {_json_type(doc)}, not an array of spans"
        raise InputError(f"{self.path}: not Zipkin JSON spans: {reason}")

    # --- documents -----------------------------------------------------------------------

    def _take(self, doc: Any) -> None:
        """Read one JSON value: an array of spans, or of arrays of spans (traces)."""
        if type(doc) is not list:
            self._skip("JSON value(s) that are not arrays of spans or of traces")
            return
        loose: list[Any] = []
        for item in doc:
            if type(item) is list:
                self.documents += 1
                self._spans(item)
            else:
                loose.append(item)
        if loose or not doc:
            self.documents += 1
            self._spans(loose)

    def _resource(self, service: str) -> Mapping[str, Any]:
        resource = self.resources.get(service)
        if resource is None:
            resource = self.resources[service] = {"service.name": service} if service else NO_ATTRS
        return resource

    def _spans(self, spans: list[Any]) -> None:
        """Read a list of span objects."""
        out_append = self.spans.append
        new_tuple = tuple.__new__
        trace_ids = self.trace_ids
        shared = self.shared
        seen = self.seen
        skip = self._skip
        for sp in spans:
            if type(sp) is not dict:
                skip("span(s) that are not objects")
                continue
            raw_trace_id: Any = sp.get("traceId")
            trace_id = trace_ids.get(raw_trace_id) if type(raw_trace_id) is str else None
            if trace_id is None:
                trace_id = _hex_id(raw_trace_id, 32)
                if trace_id is None or trace_id == _ZERO_TRACE_ID:
                    skip("span(s) without a valid traceId")
                    continue
                trace_id = self._remember_trace_id(raw_trace_id, trace_id)
            span_id = _hex_id(sp.get("id"), 16)
            if span_id is None or span_id == _ZERO_SPAN_ID:
                skip("span(s) without a valid id")
                continue
            raw_parent = sp.get("parentId")
            parent_id: str | None = None
            if raw_parent is not None and raw_parent != "":
                parent_id = _hex_id(raw_parent, 16)
                if parent_id is None:
                    skip("span(s) with an invalid parentId")
                    continue
                if parent_id == _ZERO_SPAN_ID:
                    parent_id = None
            start = _micros_ns(sp.get("timestamp"))
            if start is None or start <= 0:
                skip("span(s) without a readable timestamp")
                continue
            raw_duration = sp.get("duration")
            if raw_duration is None:
                # Zipkin leaves out the duration of an incomplete span, and of one under a microsecond
                self._note("read {n} span(s) without a duration (incomplete, or under 1 us) as zero-length")
                duration = 0
            else:
                found = _micros_ns(raw_duration)
                if found is None:
                    skip("span(s) whose duration is not a number")
                    continue
                if found < 0:
                    skip("span(s) with a negative duration")
                    continue
                duration = found
            name = sp.get("name")
            if name is None:
                name = ""
            elif type(name) is not str:
                skip("span(s) whose name is not a string")
                continue
            raw_kind = sp.get("kind")
            if raw_kind is None:
                kind = KIND_INTERNAL
            elif type(raw_kind) is str:
                known_kind = KIND_NAMES.get(raw_kind.lower())
                if known_kind is None:
                    self._note("read {n} span(s) with an unknown kind as unspecified")
                    kind = KIND_UNSPECIFIED
                else:
                    kind = known_kind
            else:
                skip("span(s) whose kind is not a string")
                continue
            local = sp.get("localEndpoint")
            if local is None:
                service = ""
            elif type(local) is dict and type(local.get("serviceName", "")) is str:
                service = local.get("serviceName") or ""
            else:
                skip("span(s) whose localEndpoint is not an object with a string serviceName")
                continue
            remote = sp.get("remoteEndpoint")
            if remote is not None and type(remote) is not dict:
                skip("span(s) whose remoteEndpoint is not an object")
                continue
            tags = sp.get("tags")
            if tags is None:
                attrs: dict[str, Any] = {}
            elif type(tags) is dict:
                attrs = self._tags(tags)
            else:
                skip("span(s) whose tags is not an object")
                continue
            annotations = sp.get("annotations")
            if annotations is None:
                events: tuple[SpanEvent, ...] = ()
            elif type(annotations) is list:
                events = self._events(annotations)
            else:
                skip("span(s) whose annotations is not a list")
                continue
            kept = seen.get(trace_id)
            if kept is None:
                seen[trace_id] = {span_id}
            elif span_id in kept:
                self.repeated += 1
                if sp.get("shared") is True:
                    self.repeated_shared += 1
                continue
            else:
                kept.add(span_id)
            status_code = STATUS_UNSET
            scope = ""
            if attrs:
                # Zipkin's `error` tag marks an error whatever its value (the status description, often "").
                error = attrs.pop("error", None)
                status_code, scope = self._otel_status_scope(
                    attrs, error is not None and error is not False and not (type(error) is str and error.lower() == "false")
                )
            if remote and (kind == KIND_CLIENT or kind == KIND_PRODUCER):
                self._remote(remote, attrs)
            service = shared.setdefault(service, service)
            out_append(new_tuple(Span, (
                trace_id, span_id, parent_id, shared.setdefault(name, name), kind, start, start + duration,
                service, scope, attrs or NO_ATTRS, status_code, events, (), self._resource(service), 0,
            )))  # fmt: skip

    def _tags(self, tags: dict[str, Any]) -> dict[str, Any]:
        """A span's tags as attributes: text as is but for the numeric attributes; other JSON types kept when scalar."""
        shared = self.shared
        out: dict[str, Any] = {}
        for key, value in tags.items():
            if type(value) is str:
                if key in _INT_TAGS or key in _FLOAT_TAGS:
                    value = _number_tag(key, value)
                else:
                    value = shared.setdefault(value, value)
            elif type(value) is not int and type(value) is not float and type(value) is not bool:
                if value is not None:  # null: what the Python exporter writes for a scope without a version
                    self._note("dropped {n} tag(s) whose value is not a string, number or boolean")
                continue
            out[shared.setdefault(key, key)] = value
        return out

    def _events(self, annotations: list[Any]) -> tuple[SpanEvent, ...]:
        events = []
        shared = self.shared
        for annotation in annotations:
            ts = _micros_ns(annotation.get("timestamp")) if type(annotation) is dict else None
            value = annotation.get("value") if type(annotation) is dict else None
            if ts is None or ts <= 0 or type(value) is not str:
                self._note("dropped {n} annotation(s) without a readable timestamp and string value")
                continue
            name, attrs = _annotation(value)
            events.append(SpanEvent(shared.setdefault(name, name), ts, attrs))
        return tuple(events)

    def _remote(self, remote: dict[str, Any], attrs: dict[str, Any]) -> None:
        """A client or producer span's remote endpoint as the server it called, unless its tags say so already."""
        address = remote.get("ipv4") or remote.get("ipv6")
        if type(address) is str and "server.address" not in attrs:
            attrs["server.address"] = address
        port = remote.get("port")
        if type(port) is int and 0 < port < 65536 and "server.port" not in attrs:
            attrs["server.port"] = port
        peer = remote.get("serviceName")
        if type(peer) is str and peer and "peer.service" not in attrs:
            attrs["peer.service"] = peer

    # --- the result ----------------------------------------------------------------------

    def result(self) -> ZipkinRead:
        path = self.path
        warnings = self.warnings
        warnings.extend(self.skipped_lines(f"{path}: "))
        if self.repeated:
            shared = ""
            if self.repeated_shared:
                shared = f" ({self.repeated_shared} marked shared: a server span reusing its client's id, B3 style)"
            warnings.append(
                f"{path}: skipped {self.repeated} span(s) whose id repeats within their trace{shared}; kept the first of each"
            )
        warnings.extend(self.note_lines(f"{path}: "))
        if not self.spans:
            reasons = self.skipped_reasons()
            raise InputError(
                f"{path}: Zipkin JSON file holds no readable spans"
                + (f": skipped {reasons}" if reasons else f" ({self.documents} span list(s), none with spans)")
            )
        return ZipkinRead(self.spans, warnings, self.documents)
