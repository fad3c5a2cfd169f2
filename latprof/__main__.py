"""`python -m latprof`: the same as the `latprof` command."""

from latprof.cli import entry_point

entry_point()
