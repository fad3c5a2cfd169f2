"""Segment lines decoded by msgspec into their fields in one C pass: the capture reader's way
for a segment line in the writer's form (`latprof.capture.reader`, both passes of a
cohort-first read and the full read).

The general reader parses a line with orjson into a dict and builds the `Segment` from it
(`latprof.capture.format.segment_decoder`): a dict, its keys and values made and dropped for
each of a million lines. msgspec decodes a line straight into a struct of the fields a segment
has, skipping the others, and leaves the attributes as raw bytes: the dict of each distinct
attribute text is parsed once and shared, as the general decoder shares it.

Only what the general decoder would read the same way is taken here. Anything msgspec does
not accept as the writer's plain form - a key the writer does not write, a number in a string
or a float where an integer belongs, an integer beyond 64 bits, a field of the wrong JSON type,
malformed JSON - goes the general way (`parse` returns the orjson dict, or raises orjson's error), so a line means the
same and fails the same whichever way it was read; the fuzz target `capture_two_pass` holds
the two passes to the full read.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, Union

import msgspec
import orjson

from latprof.capture.format import ATTRS_CACHE_MAX, BAD_LAYER, LAYER_INTERN, segment_decoder
from latprof.events import NO_ATTRS, Segment

#: An integer of 64 bits (orjson reads one of up to 2**64 - 1 as an int, a larger one as a float: such a line goes its way).
_Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_NULL = msgspec.Raw(b"null")


class SegmentLine(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    """A segment line's fields as `latprof.capture.format` encodes them. A line with any other key
    goes the general way: msgspec would skip its value unchecked where orjson refuses bytes that
    are not UTF-8 or a number out of a float's range, and the line must fail the same."""

    type: str
    request_id: str
    segment_id: str
    name: str
    start_ns: _Int
    end_ns: _Int
    pid: _Int
    parent_id: Union[str, None] = None
    layer: Union[str, None] = None
    attrs: msgspec.Raw = _NULL


Parsed = Union[SegmentLine, dict[str, Any]]


def segment_line_reader() -> tuple[Callable[[bytes], Parsed], Callable[[Parsed, bytes, Any], Segment]]:
    """(parse, build) for the segment lines of one file.

    `parse(line)`: the line's fields, or - for a line msgspec does not take - orjson's dict of it
    (orjson's JSONDecodeError for malformed JSON). `parse(line)["request_id"]` is not valid on a
    struct: use `request_id_of`. `build(parsed, line, request_id)`: the `Segment`, as
    `segment_decoder` builds it (`request_id`, when given, used instead of the line's equal one);
    KeyError, TypeError or ValueError for a line that is not a valid segment.
    """
    decode = msgspec.json.Decoder(SegmentLine).decode
    loads = orjson.loads
    general = segment_decoder()
    layers, bad_layer = LAYER_INTERN, BAD_LAYER
    shared: dict[Any, Any] = {}
    attrs_cache: dict[bytes, dict[str, Any]] = {}
    new_tuple = tuple.__new__
    null = b"null"

    def parse(line: bytes) -> Parsed:
        try:
            return decode(line)
        except (msgspec.MsgspecError, RecursionError):  # RecursionError: nested deeper than msgspec goes
            return loads(line)  # type: ignore[no-any-return]

    def build(parsed: Parsed, line: bytes, request_id: Any) -> Segment:
        if type(parsed) is not SegmentLine:
            return general(parsed, line, request_id)  # type: ignore[arg-type]
        layer = layers.get(parsed.layer, bad_layer)
        if layer is bad_layer:
            raise ValueError(f"unknown layer {parsed.layer!r}")
        raw = bytes(parsed.attrs)
        if raw == null:
            attrs: Any = NO_ATTRS
        else:
            attrs = attrs_cache.get(raw)
            if attrs is None:
                try:
                    attrs = loads(raw)
                except orjson.JSONDecodeError:  # msgspec passed it over: the line's own error, as the general reader gives it
                    return general(loads(line), line, request_id)
                if type(attrs) is not dict:
                    raise TypeError("attrs must be a JSON object")
                if len(attrs_cache) < ATTRS_CACHE_MAX:
                    attrs_cache[raw] = attrs
        name, pid = parsed.name, parsed.pid
        return new_tuple(
            Segment,
            (
                parsed.request_id if request_id is None else request_id,
                parsed.segment_id,
                parsed.parent_id,
                shared.setdefault(name, name),
                layer,
                parsed.start_ns,
                parsed.end_ns,
                shared.setdefault(pid, pid),
                attrs,
            ),
        )

    return parse, build


def request_id_of(parsed: Parsed) -> Any:
    """The request id of a parsed line (KeyError when a dict has none)."""
    return parsed.request_id if type(parsed) is SegmentLine else parsed["request_id"]  # type: ignore[index]


__all__ = ["Parsed", "SegmentLine", "request_id_of", "segment_line_reader"]
