"""latprof's exceptions, each mapped to the exit code the CLI returns.

    LatprofError                   exit 2 unless said otherwise
     ├── InputError                a capture or trace file that cannot be read
     │    └── SchemaVersionError   a capture written with a schema this version cannot read
     ├── ConfigError               a bad option or configuration value
     └── CollectorError            a collector that cannot observe (no permission, no such PID)
"""

from __future__ import annotations


class LatprofError(Exception):
    """Base of every error latprof reports to the user in one line."""

    exit_code: int = 2


class InputError(LatprofError):
    """An input file is missing, unreadable, empty or not in a format latprof reads."""


class SchemaVersionError(InputError):
    """A capture's header names a schema version this latprof cannot read."""


class ConfigError(LatprofError):
    """An option or configuration value is invalid."""


class CollectorError(LatprofError):
    """A collector cannot observe its target; the message says how to fix it."""
