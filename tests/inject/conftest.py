"""What the --inject tests need: gdb (skipped with the reason on a developer box without it;
under CI=true a missing gdb fails: `.ci/run` installs it)."""

from __future__ import annotations

import shutil

import pytest
from services import missing


@pytest.fixture(scope="session", autouse=True)
def _gdb() -> None:
    if shutil.which("gdb") is None:
        missing("gdb is not installed: the --inject tests need it (Debian/Ubuntu: apt-get install gdb)", "gdb")
