"""`latprof analyze` on damaged and odd files of every input format, end to end: exit 0, or exit 2
with one line on stderr, never a traceback nor an internal error."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_strategies import damaged_bytes, targets
from fuzzing import MEMORY_BYTES, fuzz_cases, limit_memory, long_marks

pytestmark = long_marks()

READERS = ("capture", "otlp_json", "otlp_proto", "jaeger_json", "zipkin_json")
#: Seconds one `latprof analyze` may take on a small file (its start-up included) on a loaded machine.
ANALYZE_SECONDS = 30


def cases() -> st.SearchStrategy[tuple[str, bytes]]:
    """(file name, bytes) of any reader's structure-aware or byte-mutated cases."""
    options = []
    for target in READERS:
        strategy, seeds, name = targets()[target]
        options.append(st.tuples(st.just(name), strategy()))
        options.append(st.tuples(st.just(name), damaged_bytes(seeds())))
    return st.one_of(options)


def test_analyze_exits_0_or_2_with_one_line(tmp_path: Path) -> None:
    count = min(1000, max(10, fuzz_cases(400) // 4))
    exits: dict[int, int] = {}
    began = time.monotonic()

    @settings(max_examples=count)
    @given(cases())
    def case(drawn: tuple[str, bytes]) -> None:
        name, data = drawn
        path = tmp_path / name
        path.write_bytes(data)
        done = subprocess.run(
            [sys.executable, "-m", "latprof", "analyze", str(path)], capture_output=True, text=True,
            timeout=ANALYZE_SECONDS, preexec_fn=limit_memory(MEMORY_BYTES), cwd=tmp_path,
        )  # fmt: skip
        exits[done.returncode] = exits.get(done.returncode, 0) + 1
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
        assert done.returncode in (0, 2), (done.returncode, done.stderr[-2000:])
        if done.returncode == 2:
            assert done.stderr.count("\n") == 1 and done.stderr.startswith("latprof: error: "), done.stderr

    case()
    seconds = time.monotonic() - began
    print(f"\nfuzz analyze end to end: {sum(exits.values())} runs in {seconds:.1f} s; exit codes {exits}")
    assert exits.get(2, 0) > 0 and exits.get(0, 0) > 0, exits  # both outcomes exercised
