"""The bundled examples come from their documented generator, line for line."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_examples_are_reproduced_by_their_generator(tmp_path):
    subprocess.run([sys.executable, str(EXAMPLES / "generate.py"), "--out-dir", str(tmp_path)], check=True, capture_output=True)
    committed = sorted(p.name for p in EXAMPLES.glob("*.jsonl.gz"))
    assert committed == sorted(p.name for p in tmp_path.glob("*.jsonl.gz"))
    for name in committed:
        # Compare the content: gzip's header names the OS, which differs between Python versions.
        fresh, kept = gzip.decompress((tmp_path / name).read_bytes()), gzip.decompress((EXAMPLES / name).read_bytes())
        assert fresh == kept, f"{name} differs: rerun examples/generate.py"
