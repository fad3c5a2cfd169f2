"""The local services hook tests need (PostgreSQL, Redis): skip without them on a developer box, fail in CI."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
#: The PostgreSQL the tests use, as a plain libpq URL (a SQLAlchemy `+driver` is dropped).
PG_DSN = os.environ.get("LATPROF_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test").replace("+psycopg", "")


def missing(reason: str, needed: str) -> None:
    """Skip on a developer box; under CI=true a missing service or driver (`needed`) is a failure."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: {needed} required)")
    pytest.skip(reason)


def pg_unreachable(dsn: str = PG_DSN) -> str | None:
    """Why PostgreSQL at `dsn` cannot be used, or None when it can."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed: {exc}"
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # any failure means: not usable here
        return f"PostgreSQL at {dsn} is unreachable: {type(exc).__name__}: {str(exc).strip()[:200]}"
    return None


def require_pg(dsn: str = PG_DSN) -> None:
    """Skip (or, under CI, fail) the test when PostgreSQL at `dsn` cannot be used."""
    reason = pg_unreachable(dsn)
    if reason is not None:
        missing(reason, "PostgreSQL is")
