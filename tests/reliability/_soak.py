"""The soak's machinery for the tests: `benchmarks/soak.py` (the documented 10-minute command), imported.

Not a test module: `from _soak import ...` (pytest puts this folder on sys.path for its tests).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from soak import CHUNK_S, CONTROL, FLOOR_MS, LATENCY_RATIO, MAX_SAMPLE_GAP_S, MODES, RSS_GROWTH_MB, SoakResult, soak  # noqa: E402

#: The soak's load per mode: 60 s here and in CI; the 10-minute run is `python benchmarks/soak.py`
#: (or LATPROF_SOAK_SECONDS=600 with these tests).
SOAK_S = float(os.environ.get("LATPROF_SOAK_SECONDS", "60"))

__all__ = ["CHUNK_S", "CONTROL", "FLOOR_MS", "LATENCY_RATIO", "MAX_SAMPLE_GAP_S", "MODES", "RSS_GROWTH_MB", "SOAK_S", "SoakResult", "soak"]
