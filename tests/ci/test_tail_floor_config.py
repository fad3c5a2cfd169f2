"""`min_tail_excess_ms` in the config reaches the verdict of `latprof analyze` (docs/layers.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pool_held_across_llm.jsonl.gz"


def analyze(cwd: Path) -> dict:
    result = subprocess.run([sys.executable, "-m", "latprof", "analyze", "--format", "json", str(EXAMPLE)],
                            cwd=cwd, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_configured_floor_above_the_tail_excess_leaves_no_verdict(tmp_path):
    plain = analyze(tmp_path)
    assert plain["verdict"]["layer"] == "db.pool"
    (tmp_path / "latprof.toml").write_text("min_tail_excess_ms = 5000\n")
    floored = analyze(tmp_path)
    assert floored["verdict"]["layer"] is None, floored["verdict"]
    assert "min_tail_excess_ms" in floored["verdict"]["summary"]
    (tmp_path / "latprof.toml").write_text("min_tail_excess_ms = 1\n")
    assert analyze(tmp_path)["verdict"]["layer"] == "db.pool"
