"""Read captures: JSONL files (plain or gzip, several writers interleaved), trace files (OTLP JSON or protobuf, Jaeger, Zipkin JSON), directories of them."""

from __future__ import annotations

import gzip
import os
import pickle
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Collection, Iterable, Iterator, Mapping, NamedTuple, Protocol

import orjson

from latprof.capture.files import GZIP_MAGIC, open_input, skip_blank_lines
from latprof.capture.format import (
    DECODERS,
    HEADER_CLOSES,
    SCHEMA,
    SCHEMA_PREFIX,
    SOURCE_KINDS,
    request_decoder,
)
from latprof.capture.segment_lines import Parsed, SegmentLine, request_id_of, segment_line_reader
from latprof.errors import InputError, SchemaVersionError
from latprof.events import Gauge, QualityRecord, Request, Segment, StackSample
from latprof.collectors.traces import jaeger_json, otlp_json, otlp_proto, zipkin_json
from latprof.collectors.traces.clickhouse import ClickHouseSource
from latprof.collectors.traces.spans import Span
from latprof.collectors.traces.tracemap import SpanFacts, map_spans
from latprof.semconv import NOTE_CLOSED

_CAPTURE_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz", ".json", ".json.gz")
_TRACE_SUFFIXES = (".json", ".json.gz")
#: Binary trace files (OTLP protobuf) a directory stands for, when their content says so.
_PROTO_SUFFIXES = (".pb", ".pb.gz", ".binpb", ".binpb.gz")
#: How much of a file's (decompressed) start decides whether it is a trace file (and which) or a capture.
_SNIFF_BYTES = 64 * 1024


@dataclass
class CaptureData:
    """Everything read from one or more capture files, events grouped by kind, in file order."""

    inputs: list[str] = field(default_factory=list)
    headers: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    #: Segments grouped by their request id, each list in file order.
    segments_by_request: dict[Any, list[Segment]] = field(default_factory=dict)
    segment_count: int = 0
    gauges: list[Gauge] = field(default_factory=list)
    samples: list[StackSample] = field(default_factory=list)
    quality: list[QualityRecord] = field(default_factory=list)
    #: Problems the reader recovered from (torn last line, truncated gzip, unknown event types).
    warnings: list[str] = field(default_factory=list)
    #: What mapping the spans noted for the trace inferences, when every request was mapped from spans.
    span_facts: SpanFacts | None = None
    #: (file, pid) of each writing process whose header promised a `closed` record it never wrote.
    unclosed: list[tuple[str, int]] = field(default_factory=list)
    #: Segment lines left unread by a first pass (`read_captures(..., defer_segments=True)`): the
    #: second pass (`read_deferred_segments`) reads those of the requests the analysis needs.
    deferred_segments: int = 0
    #: The files whose segment lines were deferred, in the order read.
    deferred_inputs: list[str] = field(default_factory=list)
    #: Deferred segment lines of requests not in the capture (in flight when it stopped).
    orphan_deferred: int = 0
    #: Segments a deferring first pass read after all (not in the writer's form, or a file's last
    #: line), by request id: where each stood (input number from 1, line number), in order.
    read_early: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def source_kind(self) -> str:
        """How the data was collected, from the first header (report-v1 `source.kind`)."""
        for header in self.headers:
            kind = header.get("source")
            if kind in SOURCE_KINDS:
                return str(kind)
        return "run"

    @property
    def event_count(self) -> int:
        return (len(self.requests) + self.segment_count + self.deferred_segments + len(self.gauges) + len(self.samples)
                + len(self.quality))  # fmt: skip


def expand_inputs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Return the capture files named by `paths`; a directory stands for the captures inside it."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p for p in path.iterdir()
                if p.is_file() and p.name.endswith(_CAPTURE_SUFFIXES + _PROTO_SUFFIXES)
                and (not p.name.endswith(_TRACE_SUFFIXES + _PROTO_SUFFIXES) or _trace_format(p) is not None)  # other JSON and .pb files are not ours
            )  # fmt: skip
            if not found:
                raise InputError(f"{path}: directory holds no capture files (*.jsonl, *.jsonl.gz) nor trace files (OTLP JSON or protobuf, Jaeger or Zipkin JSON)")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise InputError(f"{path}: no such file or directory")
    return files


