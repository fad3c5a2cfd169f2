"""The cohort-first read of a capture (`read_captures(..., defer_segments=True)`, then
`read_deferred_segments`) against the full read, on real captures written with the writer's
encoding (`latprof.capture.format.encode` + orjson)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from latprof.analysis.timeline import build_timeline, with_read_segments
from latprof.capture.format import encode, make_header
from latprof.capture.reader import SEGMENT_LINE_PREFIX, CaptureData, read_captures, read_deferred_segments
from latprof.errors import InputError
from latprof.events import Gauge, QualityRecord, Request, Segment

T0 = 1_764_000_000_000_000_000
PID = 7


def request(rid: str, n: int = 0) -> Request:
    t = T0 + n * 1_000_000
    return Request(rid, "POST /chat", t, t + 900_000, PID, 10, 200)


def segments(rid: str, n: int = 0) -> list[Segment]:
    t = T0 + n * 1_000_000
    return [
        Segment(rid, f"{n}-pool", None, "sqlalchemy checkout", "db.pool", t + 10, t + 50, PID, {"db.client.connection.pool.name": "main"}),
        Segment(rid, f"{n}-query", f"{n}-pool", "SELECT users", "db.query", t + 50, t + 90, PID),
        Segment(rid, f"{n}-llm", None, "chat gpt-4o", "provider", t + 100, t + 800_000, PID, {"gen_ai.request.model": "gpt-4o"}),
    ]


def capture_events(ids: list[str], *, in_flight: tuple[str, ...] = ()) -> list[Any]:
    """Each request's segments (interleaved with the others', as concurrent requests write them),
    then its request line; gauges and a quality record between; `in_flight` ids have segments only."""
    events: list[Any] = [QualityRecord("hooks_loaded", T0, PID, "asgi", 1)]
    per = [segments(rid, n) for n, rid in enumerate([*ids, *in_flight])]
    for k in range(3):
        for segs in per:
            events.append(segs[k])
        events.append(Gauge("db.pool.in_use", float(k), T0 + k, PID))
    events += [request(rid, n) for n, rid in enumerate(ids)]
    return events


def line(event: Any) -> bytes:
    return orjson.dumps(encode(event))


def header() -> bytes:
    return orjson.dumps(make_header("run", pid=PID))


def write(path: Path, lines: list[bytes], *, compress: bool = False) -> Path:
    blob = b"".join(x + b"\n" for x in lines)
    path.write_bytes(gzip.compress(blob) if compress else blob)
    return path


def write_capture(path: Path, events: list[Any], *, compress: bool = False) -> Path:
    return write(path, [header()] + [line(e) for e in events], compress=compress)


def two_pass(path: Path, wanted: set[str] | None) -> CaptureData:
    data = read_captures([path], defer_segments=True)
    read_deferred_segments(data, wanted)
    return data


def assert_same_but_segments(full: CaptureData, two: CaptureData) -> None:
    assert two.requests == full.requests and two.gauges == full.gauges and two.quality == full.quality
    assert two.samples == full.samples and two.headers == full.headers and two.warnings == full.warnings


def test_two_passes_read_the_wanted_requests_segments_as_the_full_read_does(tmp_path: Path) -> None:
    ids = [f"r{n}" for n in range(6)]
    path = write_capture(tmp_path / "c.jsonl", capture_events(ids))
    full = read_captures([path])
    first = read_captures([path], defer_segments=True)
    assert first.deferred_segments == 18 and first.segments_by_request == {} and first.deferred_inputs == [str(path)]
    assert first.event_count == full.event_count
    wanted = {"r1", "r4"}
    read_deferred_segments(first, wanted)
    assert_same_but_segments(full, first)
    assert first.segments_by_request == {rid: full.segments_by_request[rid] for rid in wanted}
    assert first.segment_count == 6 and first.orphan_deferred == 0
    # one string object per request, as in the full read
    assert all(s.request_id is first.segments_by_request["r1"][0].request_id for s in first.segments_by_request["r1"])


ODD_IDS = ['say "hi"', "C:\\tmp\\x", "tab\there", "nl\nid", "\x01ctl", "café-ü", "日本-\U0001f600", "\u2028sep", "a\\", "plain"]


def test_ids_the_writer_escapes_or_writes_in_utf8_are_matched(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "c.jsonl", capture_events(ODD_IDS, in_flight=('gone "x"', "gone\\y", "gone-é")))
    raw = path.read_bytes()
    assert b'say \\"hi\\"' in raw and b"C:\\\\tmp" in raw and "café".encode() in raw  # escaped, and raw UTF-8
    full = read_captures([path])
    for wanted in ({'say "hi"', "C:\\tmp\\x", "nl\nid"}, {"café-ü", "日本-\U0001f600", "\u2028sep", "\x01ctl"},
                   {"tab\there", "a\\", "plain"}):  # fmt: skip
        two = two_pass(path, wanted)
        assert two.segments_by_request == {rid: full.segments_by_request[rid] for rid in wanted}, wanted
        assert two.orphan_deferred == 9  # the three in-flight requests' segments, escaped or not
        assert_same_but_segments(full, two)


def test_a_torn_last_segment_line_is_warned_about_once_and_not_read(tmp_path: Path) -> None:
    events = capture_events(["r1", "r2"])
    torn = line(Segment("r1", "torn", None, "SELECT late", "db.query", T0 + 5, T0 + 6, PID))[:-25]
    path = write(tmp_path / "c.jsonl", [header(), *map(line, events), torn])
    assert torn.startswith(SEGMENT_LINE_PREFIX)
    full = read_captures([path])
    two = two_pass(path, {"r1"})
    torn_warnings = [w for w in two.warnings if "torn" in w]
    assert len(torn_warnings) == 1
    assert torn_warnings[0].startswith(f"{path}:{len(events) + 2}: skipped a torn last line (not valid JSON: ")
    # orjson's position of the end of data may differ between two parses of the same bytes (seen: "line 2
    # column 1 (char 157)" and "line 1 column 157 (char 156)"): the same warning up to it
    assert [w.split(" (not valid JSON: ")[0] for w in two.warnings] == [w.split(" (not valid JSON: ")[0] for w in full.warnings]
    assert two.segments_by_request == {"r1": full.segments_by_request["r1"]}
    assert "torn" not in {s.segment_id for s in two.segments_by_request["r1"]}
    assert two.deferred_segments == 6 and two.orphan_deferred == 0


# Segment lines in the writer's form (its prefix) written otherwise than the writer writes them: the general
# reader takes each (a number in a string, a float, a bool, a key it does not know, an integer past 63 bits,
# null or missing attributes, a key written with an escape, a key twice), and the second pass - which decodes
# the writer's plain form with msgspec and the rest the general way - must read each as it does.
_HEAD = '{"type":"segment","request_id":"r1","segment_id":"x","parent_id":null,"name":"SELECT 1","layer":"db.query",'
ODD_SEGMENT_LINES = {
    "plain": _HEAD + '"start_ns":5,"end_ns":9,"pid":7,"attrs":{"k":"v"}}',
    "number-in-a-string": _HEAD + '"start_ns":"5","end_ns":9,"pid":7}',
    "float": _HEAD + '"start_ns":5.0,"end_ns":9.75,"pid":7}',
    "bool-pid": _HEAD + '"start_ns":5,"end_ns":9,"pid":true}',
    "unknown-key": _HEAD + '"start_ns":5,"end_ns":9,"pid":7,"note":[1,{"a":null}],"attrs":{}}',
    "past-63-bits": _HEAD + '"start_ns":5,"end_ns":18446744073709551615,"pid":7}',
    "past-64-bits": _HEAD + '"start_ns":5,"end_ns":184467440737095516150,"pid":7}',
    "null-attrs": _HEAD + '"start_ns":5,"end_ns":9,"pid":7,"attrs":null}',
    "escaped-key": _HEAD + '"start_ns":5,"end_ns":9,"p\\u0069d":8}',
    "key-twice": _HEAD + '"start_ns":5,"end_ns":9,"pid":7,"name":"SELECT 2","attrs":{"a":1,"a":2}}',
    "big-int-in-attrs": _HEAD + '"start_ns":5,"end_ns":9,"pid":7,"attrs":{"n":18446744073709551616}}',
    "whitespace": _HEAD + '"start_ns": 5 ,"end_ns":9,"pid":7,"attrs": { "k" : "v" } }',
}


@pytest.mark.parametrize("odd", list(ODD_SEGMENT_LINES), ids=list(ODD_SEGMENT_LINES))
def test_a_segment_line_written_otherwise_is_read_by_the_second_pass_as_the_full_read_does(tmp_path: Path, odd: str) -> None:
    events = capture_events(["r1", "r2"])
    path = write(tmp_path / "c.jsonl", [header(), ODD_SEGMENT_LINES[odd].encode(), *map(line, events)])
    full = read_captures([path])
    odd_segment = full.segments_by_request["r1"][0]
    assert odd_segment.segment_id == "x", full.segments_by_request["r1"]
    two = two_pass(path, {"r1"})
    assert two.segments_by_request == {"r1": full.segments_by_request["r1"]}
    assert [type(v) for v in two.segments_by_request["r1"][0]] == [type(v) for v in odd_segment]
    assert_same_but_segments(full, two)


@pytest.mark.parametrize("bad", [
    pytest.param(b',"layer":"no.such.layer"}', id="unknown-layer"),
    pytest.param(b',"start_ns":"soon"}', id="bad-number"),
    pytest.param(b',oops}', id="not-json"),
    # a key the writer does not write, whose value orjson refuses: msgspec would skip it unchecked
    pytest.param(b',"note":"\xff\xfe"}', id="not-utf8-in-an-unknown-key"),
    pytest.param(b',"note":1e400}', id="out-of-range-float-in-an-unknown-key"),
    pytest.param(b',"attrs":' + b'[' * 1100 + b']' * 1100 + b'}', id="attrs-nested-too-deep"),
])  # fmt: skip
def test_a_malformed_segment_line_in_the_writers_form_is_skipped_by_the_two_passes(tmp_path: Path, bad: bytes) -> None:
    """A malformed segment line in the middle of a capture, in the writer's form (its prefix, its
    closing brace): the full read refuses the capture (InputError naming the line). The first pass
    defers the line unparsed, so it sees no damage; the second parses it only if its request is
    wanted, and then skips it without a word (no warning, no error): what the two passes read
    is the full read of the capture without that line."""
    events = capture_events(["r1", "r2"])
    good = line(Segment("r1", "bad", None, "SELECT x", "db.query", T0 + 5, T0 + 6, PID))
    malformed = good[:-1] + bad  # a key repeated last wins in orjson: a wrong value, or not JSON at all
    lines = [header(), *map(line, events[:4]), malformed, *map(line, events[4:])]
    path = write(tmp_path / "c.jsonl", lines)
    with pytest.raises(InputError, match=rf"^{path}:6: malformed line"):
        read_captures([path])
    without = read_captures([write(tmp_path / "without.jsonl", lines[:5] + lines[6:])])
    for wanted in ({"r1"}, {"r2"}, None):
        two = two_pass(path, wanted)
        assert two.deferred_segments == 7 and two.warnings == []
        assert two.segments_by_request == {rid: v for rid, v in without.segments_by_request.items() if wanted is None or rid in wanted}
        assert two.requests == without.requests and two.gauges == without.gauges


def test_segments_of_requests_not_in_the_capture_are_counted_as_orphans_and_warned_about(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "c.jsonl", capture_events(["r1", "r2"], in_flight=("late1", "late2")))
    full_timeline = build_timeline(read_captures([path]))
    two = two_pass(path, {"r1"})
    assert two.orphan_deferred == 6 and "late1" not in two.segments_by_request
    timeline = build_timeline(two)
    assert timeline.orphan_segments == full_timeline.orphan_segments == 6
    warning = "6 segment(s) belong to some request(s) that had not completed when collection stopped; left out"
    assert warning in timeline.warnings
    assert [r.request.request_id for r in timeline.requests] == ["r1", "r2"]
    assert [s.segment_id for s in timeline.requests[0].segments] == ["0-pool", "0-query", "0-llm"]


def test_a_gzip_capture_is_read_in_two_passes(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "c.jsonl.gz", capture_events(["r1", "r2", "é\"3"]), compress=True)
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    full = read_captures([path])
    two = two_pass(path, {"r2", 'é"3'})
    assert two.deferred_segments == 9 and two.deferred_inputs == [str(path)]
    assert two.segments_by_request == {rid: full.segments_by_request[rid] for rid in ("r2", 'é"3')}
    assert_same_but_segments(full, two)


def test_segment_lines_in_another_form_are_read_in_the_first_pass(tmp_path: Path) -> None:
    events = capture_events(["r1", "r2"])
    lines = [header()]
    for event in events:
        if isinstance(event, Segment) and event.request_id == "r2":
            lines.append(orjson.dumps(dict(reversed(list(encode(event).items())))))  # keys in another order
        elif isinstance(event, Segment) and event.segment_id == "0-llm":
            lines.append(json.dumps(encode(event)).encode())  # stdlib JSON's spaced form
        else:
            lines.append(line(event))
    path = write(tmp_path / "c.jsonl", lines)
    full = read_captures([path])
    first = read_captures([path], defer_segments=True)
    assert first.deferred_segments == 2  # r1's first two, in the writer's form
    assert first.segments_by_request == {"r1": [full.segments_by_request["r1"][2]], "r2": full.segments_by_request["r2"]}
    read_deferred_segments(first, {"r2"})  # r1 is not wanted: what the first pass read of it stays
    assert first.segments_by_request == {"r1": [full.segments_by_request["r1"][2]], "r2": full.segments_by_request["r2"]}
    assert first.segment_count == 4


def test_wanting_none_reads_every_segment_as_the_full_read_does(tmp_path: Path) -> None:
    path = write_capture(tmp_path / "c.jsonl", capture_events(ODD_IDS, in_flight=("late",)))
    full = read_captures([path])
    two = two_pass(path, None)
    assert two.segments_by_request == full.segments_by_request and len(two.segments_by_request) == len(ODD_IDS) + 1
    assert two.segment_count == full.segment_count == 33 and two.deferred_segments == 33
    assert two.orphan_deferred == 0  # read whole: counted by the timeline like the full read's
    assert build_timeline(two).orphan_segments == build_timeline(full).orphan_segments == 3
    assert_same_but_segments(full, two)


# --- found by the capture_two_pass fuzz target (fixed in the reader) ---


def test_a_prefixed_line_with_a_cr_or_blank_after_its_brace_is_read_once(tmp_path: Path) -> None:
    lines = [header(), line(request("r1")), *(line(s) for s in segments("r1")), line(request("r2"))]
    lines[3] += b"\r"  # a CR (or a blank) after its brace: still in the writer's form at its start, deferred
    lines[4] += b" "
    path = write(tmp_path / "c.jsonl", lines)
    full, two = read_captures([path]), two_pass(path, {"r1"})
    assert two.deferred_segments == 3
    assert two.segments_by_request["r1"] == full.segments_by_request["r1"]  # each once, in file order
    assert two.segment_count == 3


def test_segments_of_one_request_in_two_forms_keep_their_file_order(tmp_path: Path) -> None:
    segs = segments("r1")
    lines = [header(), line(request("r1")), line(segs[0]), json.dumps(encode(segs[1])).encode(), line(segs[2])]
    path = write(tmp_path / "c.jsonl", lines)
    assert two_pass(path, {"r1"}).segments_by_request == read_captures([path]).segments_by_request


def test_an_escaped_id_is_not_taken_for_the_id_its_escape_starts_like(tmp_path: Path) -> None:
    # 'q"' is written q\" : its line's bytes up to the next quote are q\ , the id of another request
    path = write_capture(tmp_path / "c.jsonl", [request('q"'), request("q\\"), *segments('q"'), *segments("q\\", 1)])
    two = two_pass(path, {'q"'})
    assert two.segments_by_request.get('q"') == read_captures([path]).segments_by_request['q"']


def test_a_last_line_torn_after_a_brace_is_warned_about(tmp_path: Path) -> None:
    torn = line(segments("r1")[0])[:-1]  # torn inside its attrs: ends in the attrs' brace
    path = write(tmp_path / "c.jsonl", [header(), line(request("r1")), torn])
    assert torn.endswith(b"}")
    two, full = two_pass(path, {"r1"}).warnings, read_captures([path]).warnings
    assert [w.split(" (")[0] for w in two] == [w.split(" (")[0] for w in full] != []


def test_a_truncated_gzip_capture_is_read_up_to_the_cut(tmp_path: Path) -> None:
    ids = [f"r{n}-{n * 7919 % 100003}" for n in range(3000)]  # enough lines for the full read to reach some before the cut
    blob = b"".join(x + b"\n" for x in [header(), *(line(e) for rid in ids for e in (segments(rid)[1], request(rid)))])
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(blob, mtime=0)[:-30])  # a writer killed before its gzip stream ended
    full = read_captures([path])
    assert len(full.requests) > 1000 and "compressed stream is truncated" in full.warnings[0]
    two = two_pass(path, set(ids[:100]))
    assert two.requests == full.requests


def test_the_first_timeline_with_the_second_pass_segments_is_the_timeline_built_again(tmp_path: Path) -> None:
    """`with_read_segments` adds what the second pass read to the first pass's timeline: the same timeline as
    `build_timeline` makes of everything read - with a request recorded twice, one that ends before it starts,
    segments of requests in flight at the end (in lines of both passes: one not in the writer's form is read by
    the first) and a quality note among them; when the reader's warnings changed between the passes, the
    timeline is built again."""
    ids = [f"{n:032x}" for n in range(30)]
    events = capture_events(ids, in_flight=("e" * 32, "f" * 32))
    events += [request(ids[4], 40), Request("b" * 32, "GET /", T0 + 9, T0 + 1, PID), *segments("b" * 32, 41),
               QualityRecord("hook_error", T0, PID, "a hook failed", 2)]  # fmt: skip
    # the keys in another order: not deferred, read by the first pass (one of a request picked, one in flight)
    early = [encode(segments(ids[3], 3)[0]), encode(segments("d" * 32, 42)[0])]
    lines = [header(), *map(line, events), *(orjson.dumps(dict(reversed(list(e.items())))) for e in early),
             line(Segment("f" * 32, "late-f", None, "in flight", "db.query", T0, T0 + 5, PID)), line(request(ids[0], 50))]
    path = write(tmp_path / "mixed.jsonl", lines)
    data = read_captures([path], defer_segments=True)
    first = build_timeline(data)
    read_deferred_segments(data, set(ids[::3]))
    again = build_timeline(data)
    assert again.orphan_segments > first.orphan_segments > 0
    assert len(again.warnings) >= 4 and any("recorded twice" in w for w in again.warnings)
    assert with_read_segments(first, data) == again
    data.warnings.append("a warning between the passes")
    assert with_read_segments(first, data) == build_timeline(data)
