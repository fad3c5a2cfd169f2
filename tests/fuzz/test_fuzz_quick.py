"""A few fuzz cases of every reader in the fast subset (the many are in test_fuzz_readers.py, marked long)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import given, settings

from fuzz_strategies import damaged_bytes, targets
from fuzzing import MEMORY_BYTES, Sandbox

#: Cases per target and way: a smoke test of the strategies and the sandbox, a few seconds in all.
QUICK_CASES = 25


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox(tmp_path_factory.mktemp("quick")) as box:
        yield box


@pytest.mark.parametrize("target", list(targets()))
def test_a_few_odd_and_damaged_files_are_read_or_an_input_error(sandbox: Sandbox, target: str) -> None:
    strategy, seeds, name = targets()[target]
    for drawn_from in (strategy(), damaged_bytes(seeds())):

        @settings(max_examples=QUICK_CASES)
        @given(drawn_from)
        def case(drawn: Any) -> None:
            file_name, data = drawn if isinstance(drawn, tuple) else (name, drawn)
            outcome = sandbox.read(target, data, file_name)
            assert not outcome.failed, f"{target} {outcome.kind}:\n{outcome.detail}"

        case()


def test_the_sandbox_reports_a_hang_a_blowup_and_a_crash(tmp_path: Path) -> None:
    # the harness must be able to fail: a reader that loops, one that eats memory, one that dies
    with Sandbox(tmp_path, case_seconds=0.5, memory_bytes=MEMORY_BYTES) as box:
        hang = box.read("selftest", b"hang", "x")
        memory = box.read("selftest", b"memory", "x")
        crash = box.read("selftest", b"crash", "x")
        after = box.read("otlp_json", b"{}", "y.json")
    assert hang.kind == "hang" and memory.kind == "memory" and crash.kind == "crash", (hang, memory, crash)
    assert after.kind == "error"

