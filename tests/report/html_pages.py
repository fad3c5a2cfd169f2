"""What the HTML report tests share: captures with hostile text, the CLI, and reading a page's parts.

Not a test module: `from report.html_pages import ...` (tests/ is on sys.path, see tests/conftest.py).
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
from pathlib import Path

from latprof.capture.writer import CaptureWriter
from latprof.events import Gauge, Request, Segment
from latprof.semconv import DB_POOL_NAME

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.jsonl.gz"))
OTLP_FIXTURES = sorted((ROOT / "tests" / "collectors" / "traces" / "fixtures" / "otlp").glob("*.otlp.json"))

#: Text a capture might carry that would run, load or break out of an attribute if it were not escaped.
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>"\'&'
#: A statement text and a URL query only `--include-attributes` may show.
STATEMENT = "SELECT secret_column FROM accounts WHERE id = 42"
URL = "https://api.internal/v1/search?q=private-words"


def latprof(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "latprof", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def hostile_capture(path: Path, requests: int = 120) -> Path:
    """A capture written by the real writer: every name a hostile string, a db.pool tail (every
    20th request waits 400 ms for a connection), statements and URLs on the segments."""
    origin = 1_764_000_000 * 10**9
    ms = 1_000_000
    pool = {DB_POOL_NAME: f"pool {HOSTILE}"}
    writer = CaptureWriter(path, flush_interval_s=0.05)
    try:
        for i in range(requests):
            rid = f"r{i:04d}"
            start = origin + i * 50 * ms
            wait = 400 * ms if i % 20 == 19 else 2 * ms
            t = start + ms
            writer.emit(Segment(rid, f"{rid}-w", None, f"checkout {HOSTILE}", "db.pool", t, t + wait, 1, pool))
            t += wait
            writer.emit(Segment(rid, f"{rid}-q", None, f"SELECT {HOSTILE}", "db.query", t, t + 5 * ms, 1,
                                {"db.system.name": "postgresql", "db.query.text": STATEMENT, "db.query.summary": f"SELECT {HOSTILE}"}))  # fmt: skip
            t += 5 * ms
            writer.emit(Segment(rid, f"{rid}-t", None, f"tool {HOSTILE}", "tool", t, t + 30 * ms, 1,
                                {"url.full": URL, "server.address": "api.internal", "http.response.status_code": 200}))  # fmt: skip
            t += 30 * ms
            writer.emit(Request(rid, f"POST /chat/{HOSTILE}", start, t + ms, 1, 1 * ms, 200))
            writer.emit(Gauge("db.client.connection.count", 3.0 if i % 20 == 19 else 1.0, t, 1, {**pool, "db.client.connection.state": "used"}))
    finally:
        writer.close()
    return path


def inline(page: str, tag: str) -> list[str]:
    """The text of every inline `<tag>` element of a page."""
    return re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S)


def csp_of(page: str) -> str:
    found = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)"', page)
    assert found, "no Content-Security-Policy meta element"
    return found.group(1).replace("&#x27;", "'")


def sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"
