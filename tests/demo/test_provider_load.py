"""The demo provider's decode under load setting: validated, and settable per request (its timing: tests/rules/test_long_decode_under_load_e2e.py)."""

from __future__ import annotations

import math

import pytest

from latprof.demo.provider import ProviderConfig, _parser


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_negative_or_non_finite_slowdown_per_stream_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="tpot_ms_per_stream_in_flight"):
        ProviderConfig(tpot_ms_per_stream_in_flight=bad)


def test_the_slowdown_per_stream_is_off_by_default_and_set_per_request_or_on_the_command_line() -> None:
    assert ProviderConfig().tpot_ms_per_stream_in_flight == 0.0
    assert ProviderConfig().with_overrides({"tpot_ms_per_stream_in_flight": "2.5"}).tpot_ms_per_stream_in_flight == 2.5
    args = vars(_parser().parse_args(["--tpot-ms-per-stream-in-flight", "4"]))
    assert args["tpot_ms_per_stream_in_flight"] == 4.0
