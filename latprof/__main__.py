"""`python -m latprof`: the same as the `latprof` command."""

from latprof.cli import run

run()
