"""The `latprof` command line: parse options, call the library, render. No logic of its own.

One module per command (`latprof check` is `latprof/cli/check.py`); the click group, the
options they share and the error handling are in `_common.py`.
"""

from __future__ import annotations

import os
import sys

from latprof.cli import analyze, attach, check, demo, diff, export, receive, rules, run, top  # noqa: F401  (registers the commands)
from latprof.cli._common import EXIT_INTERNAL, main

__all__ = ["EXIT_INTERNAL", "entry_point", "main"]


def entry_point() -> None:
    """The `latprof` console script: `main`, then exit without tearing down the heap.

    A diagnosed capture can hold millions of objects; freeing them one by one at exit took
    longer than some analysis steps, and nothing is left to do by then but flush the output.
    """
    code: int
    try:
        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # `latprof ... | head`: the reader went away
        code = code or 1
    os._exit(code)
