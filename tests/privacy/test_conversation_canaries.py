"""Privacy canaries of conversation ids: the raw id is nowhere in what latprof writes; its keyed digest groups the turns.

Two ways in. A service under `latprof run` passes canary ids as the Responses API's
`conversation` (a string and the `{"id": ...}` form) to the official openai client, against
the demo provider. A trace file holds canary ids as `gen_ai.conversation.id` on the root
span, an `invoke_agent` wrapper and the chat spans of 260 requests: 100 two-turn conversations
and 4 fifteen-turn ones whose history grows. Everything latprof makes of them is searched (raw
and gunzipped, with test_canaries.py's `hits`): the capture, every report format of `analyze`,
both exports, `latprof receive`'s trace file, and what each command printed - and the session's
digest key too. Each canary is also shown to have arrived: the capture holds its digest under
that key, and the trace file's conversations group into the right turns (the context-growth
verdict, by conversation id).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from latprof.capture.reader import read_captures
from latprof.collectors.traces.receive import Receiver
from latprof.demo.provider import Provider
from latprof.digests import DIGEST_BYTES, ENV_DIGEST_KEY
from latprof.semconv import CONVERSATION_DIGEST

sys.path.insert(0, str(Path(__file__).parent))  # the other canary tests' helpers, whatever pytest's import mode
from test_canaries import hits  # noqa: E402

pytestmark = [pytest.mark.slow]  # one short service under `latprof run`, five analyses and exports: about 15 s

MS = 1_000_000
SERVICE = textwrap.dedent(
    """
    import json, sys
    import openai
    from latprof.collectors.hooks import runtime

    ids = json.loads(sys.argv[2])
    client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
    for turn in range(3):
        for form in (ids[0], {"id": ids[1]}):
            token = runtime.begin_request("POST /agent", runtime.now_ns())
            stream = client.responses.create(model="demo", input="hi " * (50 * turn + 1), conversation=form, stream=True)
            for _ in stream:
                pass
            runtime.end_request(token)
    """
)


def _latprof(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "latprof", *args], capture_output=True, text=True, timeout=180,
                            cwd=cwd, env=env, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    (cwd / f"printed-{uuid.uuid4().hex[:8]}.txt").write_text(result.stdout + result.stderr)
    return result


def _reports_and_exports(inputs: Path, out: Path) -> None:
    """Every report format of `latprof analyze` and both exports of `inputs`, into `out`."""
    for fmt in ("text", "json", "html"):
        _latprof("analyze", str(inputs), "--format", fmt, "-o", str(out / f"{inputs.stem}.report.{fmt}"), cwd=out)
    _latprof("analyze", str(inputs), "--format", "html", "--include-attributes", "-o", str(out / f"{inputs.stem}.attrs.html"), cwd=out)
    for fmt in ("otlp", "perfetto"):
        _latprof("export", str(inputs), "--format", fmt, "-o", str(out / f"{inputs.stem}.export.{fmt}"), cwd=out)


def test_responses_conversation_ids_under_latprof_run_are_kept_only_as_digests(tmp_path: Path) -> None:
    ids = [f"conv_CANARY_run_{purpose}_{uuid.uuid4().hex}" for purpose in ("string", "object")]
    key = uuid.uuid4().hex  # the session's digest key: never written either
    (tmp_path / "service.py").write_text(SERVICE)
    env = {**os.environ, ENV_DIGEST_KEY: key}
    with Provider(ttft_ms=10, tpot_ms=1, output_tokens=2) as provider:
        _latprof("run", "--out", str(tmp_path / "capture.jsonl"), "--no-report", "--", sys.executable,
                 str(tmp_path / "service.py"), provider.url, json.dumps(ids), cwd=tmp_path, env=env)  # fmt: skip
    data = read_captures([tmp_path / "capture.jsonl"])
    calls = [s for segments in data.segments_by_request.values() for s in segments if s.layer == "provider"]
    assert len(calls) == 6
    # Arrived: each call holds the digest of its id under the session's key (what the hook computed).
    import hashlib

    expected = [hashlib.blake2b(i.encode(), digest_size=DIGEST_BYTES, key=bytes.fromhex(key)).hexdigest() for i in ids]
    assert sorted(s.attrs[CONVERSATION_DIGEST] for s in calls) == sorted(expected * 3)
    _reports_and_exports(tmp_path / "capture.jsonl", tmp_path)
    files = [p for p in tmp_path.iterdir() if p.is_file() and p.name != "service.py"]
    assert len(files) >= 9
    assert hits(files, [*ids, key, "CANARY_run"]) == []


def _attrs(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """OTLP JSON key-values of str, int and float values."""
    kinds = {str: "stringValue", int: "intValue", float: "doubleValue"}
    return [{"key": k, "value": {kinds[type(v)]: str(v) if type(v) is int else v}} for k, v in attrs.items()]


def conversation_traces(canary: str, seed: int = 5) -> dict[str, Any]:
    """One request per turn of 104 conversations (100 of 2 turns, 4 of 15), shuffled: a SERVER
    root and a streamed chat span (its TTFT 150 ms + 40 ms per 1k input tokens, the history
    growing 1,200 tokens a turn), every other one below an `invoke_agent` span; the
    conversation id (with `canary`) on the root, the wrapper or the chat span, in turn."""
    rng = random.Random(seed)
    turns = [(conv, t) for conv, n in enumerate([2] * 100 + [15] * 4) for t in range(n)]
    rng.shuffle(turns)
    seen: dict[int, int] = {}
    spans = []
    t0 = 1_764_000_000 * 1_000_000_000
    for i, (conv, _) in enumerate(turns):
        turn = seen[conv] = seen.get(conv, -1) + 1
        tokens = 400 + 1200 * turn
        ttft_ms = 150 + 40 * tokens / 1000 + rng.uniform(-5, 5)
        conversation = {"gen_ai.conversation.id": f"{canary}_{conv}"}
        trace, root, agent, chat = uuid.uuid4().hex, *(uuid.uuid4().hex[:16] for _ in range(3))
        start = t0 + i * 200 * MS
        end = start + int((20 + ttft_ms + 60) * MS)
        where = i % 3  # 0: on the root, 1: on the wrapper, 2: on the chat span

        def span(span_id: str, parent: str | None, name: str, kind: int, attrs: dict[str, Any], begin: int, finish: int) -> dict[str, Any]:
            out = {"traceId": trace, "spanId": span_id, "name": name, "kind": kind, "startTimeUnixNano": str(begin),
                   "endTimeUnixNano": str(finish), "attributes": _attrs(attrs), "status": {"code": 0}}  # fmt: skip
            if parent:
                out["parentSpanId"] = parent
            return out

        spans.append(span(root, None, "POST /chat", 2, {"http.request.method": "POST", "http.route": "/chat",
                                                        **(conversation if where == 0 else {})}, start, end))  # fmt: skip
        parent = root
        if where == 1 or i % 2:
            spans.append(span(agent, root, "invoke_agent helper", 1, {"gen_ai.operation.name": "invoke_agent",
                                                                       **(conversation if where == 1 else {})}, start + 5 * MS, end - MS))  # fmt: skip
            parent = agent
        spans.append(span(chat, parent, "chat gpt-x", 3, {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-x", "gen_ai.usage.input_tokens": tokens,
            "gen_ai.usage.output_tokens": 12, "gen_ai.response.time_to_first_chunk": ttft_ms / 1000,
            **(conversation if where == 2 else {})}, start + 20 * MS, end - 2 * MS))  # fmt: skip
    return {"resourceSpans": [{"resource": {"attributes": _attrs({"service.name": "agent"})},
                               "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}]}]}  # fmt: skip


def test_trace_conversation_ids_are_kept_only_as_digests_and_still_group_turns(tmp_path: Path) -> None:
    canary = f"CANARY_trace_conversation_{uuid.uuid4().hex}"
    traces = tmp_path / "traces.json"
    body = json.dumps(conversation_traces(canary)).encode()
    traces.write_bytes(body)
    out = tmp_path / "out"
    out.mkdir()
    _reports_and_exports(traces, out)
    report = json.loads((out / "traces.report.json").read_text())
    # Arrived: the digests group each conversation's turns across requests.
    assert report["verdict"]["layer"] == "provider" and report["verdict"]["rule"] == "context-growth", report["verdict"]
    [finding] = [f for f in report["findings"] if f["rule"] == "context-growth"]
    assert finding["evidence"]["grouped_by"] == "conversation_id"
    assert finding["evidence"]["conversations_by_id"] == 104 and finding["evidence"]["growing_conversations"] == 4
    # latprof receive writes the ids as digests too, and they still group.
    receiver = Receiver("127.0.0.1", 0, out / "received.json")
    try:
        assert receiver.export("application/json", "", body).status == 200
    finally:
        receiver.close()
    _latprof("analyze", str(out / "received.json"), "--format", "json", "-o", str(out / "received.report.json"), cwd=out)
    again = json.loads((out / "received.report.json").read_text())
    assert again["verdict"]["rule"] == "context-growth", again["verdict"]
    files = [p for p in out.iterdir() if p.is_file()]
    assert len(files) >= 10
    assert hits(files, [canary]) == []