#: How the capture writer begins every segment line (`format.encode`'s key order, orjson's
#: compact form): the first pass of a cohort-first read tells a segment line, and the second its
#: request, by these bytes without parsing the line. A line that begins otherwise is parsed.
SEGMENT_LINE_PREFIX = b'{"type":"segment","request_id":"'


#: What can be read: a capture or trace file (or a directory of them), or a table of spans (`ClickHouseSource`).
Input = str | os.PathLike[str] | ClickHouseSource


def read_captures(paths: Iterable[Input], *, defer_segments: bool = False) -> CaptureData:
    """Read every capture named by `paths` into one `CaptureData`.

    Raises `InputError` (one line, naming the file and line) for a missing, empty or
    malformed input or one that is not a latprof capture, and `SchemaVersionError` for a
    schema this version cannot read. A torn last line (a writer killed mid-line) and a
    truncated gzip stream are skipped with a warning instead: nothing before them is lost.

    With `defer_segments` (the first pass of a cohort-first analysis), segment lines in the
    writer's own form (`SEGMENT_LINE_PREFIX`) but a file's last line (which may be torn) are
    counted in `deferred_segments`, not parsed; every other line is read as usual.
    `read_deferred_segments` reads them later, for the requests wanted. Only capture files
    are deferred (trace files are read whole) and only regular files (a pipe is read once).
    A `ClickHouseSource` among `paths` is asked for its spans (`latprof.collectors.traces.clickhouse`),
    which are then mapped with those of the trace files.
    """
    data = CaptureData()
    spans: list[Span] = []
    formats: list[tuple[str, str]] = []  # (source kind, reader module) of each trace format read, in order
    paths = list(paths)
    for source in paths:  # tables of spans (ClickHouse): what they pick comes back as spans, as a trace file's
        if isinstance(source, ClickHouseSource):
            data.inputs.append(str(source))
            read_table = source.read()
            spans.extend(read_table.spans)
            data.warnings.extend(read_table.warnings)
            if ("otlp", "clickhouse") not in formats:
                formats.append(("otlp", "clickhouse"))
            del read_table
    for path in expand_inputs([p for p in paths if not isinstance(p, ClickHouseSource)]):
        data.inputs.append(str(path))
        trace_format = _trace_format(path)
        if trace_format is not None:
            read = trace_format.read(path)
            if spans:
                spans.extend(read.spans)
            else:  # the first trace file: its list as it is (no copy of a million spans)
                spans = read.spans
            data.warnings.extend(read.warnings)
            if (trace_format.kind, trace_format.reader) not in formats:
                formats.append((trace_format.kind, trace_format.reader))
            del read  # (its spans are in `spans` now: mapping them lets them go)
        else:
            _read_file(path, data, defer_segments and path.is_file())
    if spans:
        _add_traces(spans, formats, data)
    if data.unclosed:
        data.warnings.extend(_unclosed_warnings(data))
    if not data.event_count:
        raise InputError(
            f"{', '.join(data.inputs)}: capture holds no events (did the service receive any traffic?)"
        )
    return data


#: Trace formats: (report-v1 source kind, reader module in latprof.collectors, its read function), tried in order.
class TraceRead(Protocol):
    """What a trace reader returns for one file: its spans and one line per thing it skipped."""

    @property
    def spans(self) -> list[Span]: ...

    @property
    def warnings(self) -> list[str]: ...


class TraceFormat(NamedTuple):
    """A trace file format: the report's source kind, the reader's name, and its sniff and read functions."""

    kind: str
    reader: str
    sniff: Callable[[bytes], bool]
    read: Callable[[Path], TraceRead]


TRACE_FORMATS = (
    TraceFormat("otlp", "otlp_json", otlp_json.sniff, otlp_json.read_otlp_json),
    TraceFormat("otlp", "otlp_proto", otlp_proto.sniff, otlp_proto.read_otlp_proto),
    TraceFormat("jaeger", "jaeger_json", jaeger_json.sniff, jaeger_json.read_jaeger_json),
    TraceFormat("zipkin", "zipkin_json", zipkin_json.sniff, zipkin_json.read_zipkin_json),
)


def _trace_format(path: Path) -> TraceFormat | None:
    """The trace format the file's content (not its name) is in, or None (a capture, or not ours)."""
    try:
        with open_input(path) as stream:
            head = stream.read(_SNIFF_BYTES)
    except (EOFError, gzip.BadGzipFile, zlib.error):
        return None  # damaged: the capture reader says so
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    for trace_format in TRACE_FORMATS:
        if trace_format.sniff(head):
            return trace_format
    return None


