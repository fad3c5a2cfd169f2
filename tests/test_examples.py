"""The bundled examples come from their documented generator, byte for byte."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_examples_are_reproduced_by_their_generator(tmp_path):
    subprocess.run([sys.executable, str(EXAMPLES / "generate.py"), "--out-dir", str(tmp_path)], check=True, capture_output=True)
    committed = sorted(p.name for p in EXAMPLES.glob("*.jsonl.gz"))
    assert committed == sorted(p.name for p in tmp_path.glob("*.jsonl.gz"))
    for name in committed:
        assert (tmp_path / name).read_bytes() == (EXAMPLES / name).read_bytes(), f"{name} differs: rerun examples/generate.py"
