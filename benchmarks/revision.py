"""A git revision of this checkout in a temporary worktree: what `--against REV` of the benchmarks times beside it."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def revision_tree(rev: str | None) -> Iterator[Path | None]:
    """A worktree of git revision `rev` in a temporary directory, removed afterwards; None when `rev` is None."""
    if rev is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="latprof-bench-rev-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), rev], cwd=ROOT, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