def _add_traces(spans: list[Span], formats: list[tuple[str, str]], data: CaptureData) -> None:
    """Map the spans of every trace file read (a trace can span files) into requests and segments.

    `formats` are the (source kind, reader module) of the files, in the order first read: the
    first kind is the capture's source, the readers are its collectors ("otlp-json", "otlp-proto").
    """
    events = map_spans(spans, consume=True)  # (the spans are read's: let go of each trace's once mapped)
    if not data.requests and not data.segments_by_request:  # every request is mapped from spans: the facts cover them all
        data.span_facts = events.facts
    # the `pid` of trace events numbers the emitting instances: which service each one is
    data.headers.append({"source": formats[0][0], "collectors": [module.replace("_", "-") for _, module in formats],
                         "instances": {str(n): about for n, about in events.instances.items()}})  # fmt: skip
    data.requests.extend(events.requests)
    if data.segments_by_request:
        for rid, segments in events.segments_by_request.items():
            data.segments_by_request.setdefault(rid, []).extend(segments)
    else:  # only trace files were read: their requests' lists as they are
        data.segments_by_request = events.segments_by_request
    data.segment_count += events.segment_count
    data.warnings.extend(events.warnings)


def _check_header(path: Path, lineno: int, header: dict[str, Any]) -> None:
    schema = header.get("schema")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise InputError(f"{path}:{lineno}: header has no latprof capture schema (got {schema!r})")
    if schema != SCHEMA:
        raise SchemaVersionError(
            f"{path}: capture schema {schema} is not readable by this latprof, which reads {SCHEMA}"
            " (upgrade latprof, or re-record the capture)"
        )


def _read_file(path: Path, data: CaptureData, defer_segments: bool = False) -> None:
    """Append one file's events to `data`, decoded by `latprof.capture.format`. This loop is the
    hot path of `latprof analyze`. With `defer_segments`, a segment line in the writer's form
    is counted, not parsed (`read_captures`)."""
    loads = orjson.loads
    JSONDecodeError = orjson.JSONDecodeError
    by_request = data.segments_by_request
    requests_append = data.requests.append
    decode_request = request_decoder()  # one per file, as the segments': it shares what repeats across its lines
    parse_segment, build_segment = segment_line_reader()
    segment_prefix = SEGMENT_LINE_PREFIX
    seen_header = False
    torn: tuple[int, str] | None = None  # a bad line is fatal unless it turns out to be the last
    unknown_types: dict[str, int] = {}
    lineno = 0
    segments = 0
    valueless_gauges = 0
    open_writers: dict[int, int] = {}  # pid -> headers promising a `closed` record not yet seen
    stream = open_input(path)
    deferring = _Undeferred(stream) if defer_segments else None
    lines: Iterable[bytes] = stream if deferring is None else deferring
    try:
        for line in lines:
            if deferring is None:
                lineno += 1
            else:
                lineno = deferring.lineno
            if torn is not None:
                if not line.strip():
                    continue
                raise InputError(f"{path}:{torn[0]}: malformed line ({torn[1]}); the capture is damaged before its end")
            try:
                # a segment line in the writer's plain form is decoded by msgspec (`segment_lines`), any other the general way
                d = parse_segment(line) if line.startswith(segment_prefix) else loads(line)
                if isinstance(d, SegmentLine) or d["type"] == "segment":
                    request_id = request_id_of(d)
                    bucket = by_request.get(request_id)
                    if bucket is None:
                        segment = build_segment(d, line, None)
                        by_request[segment[0]] = [segment]
                    else:
                        bucket.append(build_segment(d, line, bucket[0][0]))  # one id string per request
                    segments += 1
                    if deferring is not None:  # where it stood, for the second pass to keep the file's order
                        data.read_early.setdefault(request_id, []).append((len(data.inputs), lineno))
                    continue
                kind = d["type"]
                if kind == "request":
                    requests_append(decode_request(d, line))
                elif kind == "header":
                    _check_header(path, lineno, d)
                    seen_header = True
                    data.headers.append(d)
                    if d.get(HEADER_CLOSES) is True:
                        open_writers[int(d["pid"])] = open_writers.get(int(d["pid"]), 0) + 1
                elif not seen_header:
                    raise InputError(_not_a_capture(path, line))
                elif kind == "gauge":
                    if d.get("value") is None:  # NaN and infinity are written as null
                        valueless_gauges += 1
                    else:
                        data.gauges.append(DECODERS[kind](d))  # type: ignore[arg-type]
                elif kind == "stack":
                    data.samples.append(DECODERS[kind](d))  # type: ignore[arg-type]
                elif kind == "quality":
                    record: QualityRecord = DECODERS[kind](d)  # type: ignore[assignment]
                    data.quality.append(record)
                    if record.kind == NOTE_CLOSED and open_writers.get(record.pid, 0) > 0:
                        open_writers[record.pid] -= 1
                else:
                    # A newer writer's event type: skip it, say so once.
                    unknown_types[str(kind)] = unknown_types.get(str(kind), 0) + 1
            except JSONDecodeError as exc:
                if not line.strip():
                    if deferring is None:
                        lineno += skip_blank_lines(stream)
                    continue
                if not seen_header:
                    raise InputError(_not_a_capture(path, line)) from None
                torn = (lineno, f"not valid JSON: {exc}")
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                if not seen_header:
                    raise InputError(_not_a_capture(path, line)) from None
                torn = (lineno, f"missing field {exc}" if isinstance(exc, KeyError) else str(exc))
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        if deferring is not None:
            lineno = deferring.lines_read
        data.warnings.append(
            f"{path}: compressed stream is truncated or damaged after line {lineno} ({exc}); read what came before it"
        )
    except OSError as exc:
        raise InputError(f"{path}: read failed after line {lineno}: {exc.strerror or exc}") from None
    finally:
        stream.close()

    data.segment_count += segments
    if deferring is not None and deferring.deferred:
        data.deferred_segments += deferring.deferred
        data.deferred_inputs.append(str(path))
        if torn is not None and deferring.last_deferred > torn[0]:  # whole segment lines came after the bad one
            raise InputError(f"{path}:{torn[0]}: malformed line ({torn[1]}); the capture is damaged before its end")
    if torn is not None:
        data.warnings.append(f"{path}:{torn[0]}: skipped a torn last line ({torn[1]})")
    if not seen_header:
        raise InputError(f"{path}: file is empty" if lineno == 0 or torn is None else _not_a_capture(path, b""))
    if valueless_gauges:
        data.warnings.append(f"{path}: skipped {valueless_gauges} gauge reading(s) without a value (NaN or infinity)")
    for kind, count in sorted(unknown_types.items()):
        data.warnings.append(f"{path}: skipped {count} event(s) of unknown type {kind!r} (written by a newer latprof?)")
    data.unclosed.extend((str(path), pid) for pid, count in open_writers.items() if count > 0)


