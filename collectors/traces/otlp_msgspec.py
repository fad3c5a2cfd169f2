"""OTLP JSON lines decoded by msgspec into typed structs in one C pass: the OTLP JSON reader's way
for a line in the plain shape exporters write (`latprof.collectors.traces.otlp_json`, line mode).

The general reader parses a line with orjson into dicts and walks them: a dict, its keys and
values made and dropped for each span and each attribute of a million. msgspec decodes a line
straight into structs of the fields OTLP/JSON defines, and the spans are built from those.

Only what the general reader reads the same way, and without a warning, is taken here: an
`ExportTraceServiceRequest` with no key but `resourceSpans` and no key OTLP/JSON does not
define anywhere below it (lowerCamelCase only), each value of the JSON type the general
reader's fast path expects; ids in lowercase hex of their length, not all zero (nor 16 zeros
anywhere in the line's ids joined, as `_Reader._spans` checks them); times as decimal strings
or integers of 64 bits, 0 < start <= end; kinds and status codes OTLP defines (numbers or
names); `AnyValue`s of exactly one member; events with a readable time and links with
lowercase hex ids. Anything else - an unknown key (msgspec would skip its value unchecked
where orjson refuses bytes that are not UTF-8 or a number out of a float's range), a null, a
float where an integer belongs, malformed JSON - makes `read_line` return False having changed
nothing but caches, and the line goes the general way, so it means and fails the same
(tests/collectors/traces/test_otlp_msgspec.py reads files, junk and damaged lines both ways
and compares).
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, Mapping, Protocol, Union

import msgspec
from msgspec import UNSET, UnsetType

from latprof.collectors.traces._tracefile import ZERO_SPAN_ID as _ZERO_SPAN_ID, ZERO_TRACE_ID as _ZERO_TRACE_ID
from latprof.collectors.traces._tracefile import HEX, cached_parent_id, cached_trace_id, forget_ids, ids_plain, trim_caches
from latprof.collectors.traces.spans import KIND_NAMES, STATUS_NAMES, Span, SpanEvent, SpanLink
from latprof.events import NO_ATTRS

#: An integer of 64 bits (orjson reads a larger one as a float, which the general reader may read otherwise).
_Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
#: Span kinds and status codes by their number and by their names (as `json_format` writes them), each to its number.
_KINDS: dict[Any, int] = {**{n: n for n in range(6)}, **KIND_NAMES}
_STATUSES: dict[Any, int] = {**{n: n for n in range(3)}, **STATUS_NAMES}
#: How deep arrays and kvlists may nest in a value read here: msgspec's limit is Python's recursion
#: limit (and may be raised), orjson's is 1024 JSON levels - a line nested deeper than orjson reads
#: must go its way and fail. 200 values deep is < 900 JSON levels, with the request's own.
_MAX_NESTING = 200


class _AnyValue(msgspec.Struct, gc=False, forbid_unknown_fields=True, kw_only=True):
    """An OTLP `AnyValue`. UNSET, not None, for an absent member: the general reader drops a null one."""

    stringValue: Union[str, UnsetType] = UNSET
    intValue: Union[str, _Int, UnsetType] = UNSET
    boolValue: Union[bool, UnsetType] = UNSET
    doubleValue: Union[float, UnsetType] = UNSET
    bytesValue: Union[str, UnsetType] = UNSET
    arrayValue: Union[_ArrayValue, UnsetType] = UNSET
    kvlistValue: Union[_KeyValueList, UnsetType] = UNSET


class _ArrayValue(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    values: list[_AnyValue] = []


class _KeyValueList(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    values: list[_KeyValue] = []


class _KeyValue(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    key: str
    value: _AnyValue


class _Status(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    code: Union[_Int, str] = 0
    message: str = ""


class _Event(msgspec.Struct, gc=False, forbid_unknown_fields=True, kw_only=True):
    timeUnixNano: Union[str, _Int]
    name: str = ""
    attributes: list[_KeyValue] = []
    droppedAttributesCount: _Int = 0


class _Link(msgspec.Struct, gc=False, forbid_unknown_fields=True, kw_only=True):
    traceId: str
    spanId: str
    traceState: str = ""
    attributes: list[_KeyValue] = []
    droppedAttributesCount: _Int = 0
    flags: _Int = 0


_NO_RAW = msgspec.Raw(b"")


class _Span(msgspec.Struct, gc=False, forbid_unknown_fields=True, kw_only=True):
    traceId: str
    spanId: str
    parentSpanId: str = ""
    traceState: str = ""
    flags: _Int = 0
    name: str = ""
    kind: Union[_Int, str] = 0
    startTimeUnixNano: Union[str, _Int]
    endTimeUnixNano: Union[str, _Int]
    #: Its bytes as they are: decoded (as `list[_KeyValue]`) once per distinct text in a file (`_SpanAttributes`).
    attributes: msgspec.Raw = _NO_RAW
    droppedAttributesCount: _Int = 0
    events: list[_Event] = []
    droppedEventsCount: _Int = 0
    links: list[_Link] = []
    droppedLinksCount: _Int = 0
    status: Union[_Status, None] = None


class _Scope(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    name: str = ""
    version: str = ""
    attributes: list[_KeyValue] = []
    droppedAttributesCount: _Int = 0


class _ScopeSpans(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    scope: Union[_Scope, None] = None
    spans: list[_Span] = []
    schemaUrl: str = ""


class _Resource(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    attributes: list[_KeyValue] = []
    droppedAttributesCount: _Int = 0


class _ResourceSpans(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    resource: Union[_Resource, None] = None
    scopeSpans: list[_ScopeSpans] = []
    schemaUrl: str = ""


class _Request(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    resourceSpans: list[_ResourceSpans]


class _ReaderState(Protocol):
    """What `line_reader` reads into: the state of `otlp_json._Reader` (not imported: it imports this module)."""

    spans: list[Span]
    shared: dict[str, str]
    trace_ids: dict[Any, str]
    parent_ids: dict[str, str]
    documents: int
    offered: int


def _value(v: _AnyValue, shared: dict[str, str], depth: int = 0) -> Any:
    """What the general reader's `_any_value` makes of `v` (`depth` arrays or kvlists deep); ValueError
    unless it has exactly one member (none: the general reader drops the attribute; several: it takes
    the first in the line) or when nested deeper than `_MAX_NESTING`."""
    if depth > _MAX_NESTING:
        raise ValueError
    members = [
        m for m in (v.stringValue, v.intValue, v.boolValue, v.doubleValue, v.bytesValue, v.arrayValue, v.kvlistValue)
        if m is not UNSET
    ]  # fmt: skip
    if len(members) != 1:
        raise ValueError
    member = members[0]
    if type(member) is str:
        if v.stringValue is not UNSET:
            return shared.setdefault(member, member)
        if v.bytesValue is not UNSET:
            return member  # kept as its base64 text
    if v.intValue is not UNSET:
        return int(v.intValue)  # ValueError for a string that is no integer (dropped by the general reader)
    if v.doubleValue is not UNSET:
        return float(v.doubleValue)
    if type(member) is _ArrayValue:
        return [_value(item, shared, depth + 1) for item in member.values]
    if type(member) is _KeyValueList:
        return {kv.key: _value(kv.value, shared, depth + 1) for kv in member.values}
    return member  # a bool


class _SpanAttributes:
    """A span's attributes from the bytes of its `attributes` array, decoded and made into a dict once per
    distinct text: spans of one kind from one place repeat them (a statement, a route, a URL), so a
    file's million spans share a few thousand dicts (no one changes a span's attributes). The bytes of
    a text seen before were decoded and checked when first seen; a new text is decoded as the other
    fields are (`_KeyValue`, unknown keys refused) and ValueError makes the line go the general way."""

    __slots__ = ("by_text", "_decode", "_shared")

    #: The most texts remembered: past it the memory is forgotten (a file of all-distinct attributes pays little for it).
    MAX_TEXTS = 1 << 16

    def __init__(self, shared: dict[str, str]) -> None:
        self.by_text: dict[bytes, Any] = {}
        self._decode = msgspec.json.Decoder(list[_KeyValue]).decode
        self._shared = shared

    def __call__(self, raw: msgspec.Raw) -> Any:
        text = bytes(raw)
        attrs = self.by_text.get(text)
        if attrs is not None:
            return attrs
        try:
            attributes = self._decode(text) if text else []
        except msgspec.MsgspecError:  # (null, a wrong type, an unknown key: the general reader's to read or refuse)
            raise ValueError from None
        attrs = _attributes(attributes, self._shared) if attributes else NO_ATTRS
        if len(self.by_text) >= self.MAX_TEXTS:
            self.by_text.clear()
        self.by_text[text] = attrs
        return attrs


def _attributes(attributes: list[_KeyValue], shared: dict[str, str]) -> dict[str, Any]:
    """The flat attributes, as the general reader makes them; ValueError for one it would read otherwise
    (a plain string's case inlined: most values are)."""
    shared_get = shared.get
    unset = UNSET
    attrs: dict[str, Any] = {}
    for kv in attributes:
        key = kv.key
        value = kv.value
        string = value.stringValue
        if (
            string is not unset
            and value.intValue is unset
            and value.boolValue is unset
            and value.doubleValue is unset
            and value.bytesValue is unset
            and value.arrayValue is unset
            and value.kvlistValue is unset
        ):
            got = shared_get(string)
            if got is None:
                got = shared[string] = string
        else:
            got = _value(value, shared)
        known = shared_get(key)
        if known is None:
            shared[key] = key
            attrs[key] = got
        else:
            attrs[known] = got
    return attrs


def _event(ev: _Event, shared: dict[str, str]) -> SpanEvent:
    """The event as the general reader's `_events` makes it; ValueError for one it would drop."""
    ts = int(ev.timeUnixNano)
    if ts <= 0:
        raise ValueError
    name = ev.name
    return SpanEvent(shared.setdefault(name, name), ts, _attributes(ev.attributes, shared) or NO_ATTRS)


def _link(link: _Link, shared: dict[str, str]) -> SpanLink:
    """The link as the general reader's `_links` makes it; ValueError for ids it would canonicalise or drop."""
    _attributes(link.attributes, shared)  # not kept, but held to `_MAX_NESTING`
    trace_id, span_id = link.traceId, link.spanId
    if (
        len(trace_id) != 32 or len(span_id) != 16 or not trace_id.isascii() or not span_id.isascii()
        or trace_id.strip(HEX) or span_id.strip(HEX) or trace_id == _ZERO_TRACE_ID or span_id == _ZERO_SPAN_ID
    ):  # fmt: skip
        raise ValueError
    return SpanLink(trace_id, span_id)


def line_reader(reader: _ReaderState) -> Callable[[bytes], bool]:
    """`read_line(line)` for the lines of one file: True when the line was read here into `reader`
    (its spans, `documents` and `offered`), False when it must be read the general way (nothing
    changed then but `reader`'s shared strings and ids)."""
    decode = msgspec.json.Decoder(_Request).decode
    spans_out = reader.spans
    shared = reader.shared
    shared_get = shared.get
    trace_ids = reader.trace_ids
    parent_ids = reader.parent_ids
    new_tuple = tuple.__new__
    kinds = _KINDS
    statuses = _STATUSES
    no_attrs: Any = NO_ATTRS
    span_attributes = _SpanAttributes(shared)
    attributes_get = span_attributes.by_text.get
    trace_ids_get = trace_ids.get
    parent_ids_get = parent_ids.get

    def read_line(line: bytes) -> bool:
        try:
            request = decode(line)
        except (msgspec.MsgspecError, RecursionError):  # RecursionError: nested deeper than msgspec goes
            return False
        out: list[Span] = []
        out_append = out.append
        offered = 0
        span_ids: list[str] = []
        ids_append = span_ids.append
        # trace and parent ids not seen before: cached at once, checked below (as `_Reader._spans` does)
        new_ids: list[str] = []
        try:
            for rs in request.resourceSpans:
                resource_obj = rs.resource
                flat = {} if resource_obj is None else _attributes(resource_obj.attributes, shared)
                service_name = flat.get("service.name")
                service = "" if service_name is None else str(service_name)
                service = shared.setdefault(service, service)
                resource: Mapping[str, Any] = flat or no_attrs
                for ss in rs.scopeSpans:
                    scope_obj = ss.scope
                    if scope_obj is None:
                        scope = ""
                    else:
                        _attributes(scope_obj.attributes, shared)  # not kept, but held to `_MAX_NESTING`
                        scope = shared.setdefault(scope_obj.name, scope_obj.name)
                    spans = ss.spans
                    offered += len(spans)
                    for sp in spans:
                        # the ids and attributes seen before, looked up here (`cached_trace_id`, `cached_parent_id` and
                        # `span_attributes` for the others): every span
                        raw_id = sp.traceId
                        trace_id = trace_ids_get(raw_id)
                        if trace_id is None:
                            trace_id = cached_trace_id(raw_id, trace_ids, new_ids)
                        span_id = sp.spanId
                        if len(span_id) != 16:
                            raise ValueError
                        raw_id = sp.parentSpanId
                        if raw_id:
                            parent_id = parent_ids_get(raw_id)
                            if parent_id is None:
                                parent_id = cached_parent_id(raw_id, parent_ids, new_ids)
                        else:
                            parent_id = None
                        start = int(sp.startTimeUnixNano)
                        end = int(sp.endTimeUnixNano)
                        if not 0 < start <= end:
                            raise ValueError
                        name = sp.name
                        known = shared_get(name)
                        if known is None:
                            shared[name] = name
                        else:
                            name = known
                        kind = kinds.get(sp.kind)
                        status = sp.status
                        status_code = 0 if status is None else statuses.get(status.code)
                        if kind is None or status_code is None:
                            raise ValueError  # (the general reader reads it as unspecified or unset, and says so)
                        attrs = attributes_get(bytes(sp.attributes))
                        if attrs is None:
                            attrs = span_attributes(sp.attributes)
                        events: tuple[SpanEvent, ...] = ()
                        links: tuple[SpanLink, ...] = ()
                        dropped = 0
                        if sp.events:
                            events = tuple([_event(ev, shared) for ev in sp.events])
                            dropped = max(sp.droppedEventsCount, 0)
                        if sp.links:
                            links = tuple([_link(link, shared) for link in sp.links])
                        ids_append(span_id)
                        out_append(new_tuple(Span, (
                            trace_id, span_id, parent_id, name, kind, start, end,
                            service, scope, attrs, status_code, events, links, resource, dropped,
                        )))  # fmt: skip
            if not ids_plain(span_ids, new_ids):
                raise ValueError  # an id not in lowercase hex, or all zero (or one that may be: said by the general way)
        except (ValueError, UnicodeEncodeError, RecursionError):  # RecursionError: values nested deeper than Python goes
            forget_ids(new_ids, trace_ids, parent_ids)
            return False
        reader.documents += 1
        reader.offered += offered
        spans_out.extend(out)
        trim_caches(shared, parent_ids, trace_ids)
        return True

    return read_line


__all__ = ["line_reader"]
