"""Reading captures: round trips, several writers, gzip, torn lines, and every kind of bad input."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from latprof.capture.format import SCHEMA, encode, make_header
from latprof.capture.reader import read_captures
from latprof.errors import InputError, SchemaVersionError
from latprof.events import Frame, Gauge, QualityRecord, Request, Segment, StackSample

T0 = 1_764_000_000_000_000_000


def sample_events(pid: int = 7) -> list:
    return [
        QualityRecord("hooks_loaded", T0, pid, "asgi", 1, {"collectors": ["asgi", "sqlalchemy"]}),
        Segment("r1", "s1", None, "sqlalchemy checkout", "db.pool", T0 + 10, T0 + 50, pid, {"db.client.connection.pool.name": "main"}),
        Segment("r1", "s2", "s1", "SELECT users", "db.query", T0 + 50, T0 + 90, pid),
        Segment("r1", "h1", None, "db.connection.hold", None, T0 + 50, T0 + 95, pid),
        Request("r1", "POST /chat", T0, T0 + 100, pid, 30, 200),
        Gauge("db.pool.in_use", 4.0, T0 + 60, pid, {"db.client.connection.pool.name": "main"}),
        StackSample(T0 + 70, pid, 12345, "MainThread", (Frame("handler", "app.py", 3), Frame("run", "x.py", 1)), True, None, 2),
    ]


def write_capture(path: Path, events, *, header=None, compress=False) -> Path:
    lines = [orjson.dumps(header or make_header("run"))] + [orjson.dumps(encode(e)) for e in events]
    blob = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(blob) if compress else blob)
    return path


def test_round_trip_keeps_every_event(tmp_path):
    events = sample_events()
    data = read_captures([write_capture(tmp_path / "c.jsonl", events)])
    assert data.requests == [events[4]]
    assert data.segments_by_request == {"r1": [events[1], events[2], events[3]]}
    assert data.gauges == [events[5]] and data.samples == [events[6]] and data.quality == [events[0]]
    assert data.headers[0]["schema"] == SCHEMA and data.source_kind == "run"
    assert data.warnings == []


def test_gzip_is_recognised_by_content_not_name(tmp_path):
    path = write_capture(tmp_path / "capture.data", sample_events(), compress=True)
    assert len(read_captures([path]).requests) == 1


def test_interleaved_writers_each_with_a_header_are_merged(tmp_path):
    a, b = sample_events(pid=1), sample_events(pid=2)
    b = [e._replace(request_id="r2") if isinstance(e, (Segment, Request)) else e for e in b]
    lines = [orjson.dumps(make_header("run", pid=1)), orjson.dumps(make_header("run", pid=2))]
    for ea, eb in zip(a, b):
        lines += [orjson.dumps(encode(ea)), orjson.dumps(encode(eb))]
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    data = read_captures([path])
    assert sorted(r.pid for r in data.requests) == [1, 2]
    assert len(data.headers) == 2


def test_directory_merges_the_captures_inside(tmp_path):
    write_capture(tmp_path / "a.jsonl", sample_events(pid=1))
    write_capture(tmp_path / "b.jsonl.gz", [e._replace(request_id="r9") if isinstance(e, (Segment, Request)) else e for e in sample_events(pid=2)], compress=True)
    (tmp_path / "notes.txt").write_text("not a capture")
    data = read_captures([tmp_path])
    assert len(data.requests) == 2 and len(data.inputs) == 2


def test_torn_last_line_is_skipped_with_a_warning(tmp_path):
    path = write_capture(tmp_path / "c.jsonl", sample_events())
    with open(path, "ab") as f:
        f.write(b'{"type": "segment", "request_id": "r1", "segm')
    data = read_captures([path])
    assert len(data.requests) == 1
    assert len(data.warnings) == 1 and "torn last line" in data.warnings[0] and ":9:" in data.warnings[0]


def test_truncated_gzip_keeps_what_came_before(tmp_path):
    events = sample_events() + [Request(f"x{i}", "GET /health", T0 + i, T0 + i + 5, 7) for i in range(2000)]
    path = write_capture(tmp_path / "c.jsonl.gz", events, compress=True)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) * 2 // 3])
    data = read_captures([path])
    assert 1 < len(data.requests) < 2001
    assert any("truncated" in w for w in data.warnings)


def test_unknown_event_types_are_skipped_and_reported(tmp_path):
    path = write_capture(tmp_path / "c.jsonl", sample_events())
    with open(path, "ab") as f:
        f.write(b'{"type": "hologram", "x": 1}\n')
    data = read_captures([path])
    assert any("unknown type 'hologram'" in w for w in data.warnings)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: p, "no such file or directory"),
        (lambda p: (p.write_bytes(b""), p)[1], "file is empty"),
        (lambda p: (p.write_bytes(b"hello world\n"), p)[1], "not a latprof capture"),
        (lambda p: (p.write_bytes(b'{"resourceSpans": []}\n'), p)[1], "OTLP"),
        (lambda p: (p.write_bytes(b'[1, 2, 3]\n'), p)[1], "not a latprof capture"),
        (lambda p: (p.write_bytes(b'{"type": "request", "request_id": "x"}\n'), p)[1], "not a latprof capture"),
        (lambda p: (p.write_bytes(orjson.dumps(make_header("run")) + b"\n"), p)[1], "holds no events"),
    ],
    ids=["missing", "empty", "text", "otlp", "array", "no-header", "header-only"],
)
def test_bad_input_is_one_clear_input_error(tmp_path, setup, message):
    path = setup(tmp_path / "c.jsonl")
    with pytest.raises(InputError) as info:
        read_captures([path])
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_empty_directory_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="holds no capture files"):
        read_captures([tmp_path])


def test_wrong_schema_version_names_both_versions(tmp_path):
    header = make_header("run")
    header["schema"] = "latprof.capture/2"
    path = write_capture(tmp_path / "c.jsonl", sample_events(), header=header)
    with pytest.raises(SchemaVersionError, match=r"latprof.capture/2 .* reads latprof.capture/1"):
        read_captures([path])


@pytest.mark.parametrize(
    "bad_line",
    [
        b"{not json}",
        b'{"type": "segment", "request_id": "r1"}',
        b'{"type": "segment", "request_id": "r1", "segment_id": "z", "name": "x", "layer": "gpu", "start_ns": 1, "end_ns": 2, "pid": 1}',
        b'{"type": "request", "request_id": "r5", "route": "GET /", "start_ns": "soon", "end_ns": 2, "pid": 1}',
        b'{"type": "segment", "request_id": "r1", "segment_id": "z", "name": "x", "layer": "tool", "start_ns": 1, "end_ns": 2, "pid": 1, "attrs": [1]}',
        # Found by the 10,000-case fuzzing: an id that is a list (unhashable) or a number got past the reader.
        b'{"type": "segment", "request_id": "r1", "segment_id": [], "name": "x", "layer": "tool", "start_ns": 1, "end_ns": 2, "pid": 1}',
        b'{"type": "segment", "request_id": "r1", "segment_id": "z", "parent_id": {"a": 1}, "name": "x", "layer": "tool", "start_ns": 1, "end_ns": 2, "pid": 1}',
        b'{"type": "segment", "request_id": 7, "segment_id": "z", "name": "x", "layer": "tool", "start_ns": 1, "end_ns": 2, "pid": 1}',
        b'{"type": "segment", "request_id": "r1", "segment_id": "z", "name": 5, "layer": "tool", "start_ns": 1, "end_ns": 2, "pid": 1}',
        b'{"type": "request", "request_id": ["r5"], "route": "GET /", "start_ns": 1, "end_ns": 2, "pid": 1}',
    ],
    ids=["json", "missing-field", "unknown-layer", "bad-int", "bad-attrs", "list-segment-id", "object-parent-id",
         "number-request-id", "number-name", "list-request-id"],
)  # fmt: skip
def test_malformed_line_before_the_end_names_file_and_line(tmp_path, bad_line):
    events = sample_events()
    lines = [orjson.dumps(make_header("run")), orjson.dumps(encode(events[0])), bad_line] + [
        orjson.dumps(encode(e)) for e in events[1:]
    ]
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(InputError, match=r"c\.jsonl:3: malformed line"):
        read_captures([path])


def test_blank_lines_are_ignored(tmp_path):
    path = write_capture(tmp_path / "c.jsonl", sample_events())
    path.write_bytes(path.read_bytes().replace(b"\n", b"\n\n", 3) + b"\n\n")
    assert len(read_captures([path]).requests) == 1


def test_gauges_without_a_value_are_skipped_with_a_warning(tmp_path):
    nan = Gauge("event_loop.lag_ms", float("nan"), T0, 7)
    path = write_capture(tmp_path / "c.jsonl", sample_events() + [nan])
    data = read_captures([path])
    assert len(data.gauges) == 1
    assert any("1 gauge reading(s) without a value" in w for w in data.warnings)


def test_attributes_are_kept_apart_whatever_the_json_spacing(tmp_path):
    # A capture written by another JSON encoder (spaces after colons): the reader shares
    # dicts only between lines whose attribute text is identical.
    import json

    lines = [json.dumps(make_header("run"))]
    for i, model in enumerate(["gpt-4o", "gpt-4o-mini", "gpt-4o"]):
        seg = Segment("r1", f"s{i}", None, "chat", "provider", T0 + i, T0 + i + 1, 7, {"gen_ai.request.model": model})
        lines.append(json.dumps(encode(seg)))
    lines.append(json.dumps(encode(Request("r1", "POST /chat", T0, T0 + 10, 7))))
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    models = [s.attrs["gen_ai.request.model"] for s in read_captures([path]).segments_by_request["r1"]]
    assert models == ["gpt-4o", "gpt-4o-mini", "gpt-4o"]


# --- one decoder: the reader's is `latprof.capture.format.decode` -----------------------------------


def test_the_reader_and_decode_give_the_same_events_for_the_same_lines(tmp_path):
    from latprof.capture.format import decode

    events = sample_events()
    data = read_captures([write_capture(tmp_path / "c.jsonl", events)])
    read = [*data.quality, *(s for segments in data.segments_by_request.values() for s in segments), *data.requests,
            *data.gauges, *data.samples]  # fmt: skip
    decoded = [decode(orjson.loads(orjson.dumps(encode(e)))) for e in events]
    assert sorted(map(repr, read)) == sorted(map(repr, decoded)) == sorted(map(repr, events))


@pytest.mark.parametrize(
    ("wire", "error"),
    [
        ({"type": "segment", "request_id": "r1", "segment_id": "s1", "name": "x", "layer": "database",
          "start_ns": 1, "end_ns": 2, "pid": 1}, ValueError),
        ({"type": "segment", "request_id": "r1", "segment_id": "s1", "name": "x", "layer": "db.pool",
          "start_ns": 1, "end_ns": 2, "pid": 1, "attrs": ["not", "an", "object"]}, TypeError),
        ({"type": "request", "request_id": "r1", "route": "GET /", "start_ns": 1, "end_ns": 2}, KeyError),
    ],
)  # fmt: skip
def test_decode_refuses_what_the_reader_refuses(tmp_path, wire, error):
    from latprof.capture.format import decode

    with pytest.raises(error):
        decode(wire)
    line = orjson.dumps(wire)
    path = tmp_path / "c.jsonl"
    path.write_bytes(orjson.dumps(make_header("run")) + b"\n" + line + b"\n" + orjson.dumps(encode(sample_events()[4])) + b"\n")
    with pytest.raises(InputError, match=":2: malformed line"):
        read_captures([path])


def test_only_the_capture_package_decodes_capture_lines():
    """No module outside latprof/capture builds events from wire dicts (one decoder, `format.decode`)."""
    import re

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"_decode_(request|segment|gauge|stack|quality)\b|\bDECODERS\b|segment_decoder\(")
    offenders = [
        str(path.relative_to(root))
        for folder in ("latprof", "collectors", "rules", "tests", "benchmarks")
        for path in (root / folder).rglob("*.py")
        if "capture" not in path.relative_to(root).parts[:2] and pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
