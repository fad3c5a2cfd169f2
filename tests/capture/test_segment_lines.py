"""msgspec's decoding of segment lines (`latprof.capture.segment_lines`) against the general
decoder (orjson, then `latprof.capture.format.segment_decoder`): the same segment, or both
refuse the line, for the writer's own lines and for lines written otherwise."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from latprof.capture.format import encode, segment_decoder
from latprof.capture.segment_lines import SegmentLine, segment_line_reader
from latprof.events import Segment

from test_two_pass_reader import ODD_SEGMENT_LINES, _HEAD

REFUSED = {
    "unknown-layer": _HEAD.replace('"db.query"', '"no.such.layer"') + '"start_ns":5,"end_ns":9,"pid":7}',
    "attrs-a-list": _HEAD + '"start_ns":5,"end_ns":9,"pid":7,"attrs":[1]}',
    "attrs-not-utf8": (_HEAD + '"start_ns":5,"end_ns":9,"pid":7,"attrs":{"k":"').encode() + b"\xff" + b'"}}',
    "unknown-key-not-utf8": (_HEAD + '"start_ns":5,"end_ns":9,"pid":7,"x":"').encode() + b"\xc3\x28" + b'"}',
    "no-pid": _HEAD + '"start_ns":5,"end_ns":9}',
    "id-a-number": '{"type":"segment","request_id":5,"segment_id":"x","name":"n","start_ns":5,"end_ns":9,"pid":7}',
    "not-json": _HEAD + '"start_ns":5,"end_ns":9,"pid":7',
    "nan": _HEAD + '"start_ns":NaN,"end_ns":9,"pid":7}',
}


def general(line: bytes) -> tuple[str, Any]:
    try:
        return "ok", segment_decoder()(orjson.loads(line), line, None)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return "refused", type(exc).__name__


def fast(line: bytes) -> tuple[str, Any]:
    parse, build = segment_line_reader()
    try:
        return "ok", build(parse(line), line, None)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return "refused", type(exc).__name__


def _writers_lines(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    layers = [None, "app", "db.pool", "db.query", "provider", "queue", "tool"]
    values: list[Any] = ["v", "", "é\u2028", 0, -1, 2**63 - 1, 1.5, True, None, [1, "a"], {"n": {"m": [None]}}]
    out = []
    for i in range(n):
        attrs = {f"k{j}": rng.choice(values) for j in range(rng.randrange(4))}
        segment = Segment(f"r{rng.randrange(50)}\"\\", f"s{i}", rng.choice([None, "p"]), rng.choice(["SELECT 1", "chat", "ü"]),
                          rng.choice(layers), rng.randrange(-2**63, 2**63), rng.randrange(2**63), rng.randrange(2**31),
                          attrs)  # fmt: skip
        out.append(orjson.dumps(encode(segment)))
    return out


def test_the_writers_lines_are_decoded_by_msgspec_as_the_general_decoder_decodes_them() -> None:
    parse, _ = segment_line_reader()
    lines = _writers_lines(2000, seed=3)
    assert all(isinstance(parse(line), SegmentLine) for line in lines)  # the fast way is the one taken
    for line in lines:
        kind, segment = fast(line)
        assert (kind, segment) == general(line), line
        assert [type(v) for v in segment] == [type(v) for v in general(line)[1]], line


@pytest.mark.parametrize("name", [*ODD_SEGMENT_LINES, *REFUSED])
def test_a_line_written_otherwise_is_read_or_refused_as_the_general_decoder_does(name: str) -> None:
    text = ODD_SEGMENT_LINES.get(name, REFUSED.get(name))
    line = text if isinstance(text, bytes) else str(text).encode()
    expected = general(line)
    assert fast(line) == expected, (name, line)
    assert (expected[0] == "refused") == (name in REFUSED), expected