#: How much of a capture the cohort-first passes read at a time (they split it into lines in C).
_BLOCK_BYTES = 1 << 22


class _Block(NamedTuple):
    """Lines of a capture stream (without their newlines) read in one go (`_line_blocks`)."""

    base: int  # the number of the block's first line, less one
    lines: list[bytes]
    last: bool  # the block holds the file's last line (its last one)
    newline: bool  # its last line ended in a newline


def _line_blocks(stream: IO[bytes], *, limit: int | None = None, ends_file: bool = True) -> Iterator[_Block]:
    """The lines of `stream`, about `_BLOCK_BYTES` at a time, split in C; only its first `limit`
    bytes when given (ending at a line's end); `ends_file` False: what is read is not the file's
    end (`_Block.last` stays False). A stream that breaks off (a truncated gzip file) yields the
    whole lines it gave before the error is raised, as a line-by-line read would have read them."""
    rest = b""
    base = 0
    left = limit
    pending, broken = _read_block(stream, left)
    if left is not None:
        left -= len(pending)
    while pending:
        block = pending
        if broken is None and left != 0:
            pending, broken = _read_block(stream, left)
            if left is not None:
                left -= len(pending)
        else:
            pending = b""
        lines = block.split(b"\n")
        if rest:
            lines[0] = rest + lines[0]
        rest = lines.pop()  # after the last newline: the start of the next block's first line
        newline = True
        if not pending and rest and broken is None:  # the file ends without a newline: `rest` is its last line
            lines.append(rest)
            rest = b""
            newline = False
        if lines:
            last = ends_file and not pending and broken is None
            yield _Block(base, lines, last, newline)
            base += len(lines)
    if broken is not None:
        raise broken


