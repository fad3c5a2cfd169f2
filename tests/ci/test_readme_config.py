"""The configuration docs/ci.md shows (linked from the README) is one latprof reads, as it says."""

from __future__ import annotations

import re
from pathlib import Path

from latprof.ci.config import load_config

CI_DOC = Path(__file__).resolve().parents[2] / "docs" / "ci.md"


def test_the_documented_config_example_loads_with_the_values_it_states(tmp_path: Path) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", CI_DOC.read_text(encoding="utf-8"), re.S)
    [example] = [b for b in blocks if "[tool.latprof.budget]" in b]
    path = tmp_path / "pyproject.toml"
    path.write_text(example, encoding="utf-8")
    config = load_config(path)
    assert config.budget["p99_ms"].value == 2000 and config.budget["p50_ms"].relative_pct == 10
    assert config.layer_budgets["db.pool"]["share"].value == 0.10 and config.needs_baseline
    assert [(r.route, r.limits["p99_ms"].value) for r in config.route_budgets] == [("POST /chat", 1500)]
    assert config.rule("provider-floor").level == "warning" and config.rule("provider-floor").thresholds == {"min_floor_ms": 300}
    assert config.rule("uninstrumented-gap").enabled is False
    [check] = config.checks
    assert (check.id, check.select, check.layer, check.stat, check.threshold) == ("search-p99", "segments", "tool", "p99", 300)
