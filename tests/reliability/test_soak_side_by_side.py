"""Soak: the demo service (FastAPI, SQLAlchemy on PostgreSQL, the openai client against a local
provider) with latprof in it (`latprof run`, every hook) or sampling it (`latprof attach`),
under steady load for `LATPROF_SOAK_SECONDS` (60 s here and in CI; the 10-minute run is
`python benchmarks/soak.py`), side by side with the same service without latprof: one stream
of arrivals sent to the two in turn, request by request (`benchmarks/soak.py` says how and why).

What must hold: the observed service's RSS grows by at most 10 MB after its warm-up; no
request fails on either side; p50 and p99 of all the soak's requests of a side (pooled,
nearest rank) at most 5% above the plain service's (in the 10-minute run; the 60 s variant holds
p50 to 10% and p99 to 50%: `SHORT_BOUNDS`); no traceback and nothing from latprof in
its log; latprof exits as the service does. `run`: the capture holds every request the client
sent (none is sampled out at this rate: the roots' weights add up to the requests), and
latprof recorded no dropped event and no error of its own. `attach`: the capture has samples
throughout the soak (no hole longer than py-spy's restart between two of its recordings).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _soak import CHUNK_S, FLOOR_MS, LATENCY_RATIO, MAX_SAMPLE_GAP_S, RSS_GROWTH_MB, SOAK_S, SoakResult, soak
from services import PG_DSN, require_pg

from latprof.collectors.hooks.bootstrap import hook_names

pytestmark = [pytest.mark.slow, pytest.mark.long]


def _soaked(mode: str, tmp_path: Path) -> SoakResult:
    """The soak of `mode`, its figures printed; what must hold whatever the mode, but the latency."""
    require_pg()
    result = soak(mode, SOAK_S, tmp_path, dsn=PG_DSN)
    print("\n".join(result.lines()))
    o, p = result.observed, result.plain
    assert o.done > 0 and abs(o.done - p.done) <= math.ceil(SOAK_S / CHUNK_S)  # alternate arrivals, each chunk from A
    assert o.errors == p.errors == result.other_errors == 0, o.error_samples + p.error_samples
    assert result.rss_end_mb - result.rss_warm_mb <= RSS_GROWTH_MB, (result.rss_warm_mb, result.rss_end_mb)
    assert not result.log_problems, result.observed_log[-3000:]
    assert result.latprof_exit == result.expected_exit, result.latprof_stderr
    return result


#: The bounds of the 60 s variant (CI), looser than the targets the 10-minute run holds (LATENCY_RATIO, 5%):
#: over 1,200 requests a side p99 is the 12th-slowest request, and on 2 shared cores a burst of other work
#: during a few of them moved it by 10-30% either way in plain-against-plain and latprof runs alike
#: (docs/reliability.md). Loose enough not to fail on noise, tight enough to catch a hook that blocks.
SHORT_BOUNDS = {50: 1.10, 99: 1.50}


def _assert_latency_unchanged(result: SoakResult) -> None:
    """p50 and p99 of all the soak's requests of each side, pooled (nearest rank): observed / plain <= 1.05
    for a soak of 10 minutes or more, `SHORT_BOUNDS` for a shorter one."""
    for q in (50, 99):
        bound = LATENCY_RATIO if SOAK_S >= 600 else SHORT_BOUNDS[q]
        assert result.ratio(q) <= bound, (
            f"p{q} {result.observed.p(q):.2f} ms with latprof, {result.plain.p(q):.2f} ms without"
            f" (per {result.block_s:g} s window: {[round(r, 3) for r in result.pair_ratios(q)]};"
            f" the plain p50 is {result.plain.p(50) / FLOOR_MS:.2f}x the provider's fixed wait)"
        )


def test_soak_under_latprof_run_with_every_hook(tmp_path: Path) -> None:
    result = _soaked("run", tmp_path)
    assert sorted(result.hooks_loaded) == hook_names() and result.quality.get("hooks_loaded") == 1  # one process
    answered = result.observed.done + result.other_done  # the soak and the warm-up
    assert result.roots == result.represented == answered, (result.roots, result.represented, answered)
    assert not result.quality.get("dropped") and not result.quality.get("error"), result.quality
    _assert_latency_unchanged(result)


def test_soak_under_latprof_attach_sampling(tmp_path: Path) -> None:
    result = _soaked("attach", tmp_path)
    assert result.samples > 0 and result.longest_gap_s <= MAX_SAMPLE_GAP_S, result.longest_gap_s
    assert result.attach_report is not None and result.attach_report["source"]["kind"] == "attach"
    _assert_latency_unchanged(result)