def _read_block(stream: IO[bytes], limit: int | None = None) -> tuple[bytes, BaseException | None]:
    """About `_BLOCK_BYTES` of `stream` (at most `limit`; b"" at its end), and the error that broke
    it off, if one did: what was read before it is kept."""
    parts: list[bytes] = []
    size = 0
    wanted = _BLOCK_BYTES if limit is None else min(_BLOCK_BYTES, limit)
    read = getattr(stream, "read1", stream.read)
    try:
        while size < wanted:
            chunk = read(wanted - size)
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        return b"".join(parts), exc
    return (parts[0] if len(parts) == 1 else b"".join(parts)), None


class _Undeferred:
    """The lines of a capture stream but its segment lines in the writer's form (`SEGMENT_LINE_PREFIX`),
    which are counted in `deferred` (`last_deferred`: the number of the last one);
    `lineno` is the number of the line last yielded. Empty lines are left out too. The file's
    last line is always yielded: it may be torn (after a "}" of its attributes)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.lineno = 0
        self.lines_read = 0  # lines of the stream passed so far, deferred or not
        self.deferred = 0
        self.last_deferred = 0

    def __iter__(self) -> Iterator[bytes]:
        prefix = SEGMENT_LINE_PREFIX
        for block in _line_blocks(self.stream):
            base, lines = block.base, block.lines
            final = lines.pop() if block.last else None
            kept = [(k, line) for k, line in enumerate(lines, base + 1) if line and not line.startswith(prefix)]
            deferred = len(lines) - len(kept) - lines.count(b"")
            if deferred:
                self.deferred += deferred
                for k in range(len(lines) - 1, -1, -1):  # the last deferred line of the block: near its end
                    if lines[k].startswith(prefix):
                        self.last_deferred = base + 1 + k
                        break
            for k, line in kept:
                self.lineno = k
                yield line + b"\n"  # as a line of the stream: its parse errors read the same
            self.lines_read = base + len(lines) + (final is not None)
            if final:
                self.lineno = base + len(lines) + 1
                yield final + b"\n" if block.newline else final


def read_deferred_segments(data: CaptureData, wanted: Collection[str] | None, *, workers: int = 2) -> None:
    """The second pass of a cohort-first read: the segment lines the first deferred
    (`read_captures(..., defer_segments=True)`) of the requests in `wanted` (every request
    when None), added to `data.segments_by_request` as the full read would have.

    A deferred line's request is read from its bytes; only a wanted one is parsed. Lines whose
    request is not among `data.requests` (in flight when the capture stopped) are counted in
    `segments_by_request` only by number: `orphan_deferred` holds them for the timeline's warning.
    A line that no longer parses (the file changed since the first pass) is skipped: the first
    pass said what was damaged. With `workers` 2, a single plain (not gzip) file is read by two
    processes, a forked one reading its second half (`_forked_half`).
    """
    look = _Looking(data, wanted)
    by_request = data.segments_by_request
    early = data.read_early  # segments of wanted requests the first pass read: merged in file order below
    late: dict[str, list[tuple[tuple[int, int], Segment]]] = {}
    for name in data.deferred_inputs:
        read = 0
        file_number = data.inputs.index(name) + 1
        half = _forked_half(name, look) if workers > 1 and len(data.deferred_inputs) == 1 and not early else None
        try:
            with open_input(name) as stream:
                blocks = _line_blocks(stream, limit=None if half is None else half.start, ends_file=half is None)
                read = _add_deferred(blocks, look, by_request, early, late, file_number)
        except OSError as exc:
            raise InputError(f"{name}: read failed in the second pass: {exc.strerror or exc}") from None
        if half is not None:
            read += half.collect(by_request, look)
        data.segment_count += read
    for request_id, added in late.items():  # in the order the lines stood, as the full read has them
        bucket = by_request[request_id]
        placed = list(zip(early[request_id], bucket[: len(early[request_id])])) + added
        placed.sort(key=lambda pair: pair[0])
        by_request[request_id] = [segment for _, segment in placed] + bucket[len(early[request_id]) :]
    data.orphan_deferred += look.orphans


def _add_deferred(
    blocks: Iterable[_Block],
    look: _Looking,
    by_request: dict[Any, list[Segment]],
    early: Mapping[str, Any] = {},
    late: dict[str, list[tuple[tuple[int, int], Segment]]] | None = None,
    file_number: int = 0,
) -> int:
    """Decode the wanted segment lines of `blocks` (`_deferred_hits`) into `by_request`, after what
    it holds; how many. A segment of a request in `early` (some of whose segments the first pass
    read) goes to `late` with where it stood, for the caller to put in file order. A stream that
    breaks off (a truncated gzip file) ends it: the first pass warned; what came before counts."""
    parse, build = segment_line_reader()
    read = 0
    try:
        for lineno, request_id, parsed, line in _deferred_hits(blocks, look, parse, with_lines=bool(early)):
            bucket = by_request.get(request_id)
            try:
                if bucket is None:
                    segment = build(parsed, line, None)
                    by_request[segment[0]] = [segment]
                else:
                    segment = build(parsed, line, bucket[0][0])
                    if late is not None and request_id in early:
                        late.setdefault(request_id, []).append(((file_number, lineno), segment))
                    else:
                        bucket.append(segment)
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            read += 1
    except (EOFError, gzip.BadGzipFile, zlib.error):
        pass
    return read


class _Looking:
    """What the second pass looks for: the wanted requests' lines; counts the lines of requests not in the capture."""

    def __init__(self, data: CaptureData, wanted: Collection[str] | None) -> None:
        self.requests = data.requests
        self.wanted = wanted
        # ids as the writer writes them between the quotes (orjson: `"` `\\` and control characters escaped)
        self.wanted_raw = None if wanted is None else {_raw_id(rid) for rid in wanted}
        # the requests not wanted: a line of one of them is passed over (most lines)
        self.passed_over = set() if self.wanted_raw is None else {_raw_id(r.request_id) for r in data.requests} - self.wanted_raw
        self.known_ids: set[str] | None = None  # built for the first line matched on its parsed form
        self.orphans = 0


