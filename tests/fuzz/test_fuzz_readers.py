"""Every input reader fed junk: real documents with odd values put in (Hypothesis, structure-aware)
and real files damaged byte by byte; each case read in a child process under a memory limit and
a time limit, and it must end in spans (with warnings) or latprof's one-line input error.

Cases per target and way: `LATPROF_FUZZ_CASES` (default sized for CI); the long run is
`LATPROF_FUZZ_CASES=10000 python -m pytest tests/fuzz` (a run of its own: not left out as long).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings

from fuzz_strategies import damaged_bytes, targets
from fuzzing import Sandbox, fuzz_cases, long_marks

pytestmark = long_marks()

#: Cases per target and way in CI: 12 runs of this many fit the 5-minute budget with the end-to-end run.
CI_CASES = 400


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with Sandbox(tmp_path_factory.mktemp("fuzz")) as box:
        yield box


def _run(sandbox: Sandbox, target: str, label: str, cases: int, strategy: Any, name: str) -> None:
    before = (sandbox.cases, dict(sandbox.outcomes))

    @settings(max_examples=cases)
    @given(strategy)
    def case(drawn: Any) -> None:
        file_name, data = drawn if isinstance(drawn, tuple) else (name, drawn)
        outcome = sandbox.read(target, data, file_name)
        assert not outcome.failed, f"{target} {outcome.kind} on a {len(data)}-byte {file_name}:\n{outcome.detail}"

    began = time.monotonic()
    case()
    seconds = time.monotonic() - began
    ran = sandbox.cases - before[0]
    outcomes = {k: v - before[1].get(k, 0) for k, v in sandbox.outcomes.items() if v - before[1].get(k, 0)}
    print(f"\nfuzz {target} {label}: {ran} cases in {seconds:.1f} s ({ran / seconds:.0f}/s): {outcomes}")
    # both outcomes exercised: junk that every reader refused (or read) would test little
    assert outcomes.get("error", 0) > 0, outcomes


@pytest.mark.parametrize("target", list(targets()))
def test_odd_values_in_real_documents(sandbox: Sandbox, target: str) -> None:
    strategy, _, name = targets()[target]
    _run(sandbox, target, "structure-aware", fuzz_cases(CI_CASES), strategy(), name)


@pytest.mark.parametrize("target", list(targets()))
def test_real_files_damaged_byte_by_byte(sandbox: Sandbox, target: str) -> None:
    _, seeds, name = targets()[target]
    _run(sandbox, target, "byte mutation", fuzz_cases(CI_CASES), damaged_bytes(seeds()), name)
