"""Agent tool calls end to end: sequential independent calls fire sequential-tool-calls; parallel, dependent and agent-loop calls do not."""

from __future__ import annotations

import http.server
import json
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from apps.harness import ROOT, Capture, Server, get

from latprof.demo.provider import Provider
from latprof.layers import TOOL
from latprof.semconv import TOOL_DEPENDS_ON

pytestmark = pytest.mark.slow  # a real server in a subprocess

APP = "tests.collectors.hooks.apps.tools_app:app"
LOOKUP_MS = 120


class _Lookups(http.server.BaseHTTPRequestHandler):
    """`GET /tool/KIND[?of=ID]`: an id after LOOKUP_MS (the tools the agent calls)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        kind = parts.path.rsplit("/", 1)[-1]
        of = parse_qs(parts.query).get("of", [""])[0]
        time.sleep(LOOKUP_MS / 1000)
        body = json.dumps({"kind": kind, "of": of, "id": f"{kind[:4]}_{random.randint(10_000, 99_999)}"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def run_service(tmp_path, slow_shapes: list[str], via: str = "httpx") -> tuple[Capture, dict[str, Any]]:
    """The tools app under latprof run; 1 request in 6 takes a slow shape (in turn); its report.
    `via=langchain`: the lookups are calls of a LangChain tool (the agent_tools hook)."""
    lookups = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Lookups)
    threading.Thread(target=lookups.serve_forever, daemon=True).start()
    try:
        with Provider(ttft_ms=40, tpot_ms=1, output_tokens=4) as provider:
            env = {"TOOLS_APP_BASE": f"http://127.0.0.1:{lookups.server_address[1]}", "TOOLS_APP_PROVIDER": provider.url}
            server = Server(APP, "asyncio", "h11", tmp_path, env=env).start()
            try:
                with ThreadPoolExecutor(6) as pool:
                    futures = []
                    for k in range(84):
                        shape = slow_shapes[(k // 6) % len(slow_shapes)] if k % 6 == 5 else "fast"
                        futures.append(pool.submit(get, server.port, f"/ask?shape={shape}&via={via}"))
                        time.sleep(0.09)
                    assert [f.result().status for f in futures] == [200] * len(futures)
                server.stop()
            finally:
                server.kill()
    finally:
        lookups.shutdown()
        lookups.server_close()
    out = subprocess.run(
        [sys.executable, "-m", "latprof", "analyze", "--format", "json", "--skip-warmup", "0", str(server.capture_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return server.capture(), json.loads(out.stdout)


def tool_segments(cap: Capture) -> list:
    return [s for r in cap.routes("GET /ask") for s in cap.segments(r, TOOL)]


@pytest.mark.parametrize("via", ["httpx", "langchain"])
def test_three_independent_lookups_in_sequence_fire_sequential_tool_calls(tmp_path, via):
    cap, report = run_service(tmp_path, ["sequential"], via)
    verdict = report["verdict"]
    print(f"verdict {verdict}; latency {report['latency_ms']}")
    assert verdict["layer"] == "tool" and verdict["rule"] == "sequential-tool-calls", verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "sequential-tool-calls"]
    # Three 120 ms lookups one after another: calling them together saves about two of them.
    assert 2 * LOOKUP_MS * 0.8 <= finding["evidence"]["tail_mean_parallel_saving_ms"] <= 2 * LOOKUP_MS * 1.6
    assert finding["evidence"]["longest_run_calls"] == 3
    assert not [s for s in tool_segments(cap) if TOOL_DEPENDS_ON in s.attrs]  # none sends another's answer
    if via == "langchain":  # each lookup is the tool's segment, its HTTP call nested under it
        calls = [s for s in tool_segments(cap) if s.name == "execute_tool lookup"]
        http_calls = [s for s in tool_segments(cap) if s.name.startswith("HTTP GET")]
        assert calls and len(calls) == len(http_calls)
        assert {s.parent_id for s in http_calls} == {s.segment_id for s in calls}
        assert {s.attrs["latprof.tool.framework"] for s in calls} == {"langchain"}


def test_langchain_tools_gathered_or_dependent_do_not_fire(tmp_path):
    cap, report = run_service(tmp_path, ["gathered", "dependent"], "langchain")
    print(f"verdict {report['verdict']}; findings {[f['rule'] for f in report['findings']]}")
    assert "sequential-tool-calls" not in [f["rule"] for f in report["findings"]]
    calls = [s for s in tool_segments(cap) if s.name == "execute_tool lookup"]
    by_id = {s.segment_id: s for s in calls}
    depending = [s for s in calls if TOOL_DEPENDS_ON in s.attrs]
    assert len(depending) >= 8  # two per dependent request, each naming the tool call that answered its id
    assert all(by_id[s.attrs[TOOL_DEPENDS_ON]].end_ns <= s.start_ns for s in depending)


def test_gathered_dependent_and_agent_loop_calls_do_not(tmp_path):
    cap, report = run_service(tmp_path, ["gathered", "dependent", "agent"])
    print(f"verdict {report['verdict']}; findings {[f['rule'] for f in report['findings']]}")
    assert "sequential-tool-calls" not in [f["rule"] for f in report["findings"]]
    depending = [s for s in tool_segments(cap) if TOOL_DEPENDS_ON in s.attrs]
    # Each dependent request's second and third lookup send the id the one before answered.
    dependent_requests = sum(1 for r in cap.routes("GET /ask") if len(cap.segments(r, TOOL)) == 3
                             and any(TOOL_DEPENDS_ON in s.attrs for s in cap.segments(r, TOOL)))  # fmt: skip
    assert dependent_requests >= 4 and len(depending) == 2 * dependent_requests
    by_id = {s.segment_id: s for s in tool_segments(cap)}
    for s in depending:
        earlier = by_id[s.attrs[TOOL_DEPENDS_ON]]
        assert earlier.request_id == s.request_id and earlier.end_ns <= s.start_ns
