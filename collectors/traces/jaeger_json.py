"""Read Jaeger JSON traces (the query API's `/api/traces` responses, the UI's downloads) into `Span`s.

Accepted, told apart by content and never by file name:

- the query API's envelope `{"data": [Trace, ...], "total", "limit", "offset", "errors"}`, which
  is also what the UI downloads;
- one bare Trace object `{"traceID", "spans", "processes", "warnings"}`, or a JSON array of them;
- one document (compact or pretty-printed), or JSON Lines of any of those (one per line, as a
  script appending API responses writes them);
- any of those gzip-compressed (told by the magic bytes).

Field meanings follow jaegertracing/jaeger `model/json/model.go`: hex ids (a 64-bit trace id has
16 digits, older servers wrote ids without their leading zeros: all are left-padded), times in
microseconds, typed tags `{"key", "type", "value"}`, the parent as the span's CHILD_OF reference
of the same trace (or the older `parentSpanID`), processes shared by `processID`. The tags the
OpenTelemetry-to-Jaeger mapping adds are read back into the span's own fields and dropped from
its attributes: `span.kind`, `otel.status_code` / `otel.status_description` / `error`,
`otel.scope.name` / `otel.scope.version` (and the deprecated `otel.library.*`). Damage costs as
little as it can: a span that cannot be read is skipped and a tag, log or reference that
cannot be read is dropped, each counted into one warning per reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import orjson

from latprof.capture.files import gc_paused
from latprof.collectors.traces._tracefile import first_keys as _first_keys, has_key as _has_key, hex_id as _hex_id, json_type as _json_type, micros_ns as _micros_ns
from latprof.collectors.traces._tracefile import DIGITS as _DIGITS, SHARED_MAX as _SHARED_MAX, ReaderState, TraceRead
from latprof.collectors.traces._tracefile import ZERO_SPAN_ID as _ZERO_SPAN_ID, ZERO_TRACE_ID as _ZERO_TRACE_ID, sniff_text as _sniff_text
from latprof.errors import InputError
from latprof.events import NO_ATTRS
from latprof.collectors.traces.spans import KIND_NAMES, KIND_UNSPECIFIED, STATUS_UNSET, Span, SpanEvent, SpanLink

#: How far into a file `sniff` looks for the keys of a trace.
_SNIFF_KEY_WINDOW = 4096
_CHILD_OF = "CHILD_OF"
_FOLLOWS_FROM = "FOLLOWS_FROM"


@dataclass
class JaegerRead(TraceRead):
    """The spans of one Jaeger JSON file, and what was skipped to read them (`documents`: trace objects read)."""


def sniff(head: bytes) -> bool:
    """True when `head` (the first up to 64 KiB of a file, decompressed) looks like Jaeger JSON traces.

    That is: after optional whitespace (and a UTF-8 byte order mark) a JSON object or array whose
    first few KiB hold the key `"traceID"` and the key `"spans"` or `"processes"` (a query
    response's first trace, a bare trace, an array of traces), and neither OTLP's
    `"resourceSpans"` nor Zipkin's `"traceId"` with `"id"` as keys. No parse: a latprof capture
    (`{"type": "header", ...`), OTLP JSON, Zipkin JSON, or a response with no trace in it is False.
    """
    text = _sniff_text(head)
    if not text.startswith((b"{", b"[")):
        return False
    window = text[:_SNIFF_KEY_WINDOW]
    if _first_key(window) == b"type":  # a latprof capture's header line
        return False
    if _has_key(window, b'"resourceSpans"') or _has_key(window, b'"resource_spans"'):
        return False  # OTLP JSON
    if _has_key(window, b'"traceId"') and _has_key(window, b'"id"'):
        return False  # Zipkin spans
    return _has_key(window, b'"traceID"') and (_has_key(window, b'"spans"') or _has_key(window, b'"processes"'))


def _first_key(text: bytes) -> bytes | None:
    """The first key of the object `text` starts with (no escapes), or None."""
    if not text.startswith(b"{"):
        return None
    rest = text[1:].lstrip()
    if not rest.startswith(b'"'):
        return None
    end = rest.find(b'"', 1)
    return rest[1:end] if end > 0 else None


def read_jaeger_json(path: str | os.PathLike[str]) -> JaegerRead:
    """Read the Jaeger JSON traces in `path` (plain or gzip) into spans, in file order.

    Raises `InputError` (one line, naming the file, and the line where one applies) for a
    missing or unreadable file, an empty one, one that is not Jaeger JSON, a document that is
    truncated, a line of JSON Lines that is not valid JSON before the last, or a file holding no
    readable span. The cyclic garbage collector is paused while the spans are built.
    """
    reader = _Reader(os.fspath(path))
    with gc_paused():
        reader.read()
    return reader.result()


def _int_text(value: str) -> int | None:
    """A decimal integer written as text ("-12"), else None (no spaces, underscores or signs but a leading minus)."""
    digits = value[1:] if value.startswith("-") else value
    if digits and digits.isascii() and _DIGITS.issuperset(digits):
        return int(value)
    return None


class _Unreadable(Exception):
    """A tag value that does not match its type (the tag is dropped)."""


def _typed_value(vtype: Any, value: Any) -> Any:
    """The Python value of a Jaeger tag `{"type": vtype, "value": value}`; raises `_Unreadable`."""
    t = type(value)
    if vtype == "string":
        if t is str:
            return value
    elif vtype == "int64":
        if t is int:
            return value
        if t is str:
            number = _int_text(value)
            if number is not None:
                return number
        elif t is float and value.is_integer():
            return int(value)
    elif vtype == "float64":
        if t is float or t is int:
            return float(value)
        if t is str and value.isascii() and value == value.strip() and "_" not in value:
            try:
                return float(value)
            except ValueError:
                pass
    elif vtype == "bool":
        if t is bool:
            return value
        if t is str:
            low = value.lower()
            if low == "true":
                return True
            if low == "false":
                return False
    elif vtype == "binary":
        if t is str:
            return value  # kept as the base64 text Go's encoder writes for a []byte
    elif vtype is None:  # no type: what the JSON value is
        if t is str or t is bool or t is int or t is float:
            return value
    raise _Unreadable


class _Reader(ReaderState):
    """The state of reading one file: spans so far, shared objects, and counts of what was skipped."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        #: Messages of the query API's `errors`.
        self.api_errors: list[str] = []

    # --- files ----------------------------------------------------------------------------

    def read(self) -> None:
        docs = self.read_values("Jaeger JSON traces")
        self._check_first(docs[0][1])
        for _, doc in docs:
            self._take(doc, top=True)
        if len(self.shared) > _SHARED_MAX:
            self.shared.clear()

    def _check_first(self, doc: Any) -> None:
        """Raise unless the file's first JSON value is a query response, a trace or an array of traces."""
        if type(doc) is dict:
            if "data" in doc or "traceID" in doc or "spans" in doc:
                return
            keys = _first_keys(doc)
            reason = f"the first JSON object has no data, traceID or spans ({f'its keys: {keys}' if keys else 'it is empty'})"
        elif type(doc) is list:
            if not doc:
                return  # no traces: said at the end
            first = doc[0]
            if type(first) is dict and ("traceID" in first or "spans" in first):
                return
            if type(first) is dict:
                keys = _first_keys(first)
                reason = f"its first array element is not a trace (no traceID or spans; its keys: {keys})"
            else:
                reason = f"its first array element is a JSON {_json_type(first)}, not a trace object"
        else:
            reason = f"it starts with a JSON {_json_type(doc)}, not an object or array"
        raise InputError(f"{self.path}: not Jaeger JSON traces: {reason}")

    # --- documents -----------------------------------------------------------------------

    def _take(self, doc: Any, top: bool) -> None:
        """Read one JSON value: a query response, a trace, or (at the top) an array of traces."""
        if type(doc) is dict:
            if "data" in doc or "errors" in doc:
                self._api_errors(doc.get("errors"))
                data = doc.get("data")
                if data is None:
                    return
                if type(data) is list:
                    for trace in data:
                        self._trace(trace)
                else:
                    self._skip("response(s) whose data is not a list of traces")
            elif "spans" in doc or "traceID" in doc:
                self._trace(doc)
            else:
                self._skip("JSON object(s) that are neither a query response nor a trace")
        elif type(doc) is list and top:
            for trace in doc:
                self._trace(trace)
        else:
            self._skip("JSON value(s) that are neither a query response, a trace nor an array of traces")

    def _api_errors(self, errors: Any) -> None:
        if type(errors) is not list:
            return
        for error in errors:
            if type(error) is dict:
                code, msg = error.get("code"), error.get("msg")
                text = " ".join(str(part) for part in (code, msg) if part not in (None, ""))
            else:
                text = str(error)
            self.api_errors.append(" ".join(text.split())[:200] or "an error")

    def _tags(self, raw: Any) -> dict[str, Any] | None:
        """A flat dict of a Jaeger tag (or log field) list; None when `raw` is not a list. Bad entries are dropped, counted."""
        if not raw:
            return {} if raw is None or type(raw) is list else None
        if type(raw) is not list:
            return None
        shared = self.shared
        out: dict[str, Any] = {}
        for kv in raw:
            try:
                key = kv["key"]
                value = kv["value"]
                vtype = kv.get("type")
                t = type(value)
                if not ((vtype == "string" and t is str) or (vtype == "int64" and t is int) or (vtype == "bool" and t is bool)):
                    value = _typed_value(vtype, value)
            except (TypeError, KeyError, AttributeError):
                self._note("dropped {n} tag(s) that are not key/type/value objects")
                continue
            except _Unreadable:
                self._note("dropped {n} tag(s) whose value does not match its type")
                continue
            if type(key) is not str:
                self._note("dropped {n} tag(s) without a string key")
                continue
            if type(value) is str:
                value = shared.setdefault(value, value)
            out[shared.setdefault(key, key)] = value
        return out

    def _processes(self, raw: Any) -> dict[Any, tuple[str, Mapping[str, Any]]]:
        """A trace's processes by their id: (service name, resource), one resource mapping each."""
        if raw is None:
            return {}
        if type(raw) is not dict:
            self._note("read {n} trace(s) whose processes is not an object, with no services")
            return {}
        out: dict[Any, tuple[str, Mapping[str, Any]]] = {}
        for process_id, process in raw.items():
            resolved = self._process(process)
            if resolved is not None:
                out[process_id] = resolved
        return out

    def _process(self, process: Any) -> tuple[str, Mapping[str, Any]] | None:
        if type(process) is not dict:
            self._note("ignored {n} process(es) that are not objects")
            return None
        service = process.get("serviceName")
        if service is None:
            service = ""
        elif type(service) is not str:
            self._note("read {n} process(es) whose serviceName is not a string, with no service")
            service = ""
        tags = self._tags(process.get("tags"))
        if tags is None:
            self._note("ignored the tags of {n} process(es) whose tags is not a list")
            tags = {}
        service = self.shared.setdefault(service, service)
        if service:
            resource = {"service.name": service, **tags}
            resource["service.name"] = service
        else:
            resource = tags
        return service, resource or NO_ATTRS

    def _trace(self, trace: Any) -> None:
        """Read one Trace object's spans."""
        if type(trace) is not dict:
            self._skip("trace(s) that are not objects")
            return
        spans = trace.get("spans")
        if spans is None:
            spans = []
        elif type(spans) is not list:
            self._skip("trace(s) whose spans is not a list")
            return
        self.documents += 1
        processes = self._processes(trace.get("processes"))
        fallback_trace_id = trace.get("traceID")
        out_append = self.spans.append
        new_tuple = tuple.__new__
        trace_ids = self.trace_ids
        shared = self.shared
        tags_of = self._tags
        skip = self._skip
        embedded: dict[bytes, tuple[str, Mapping[str, Any]]] = {}
        for sp in spans:
            if type(sp) is not dict:
                skip("span(s) that are not objects")
                continue
            raw_trace_id: Any = sp.get("traceID", fallback_trace_id)
            trace_id = trace_ids.get(raw_trace_id) if type(raw_trace_id) is str else None
            if trace_id is None:
                trace_id = _hex_id(raw_trace_id, 32)
                if trace_id is None or trace_id == _ZERO_TRACE_ID:
                    skip("span(s) without a valid traceID")
                    continue
                trace_id = self._remember_trace_id(raw_trace_id, trace_id)
            span_id = _hex_id(sp.get("spanID"), 16)
            if span_id is None or span_id == _ZERO_SPAN_ID:
                skip("span(s) without a valid spanID")
                continue
            start = _micros_ns(sp.get("startTime"))
            duration = _micros_ns(sp.get("duration"))
            if start is None or duration is None or start <= 0:
                skip("span(s) without a readable startTime and duration")
                continue
            if duration < 0:
                skip("span(s) with a negative duration")
                continue
            name = sp.get("operationName")
            if name is None:
                name = ""
            elif type(name) is not str:
                skip("span(s) whose operationName is not a string")
                continue
            parent_id: str | None = None
            links: tuple[SpanLink, ...] = ()
            refs = sp.get("references")
            if refs:
                if type(refs) is not list:
                    skip("span(s) whose references is not a list")
                    continue
                ref = refs[0]
                if not (  # the usual: one CHILD_OF reference, to a span of the same trace
                    len(refs) == 1 and type(ref) is dict and ref.get("refType") == _CHILD_OF
                    and ref.get("traceID") == raw_trace_id
                    and (parent_id := _hex_id(ref.get("spanID"), 16)) is not None and parent_id != _ZERO_SPAN_ID
                ):  # fmt: skip
                    try:
                        parent_id, links = self._references(refs, trace_id)
                    except _Unreadable:
                        skip("span(s) with an invalid CHILD_OF reference or parentSpanID")
                        continue
            elif refs is not None and type(refs) is not list:
                skip("span(s) whose references is not a list")
                continue
            if parent_id is None:
                raw_parent = sp.get("parentSpanID")
                if raw_parent:  # absent or empty: a root
                    parent_id = _hex_id(raw_parent, 16)
                    if parent_id is None:
                        skip("span(s) with an invalid CHILD_OF reference or parentSpanID")
                        continue
                    if parent_id == _ZERO_SPAN_ID:
                        parent_id = None
            attrs = tags_of(sp.get("tags"))
            if attrs is None:
                skip("span(s) whose tags is not a list")
                continue
            logs = sp.get("logs")
            if logs:
                if type(logs) is not list:
                    skip("span(s) whose logs is not a list")
                    continue
                events = self._events(logs)
            elif logs is not None and type(logs) is not list:
                skip("span(s) whose logs is not a list")
                continue
            else:
                events = ()
            process_id = sp.get("processID")
            try:
                process = processes.get(process_id)
            except TypeError:  # an unhashable processID
                process = None
            if process is None:
                process = self._embedded_process(sp.get("process"), embedded)
            if process is None:
                self._note("read {n} span(s) whose processID names no process of their trace, with no service")
                service, resource = "", NO_ATTRS
            else:
                service, resource = process
            kind = KIND_UNSPECIFIED
            status_code = STATUS_UNSET
            scope = ""
            if attrs:
                kind, status_code, scope = self._otel_tags(attrs)
            out_append(new_tuple(Span, (
                trace_id, span_id, parent_id, shared.setdefault(name, name), kind, start, start + duration,
                service, scope, attrs or NO_ATTRS, status_code, events, links, resource, 0,
            )))  # fmt: skip

    def _embedded_process(
        self, raw: Any, cache: dict[bytes, tuple[str, Mapping[str, Any]]]
    ) -> tuple[str, Mapping[str, Any]] | None:
        """A span's own `process` object (when it has no `processID`), one resource per distinct process."""
        if type(raw) is not dict:
            return None
        try:
            key = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):
            return self._process(raw)
        found = cache.get(key)
        if found is None:
            found = self._process(raw)
            if found is not None:
                cache[key] = found
        return found

    def _references(self, refs: list[Any], trace_id: str) -> tuple[str | None, tuple[SpanLink, ...]]:
        """The parent (the first CHILD_OF reference in the span's trace) and the links (every other reference).

        Raises `_Unreadable` when that CHILD_OF reference's ids are not valid.
        """
        parent_id: str | None = None
        links: list[SpanLink] = []
        for ref in refs:
            if type(ref) is not dict:
                self._note("dropped {n} reference(s) that are not objects")
                continue
            ref_type = ref.get("refType", _CHILD_OF)
            if ref_type != _CHILD_OF and ref_type != _FOLLOWS_FROM:
                self._note("dropped {n} reference(s) whose refType is neither CHILD_OF nor FOLLOWS_FROM")
                continue
            raw_trace = ref.get("traceID")
            ref_trace = trace_id if raw_trace is None else _hex_id(raw_trace, 32)
            ref_span = _hex_id(ref.get("spanID"), 16)
            if ref_type == _CHILD_OF and parent_id is None and (ref_trace == trace_id or ref_trace is None):
                if ref_trace is None or ref_span is None:
                    raise _Unreadable
                if ref_span != _ZERO_SPAN_ID:
                    parent_id = ref_span
                continue
            if ref_trace is None or ref_span is None or ref_trace == _ZERO_TRACE_ID or ref_span == _ZERO_SPAN_ID:
                self._note("dropped {n} reference(s) without a valid traceID and spanID")
                continue
            links.append(SpanLink(self.trace_ids.get(ref_trace, ref_trace), ref_span))
        return parent_id, tuple(links)

    def _events(self, logs: list[Any]) -> tuple[SpanEvent, ...]:
        """A span's logs as events: named by their `event` field ("log" without one)."""
        events = []
        shared = self.shared
        for log in logs:
            if type(log) is not dict:
                self._note("dropped {n} log(s) that are not objects")
                continue
            ts = _micros_ns(log.get("timestamp"))
            fields = self._tags(log.get("fields"))
            if ts is None or ts <= 0 or fields is None:
                self._note("dropped {n} log(s) without a readable timestamp and field list")
                continue
            name = fields.get("event")
            if type(name) is str:
                del fields["event"]
            else:
                name = "log"
            events.append(SpanEvent(shared.setdefault(name, name), ts, fields or NO_ATTRS))
        return tuple(events)

    def _otel_tags(self, attrs: dict[str, Any]) -> tuple[int, int, str]:
        """The kind, status and scope the OpenTelemetry-to-Jaeger mapping put in tags; those tags are removed from `attrs`."""
        kind = KIND_UNSPECIFIED
        raw_kind = attrs.pop("span.kind", None)
        if raw_kind is not None:
            found = KIND_NAMES.get(raw_kind.lower()) if type(raw_kind) is str else None
            if found is None:
                self._note("read {n} span(s) with an unknown span.kind as unspecified")
            else:
                kind = found
        # Jaeger's `error` tag is the last word on an error (as the OpenTelemetry Collector reads it).
        error = attrs.pop("error", None)
        status_code, scope = self._otel_status_scope(attrs, error is True or (type(error) is str and error.lower() == "true"))
        return kind, status_code, scope

    # --- the result ----------------------------------------------------------------------

    def result(self) -> JaegerRead:
        path = self.path
        warnings = self.warnings
        warnings.extend(self.skipped_lines(f"{path}: ") + self.note_lines(f"{path}: "))
        errors = self.api_errors
        said = f"{len(errors)} error(s): " + "; ".join(errors[:3]) + ("; ..." if len(errors) > 3 else "")
        if not self.spans:
            reasons = self.skipped_reasons()
            if reasons:
                detail = f": skipped {reasons}"
            else:
                detail = f" ({self.documents} trace(s), none with spans)"
            if errors:
                detail += f"; the query API returned {said}"
            raise InputError(f"{path}: Jaeger JSON file holds no readable spans{detail}")
        if errors:
            warnings.append(f"{path}: the query API returned {said}")
        return JaegerRead(self.spans, warnings, self.documents)
