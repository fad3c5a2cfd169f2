"""One recording per scenario and settings for the whole test session: the harness checks and the
verdict tests read the same files (each recording is ~10 s of a real service under load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from otlp_harness import record_otlp


@pytest.fixture(scope="session")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`record_otlp`, once per (scenario, db, settings) for the whole session."""
    cache: dict[Any, Path] = {}

    def get(scenario: str, db: str = "sqlalchemy", **settings: Any) -> Path:
        key = (scenario, db, tuple(sorted(settings.items())))
        if key not in cache:
            cache[key] = record_otlp(tmp_path_factory.mktemp(f"{scenario}-{db}"), scenario, db=db, **settings)
        return cache[key]

    return get