def _deferred_hits(
    blocks: Iterable[_Block], look: _Looking, parse: Callable[[bytes], Parsed], with_lines: bool = False
) -> Iterator[tuple[int, str, Parsed, bytes]]:
    """(line number when `with_lines`, else 0; the request id; the line parsed by `parse`; the line) of
    each deferred segment line of a wanted request in `blocks`, in order; lines of unknown requests
    are counted in `look.orphans`."""
    prefix = SEGMENT_LINE_PREFIX
    at = len(prefix)
    passed_over, wanted_raw, wanted = look.passed_over, look.wanted_raw, look.wanted
    for block in blocks:
        lines = block.lines[:-1] if block.last else block.lines  # the file's last line is never deferred
        # the id's bytes run to the first quote: cut short where the id holds an escaped one
        if with_lines:  # line numbers too, to put a request's segments in file order
            hits = [(k, line, cut) for k, line in enumerate(lines, block.base + 1)
                    if line.startswith(prefix) and (cut := line[at : line.find(b'"', at)]) not in passed_over]  # fmt: skip
        else:
            hits = [(0, line, cut) for line in lines
                    if line.startswith(prefix) and (cut := line[at : line.find(b'"', at)]) not in passed_over]  # fmt: skip
        for lineno, line, cut in hits:
            if wanted_raw is not None:
                if cut not in wanted_raw and b"\\" not in cut:  # neither wanted nor known: in flight at the end
                    look.orphans += 1
                    continue
            try:
                parsed = parse(line)
                request_id = request_id_of(parsed)
                if wanted is not None and request_id not in wanted:  # an id with an escaped character
                    if look.known_ids is None:
                        look.known_ids = {request.request_id for request in look.requests}
                    if request_id not in look.known_ids:
                        look.orphans += 1
                    continue
                if type(request_id) is not str:
                    continue
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
            yield lineno, request_id, parsed, line


#: A plain capture smaller than this is read by one process: a fork costs more than it saves.
_FORK_MIN_BYTES = 32 << 20


class _Half:
    """The second half of a capture's second pass, read by a forked process (`_forked_half`)."""

    def __init__(self, name: str, start: int, pid: int, pipe: int) -> None:
        self.name = name
        self.start = start  # the byte it begins at (a line's start): the caller reads up to it
        self.pid = pid
        self.pipe = pipe

    def collect(self, by_request: dict[Any, list[Segment]], look: _Looking) -> int:
        """Wait for the child and add its segments after the caller's; how many. Should it have
        failed, the caller's process reads the half itself."""
        # unpickled as it comes (not read whole first: its bytes and its segments are not held at once)
        with os.fdopen(self.pipe, "rb") as pipe:
            try:
                sent: Any = pickle.load(pipe)
            except Exception:  # the child died or said nothing whole: its half is read here below
                sent = None
        _, status = os.waitpid(self.pid, 0)
        if sent is None or os.waitstatus_to_exitcode(status) != 0:
            return self._read_here(by_request, look)
        orphans, found = sent
        del sent
        look.orphans += orphans
        new = tuple.__new__
        for k, fields in enumerate(found):
            found[k] = None  # each sent tuple goes as its segment comes (the two are the same size)
            bucket = by_request.get(fields[0])
            segment = new(Segment, (bucket[0][0], *fields[1:]) if bucket else fields)
            if bucket is None:
                by_request[segment[0]] = [segment]
            else:
                bucket.append(segment)
        return len(found)

    def _read_here(self, by_request: dict[Any, list[Segment]], look: _Looking) -> int:
        with open(self.name, "rb") as stream:
            stream.seek(self.start)
            return _add_deferred(_line_blocks(stream), look, by_request)


def _forked_half(name: str, look: _Looking) -> _Half | None:
    """A forked process reading the second half of the plain capture `name` for the second pass
    (from the first line that starts at or after its middle), or None: a gzip or small file, a
    process with other threads running (a fork copies their locks as they are), or no fork."""
    import threading

    if not hasattr(os, "fork") or threading.active_count() > 1:
        return None
    try:
        with open(name, "rb") as raw:
            size = os.fstat(raw.fileno()).st_size
            if size < _FORK_MIN_BYTES or raw.read(2) == GZIP_MAGIC:
                return None
            raw.seek(size // 2)
            ahead = raw.read(1 << 20)
            cut = ahead.find(b"\n")
            if cut < 0:
                return None
            start = size // 2 + cut + 1
        read_end, write_end = os.pipe()
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:  # the child: read the half, send what it found, leave without running any exit handler
        code = 1
        try:
            os.close(read_end)
            parse, build = segment_line_reader()
            shared: dict[str, str] = {}
            found: list[tuple[Any, ...]] = []
            with open(name, "rb") as stream:
                stream.seek(start)
                for _, request_id, parsed, line in _deferred_hits(_line_blocks(stream), look, parse):
                    try:
                        segment = build(parsed, line, shared.setdefault(request_id, request_id))
                    except (KeyError, TypeError, ValueError, IndexError):
                        continue
                    found.append(tuple(segment))
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(pickle.dumps((look.orphans, found), protocol=pickle.HIGHEST_PROTOCOL))
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    return _Half(name, start, pid, read_end)


def _raw_id(request_id: str) -> bytes:
    """`request_id` as the capture writer (orjson) writes it between its quotes."""
    return orjson.dumps(request_id)[1:-1]


def _unclosed_warnings(data: CaptureData) -> list[str]:
    """One warning per process whose capture ended without its `closed` record: it was killed
    (SIGKILL, the OOM killer), crashed, left through `os._exit`, or could not write its end;
    what it recorded in its writer's last second or so is lost. Says up to when it was read."""
    from datetime import datetime, timezone

    pids = {pid for _, pid in data.unclosed}
    last: dict[int, int] = {}
    requests: dict[int, int] = {}

    def see(pid: int, ns: int) -> None:
        if pid in pids and ns > last.get(pid, 0):
            last[pid] = ns

    for request in data.requests:
        if request.pid in pids:
            requests[request.pid] = requests.get(request.pid, 0) + 1
            see(request.pid, request.end_ns)
    for segments in data.segments_by_request.values():
        for segment in segments:
            see(segment.pid, segment.end_ns)
    for gauge in data.gauges:
        see(gauge.pid, gauge.ts_ns)
    for sample in data.samples:
        see(sample.pid, sample.ts_ns)
    for record in data.quality:
        see(record.pid, record.ts_ns)
    warnings = []
    for path, pid in data.unclosed:
        if pid in last:
            at = datetime.fromtimestamp(last[pid] / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
            read = f"its events up to {at} UTC were read ({requests.get(pid, 0)} requests)"
        else:
            read = "none of its events were read"
        warnings.append(
            f"{path}: pid {pid}: capture ended abruptly, without the writer's closing record (the process was killed"
            f" - SIGKILL, the OOM killer -, crashed, or its last writes failed); {read}; what it recorded after that"
            " is lost"
        )
    return warnings


def _not_a_capture(path: Path, first_line: bytes) -> str:
    return f"{path}: not a latprof capture (it must start with a {SCHEMA} header line) nor a trace file (OTLP JSON or protobuf, Jaeger or Zipkin JSON)"

