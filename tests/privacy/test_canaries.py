"""Privacy canaries: unique strings sent through every hook never show up in any file latprof writes.

One FastAPI service under `latprof run -- python -m uvicorn` (and a Flask one under gunicorn, an
aiohttp.web one) gets canaries — `CANARY_<group>_<purpose>_<hex>` — as prompts and completions
(the official openai and anthropic clients streamed and not, against the demo provider and an echo
server that answers canaries; raw LLM HTTP via httpx and aiohttp), tool arguments and results (LangChain,
the OpenAI Agents SDK, MCP), SQL parameters, literals and comments (SQLAlchemy, psycopg_pool,
asyncpg on the real PostgreSQL), Redis keys and values, URL paths and query strings, request
and response headers (Authorization, Cookie, Set-Cookie, a custom one), exception messages,
and the service's argv and environment. Then every file latprof makes of those captures is
searched (raw bytes, and gunzipped when compressed): the captures, `latprof run`'s report and
what it printed, every report format of `analyze`, `check` (its outputs, JUnit, SARIF, GitHub
annotations and step summary) and `diff`. `latprof receive` has its own test
(test_receive_canaries.py).

Each canary is also found where it must be — the echo server's log of what it received, the
database, Redis, the service's responses — so a canary that was never sent cannot pass, and the
search itself is checked on a file that holds one.
"""

from __future__ import annotations

import gzip
import http.server
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

import services
from latprof.capture.reader import read_captures
from latprof.demo.provider import Provider
from latprof.events import Request, Segment
from latprof.export import EXPORT
from latprof.report.renderers import CHECK, DIFF, REPORT

pytestmark = [pytest.mark.slow, pytest.mark.long]  # three real services under `latprof run`, about a minute


def _harness() -> Any:
    """tests/collectors/hooks/apps/harness.py (starts servers under `latprof run`), whatever the import mode."""
    name = "latprof_test_hooks_harness"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "collectors" / "hooks" / "apps" / "harness.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


harness = _harness()
ROOT: Path = harness.ROOT
REDIS_URL = os.environ.get("LATPROF_TEST_REDIS", "redis://127.0.0.1:6379/0")

#: The purposes of each group's canaries; a group is named after the hook that should see them.
PURPOSES: dict[str, tuple[str, ...]] = {
    "openai": ("prompt", "system", "user", "api_key", "custom_header", "completion", "usage_tokens"),
    "anthropic": ("prompt", "system", "api_key", "custom_header", "completion", "usage_tokens"),
    "httpx": ("path", "query", "body", "prompt", "completion", "authorization", "cookie", "custom_header", "set_cookie",
              "response_body", "usage_tokens"),
    "aiohttp_client": ("path", "query", "body", "prompt", "completion", "authorization", "cookie", "custom_header",
                       "set_cookie", "response_body", "usage_tokens"),
    "sqlalchemy": ("param_key", "param_value", "literal", "comment", "dollar", "escaped", "password", "dsn_option"),
    "psycopg_pool": ("param_key", "param_value", "literal", "comment", "dollar", "escaped", "password", "dsn_option"),
    "asyncpg": ("param_key", "param_value", "literal", "comment", "dollar", "escaped", "password", "dsn_option"),
    "redis": ("key", "value", "hash", "field", "pipeline_key", "client_name"),
    "langchain": ("argument", "result"),
    "agents": ("argument", "result", "prompt", "instructions", "api_key", "completion"),
    "mcp": ("argument", "result", "error"),
    "asgi": ("path_user", "path_order", "query", "unmatched_path", "authorization", "cookie", "custom_header",
             "set_cookie", "response_header", "exception", "request_start"),
    "wsgi": ("path_user", "path_order", "query", "unmatched_path", "authorization", "cookie", "custom_header",
             "set_cookie", "response_header", "exception", "request_start"),
    "aiohttp_web": ("path_user", "path_order", "query", "unmatched_path", "authorization", "cookie", "custom_header",
                    "set_cookie", "response_header", "exception", "request_start"),
    "run": ("argv", "env"),
}  # fmt: skip
#: The OpenAI Agents SDK is the `test-agents-sdk` extra (it needs openai 3.x): its route is left out without it.
AGENTS_SDK = importlib.util.find_spec("agents") is not None
REQUESTS_PER_ROUTE = 5  # the asgi service answers 60-odd requests: enough for a verdict (50)


def make_canaries() -> dict[str, dict[str, str]]:
    """`CANARY_<group>_<purpose>_<hex>` for every purpose: a word (letters, digits, underscores) so that it
    stays whole wherever latprof might keep an identifier (an SQL summary keeps words, not `-`)."""
    return {group: {p: f"CANARY_{group}_{p}_{uuid.uuid4().hex}" for p in purposes} for group, purposes in PURPOSES.items()}


# --- what the canaries are searched in -----------------------------------------------------------


def readable(path: Path) -> bytes:
    """A file's bytes, with its gunzipped content appended when it is gzip-compressed."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data += gzip.decompress(data)
    return data


def hits(files: list[Path], canaries: list[str]) -> list[str]:
    """`file: canary` for every canary found in every file (raw, or gunzipped)."""
    found = []
    for path in files:
        data = readable(path)
        found += [f"{path.name}: {c}" for c in canaries if c.encode() in data]
    return found


# --- the echo server: the upstream that answers canaries -----------------------------------------


class _Echo(http.server.BaseHTTPRequestHandler):
    """Upstream of the service: LLM paths answer the group's completion canary (streamed or not);
    `/v1/responses` plays an agent (a tool call with the canary argument, then the final answer);
    anything else answers the group's response-body canary and a canary `Set-Cookie`. The group is
    read from the request (its prompt or path). Everything received is appended to `seen`."""

    protocol_version = "HTTP/1.1"
    canaries: dict[str, dict[str, str]] = {}
    seen: list[bytes] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _group(self, raw: bytes) -> str:
        for group in ("openai", "anthropic", "httpx", "aiohttp_client", "agents"):
            if f"CANARY_{group}_".encode() in raw:
                return group
        return "httpx"

    def _send(self, body: bytes, content_type: str, group: str, stream: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        c = self.canaries[group]
        if "set_cookie" in c:
            self.send_header("Set-Cookie", f"upstream={c['set_cookie']}; HttpOnly")
        if stream:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        raw = self.requestline.encode() + b"\n" + bytes(self.headers)
        self.seen.append(raw)
        group = self._group(raw)
        self._send(json.dumps({"echo": self.canaries[group].get("response_body", "")}).encode(), "application/json", group)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        raw = self.requestline.encode() + b"\n" + bytes(self.headers) + body
        self.seen.append(raw)
        group = self._group(raw)
        c = self.canaries[group]
        payload = json.loads(body or b"{}")
        if self.path.endswith("/responses"):
            self._send(json.dumps(self._agent_turn(payload, c)).encode(), "application/json", group)
        elif self.path.endswith("/v1/messages"):
            self._anthropic_answer(payload, c, group)
        elif self.path.endswith("/chat/completions"):
            text = c["completion"]
            if payload.get("stream"):
                chunks = [{"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "echo",
                           "choices": [{"index": 0, "delta": {"role": "assistant", "content": part}, "finish_reason": None}]}
                          for part in ("", text, " and again " + text)]  # fmt: skip
                chunks.append({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "echo",
                               "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})  # fmt: skip
                # token counts that are not numbers: an answer's usage is read, and must not be written as it came
                usage = {"prompt_tokens": c["usage_tokens"], "completion_tokens": c["usage_tokens"], "total_tokens": 5}
                chunks.append({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "echo", "choices": [],
                               "usage": usage})  # fmt: skip
                sse = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"
                self._send(sse, "text/event-stream", group, stream=True)
            else:
                answer = {"id": "c1", "object": "chat.completion", "created": 0, "model": "echo",
                          "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                          "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}  # fmt: skip
                self._send(json.dumps(answer).encode(), "application/json", group)
        else:
            self._send(json.dumps({"echo": c.get("response_body", "")}).encode(), "application/json", group)

    def _anthropic_answer(self, payload: dict[str, Any], c: dict[str, str], group: str) -> None:
        """The Messages API's answer: the completion canary, and token counts that are not numbers (not to be written as they came)."""
        text = c["completion"]
        usage = {"input_tokens": c["usage_tokens"], "output_tokens": c["usage_tokens"]}
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "echo", "stop_reason": None, "stop_sequence": None}
        if not payload.get("stream"):
            answer = {**message, "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "usage": usage}
            self._send(json.dumps(answer).encode(), "application/json", group)
            return
        events = [
            {"type": "message_start", "message": {**message, "content": [], "usage": usage}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": part}} for part in (text, " and again " + text)),
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": c["usage_tokens"]}},
            {"type": "message_stop"},
        ]  # fmt: skip
        sse = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
        self._send(sse, "text/event-stream", group, stream=True)

    @staticmethod
    def _agent_turn(payload: dict[str, Any], c: dict[str, str]) -> dict[str, Any]:
        answered = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in payload.get("input", []))
        if not answered:
            output: list[dict[str, Any]] = [{"type": "function_call", "id": "fc_1", "call_id": "call_privacy", "name": "lookup",
                                             "arguments": json.dumps({"customer": c["argument"]}), "status": "completed"}]  # fmt: skip
        else:
            output = [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": c["completion"], "annotations": []}]}]  # fmt: skip
        return {"id": "resp_1", "object": "response", "created_at": 0, "model": "echo", "status": "completed", "output": output}


# --- the run ---------------------------------------------------------------------------------------


@dataclass
class Run:
    """What the module's services did: the canaries, every file latprof wrote, and where the canaries must be."""

    canaries: dict[str, dict[str, str]]
    workdir: Path
    captures: dict[str, Path] = field(default_factory=dict)  # group -> its service's capture
    written: list[Path] = field(default_factory=list)  # every file latprof wrote
    upstream_seen: bytes = b""
    responses: bytes = b""
    service_logs: bytes = b""
    database: str = ""
    redis_values: list[bytes] = field(default_factory=list)

    def group(self, name: str) -> list[str]:
        return list(self.canaries[name].values())


def _server_class(base: Any, argv_canary: str, report: Path) -> Any:
    """`base` (a harness server) started with latprof's report written to `report` (not --no-report),
    and for uvicorn a canary argument on the service's command line."""

    class PrivacyServer(base):  # type: ignore[misc, valid-type]
        def server_command(self) -> list[str]:
            cmd: list[str] = super().server_command()
            if cmd[2] == "uvicorn":  # a default response header: a canary in argv that also reaches the client
                cmd += ["--header", f"x-argv:{argv_canary}"]
            elif cmd[2] == "gunicorn":  # an environment variable set on gunicorn's command line
                cmd += ["--env", f"PRIVACY_ARGV={argv_canary}"]
            return cmd

        def start(self) -> Any:
            self.port = harness.free_port()
            cmd = [
                sys.executable, "-m", "latprof", "run", "--out", str(self.capture_path), "--format", "text",
                "-o", str(report), "--skip-warmup", "0", "--max-rate", "0", "--", *self.server_command(),
            ]  # fmt: skip
            self.log = open(self.workdir / "server.log", "wb")
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
            if not harness.wait_healthy(self.proc, self.address, self.output):
                self.kill()
                raise AssertionError(f"server did not answer: {self.output()}")
            return self

    return PrivacyServer


def _client_calls(run: Run, group: str) -> list[tuple[str, list[tuple[str, str]], int]]:
    """The inbound requests of a server group, with canaries in the path, the query and the headers, and their status."""
    c = run.canaries[group]
    headers = [("Authorization", f"Bearer {c['authorization']}"), ("Cookie", f"sid={c['cookie']}"),
               ("X-Custom-Secret", c["custom_header"]), ("X-Request-Start", f"t={c['request_start']}")]  # fmt: skip
    return [
        (f"/users/{c['path_user']}/orders/{c['path_order']}?q={c['query']}", headers, 200),
        (f"/boom/{c['path_order']}?q={c['query']}", headers, 500),
        (f"/nowhere/{c['unmatched_path']}?q={c['query']}", headers, 404),
    ]


def _serve(run: Run, group: str, server: Any, leak_routes: list[str]) -> None:
    """Start `server`, call its routes (inbound canaries, then `leak_routes`) REQUESTS_PER_ROUTE times, stop it."""
    server.start()
    try:
        for _ in range(REQUESTS_PER_ROUTE):
            for path, headers, status in _client_calls(run, group):
                response = harness.get(server.address, path, headers=headers)
                assert response.status == status, (path, response.status)
                run.responses += response.body
            for route in leak_routes:
                response = harness.get(server.address, route)
                assert response.status == 200, (route, response.status, response.body[:2000], server.output())
                run.responses += response.body
        assert server.stop() in (0, 128 + signal.SIGTERM), server.output()  # uvicorn ends as SIGTERM did
    finally:
        server.kill()
    log = (server.workdir / "server.log").read_bytes()
    run.service_logs += log
    # What latprof itself printed (its lines in the service's output): searched like its files.
    printed = server.workdir / "latprof-printed.txt"
    printed.write_bytes(b"\n".join(line for line in log.splitlines() if line.startswith(b"latprof")))
    run.written.append(printed)
    run.captures[group] = server.capture_path


def _latprof(*args: Any, env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "latprof", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, **(env or {})})  # fmt: skip
    assert result.returncode in ok, (args, result.returncode, result.stderr[-3000:])
    return result


CHECK_CONFIG = """\
skip_warmup_s = 0
[budget]
p99_ms = 0.001
p50_ms = 0.001
ttft_p99_ms = 0.001
pool_wait_p99_ms = 0
[[budget.routes]]
route = "*"
p99_ms = 0.001
[[checks]]
id = "every-segment"
select = "segments"
where = {layer = "tool"}
stat = "max"
op = "<="
threshold = 0
message = "segments {value:.3f} ms over {threshold:.0f} ms"
"""


def _reports(run: Run) -> None:
    """Every output of analyze, check and diff on the captures, written under workdir/out (and their stdout)."""
    out = run.workdir / "out"
    out.mkdir()
    captures = list(run.captures.values())
    asgi = run.captures["asgi"]
    for fmt in REPORT.names():
        for name, path in (("all", None), *run.captures.items()):  # merged (a verdict) and each alone (few: explained)
            target = out / f"analyze-{name}.{fmt}"
            args = [*(captures if path is None else [path])]
            _latprof("analyze", *args, "--format", fmt, "-o", target, "--skip-warmup", "0")
            run.written.append(target)
    # the HTML page with statements and URLs shown: they carry no parameter, so still no canary
    target = out / "analyze-all-attributes.html"
    _latprof("analyze", *captures, "--format", "html", "--include-attributes", "-o", target, "--skip-warmup", "0")
    run.written.append(target)
    for fmt in EXPORT.names():  # the exports for trace viewers
        target = out / f"export.{fmt}"
        _latprof("export", *captures, "--format", fmt, "-o", target)
        run.written.append(target)
    config = out / "latprof.toml"
    config.write_text(CHECK_CONFIG)
    summary = out / "step-summary.md"
    for fmt in CHECK.names():
        result = _latprof("check", asgi, *captures[1:], "--config", config, "--baseline", asgi, "--format", fmt,
                          "-o", out / f"check.{fmt}", "--junit", out / f"check-{fmt}.xml", "--sarif", out / f"check-{fmt}.sarif",
                          env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}, ok=(1,))  # fmt: skip
        (out / f"check-{fmt}.stdout").write_text(result.stdout + result.stderr)  # the ::error annotations
        run.written += [out / f"check.{fmt}", out / f"check-{fmt}.xml", out / f"check-{fmt}.sarif", out / f"check-{fmt}.stdout"]
    run.written.append(summary)
    saved = out / "analyze-all.json"
    for fmt in DIFF.names():
        target = out / f"diff.{fmt}"
        _latprof("diff", run.captures["wsgi"], asgi, "--format", fmt, "-o", target, "--skip-warmup", "0")
        _latprof("diff", saved, asgi, "--format", fmt, "-o", out / f"diff-saved.{fmt}", "--skip-warmup", "0")
        run.written += [target, out / f"diff-saved.{fmt}"]
    for path in out.iterdir():  # anything else latprof left there
        if path not in run.written and path != config:
            run.written.append(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    services.require_pg()
    import psycopg
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=3).ping()
    except redis.RedisError as exc:
        services.missing(f"Redis at {REDIS_URL} is unreachable: {exc}", "Redis is")
    workdir = tmp_path_factory.mktemp("privacy")
    run = Run(make_canaries(), workdir)
    (workdir / "canaries.json").write_text(json.dumps(run.canaries))
    table = f"latprof_privacy_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(services.PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (k text, v text)")
    _Echo.canaries, _Echo.seen = run.canaries, []
    echo = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with Provider(ttft_ms=5, tpot_ms=1, output_tokens=4) as provider:
            env = {
                "PRIVACY_CANARIES": str(workdir / "canaries.json"), "PRIVACY_UPSTREAM": f"http://127.0.0.1:{echo.server_address[1]}",
                "PRIVACY_PROVIDER": provider.url, "PRIVACY_PG": services.PG_DSN, "PRIVACY_TABLE": table,
                "PRIVACY_REDIS": REDIS_URL, "PRIVACY_ENV_SECRET": run.canaries["run"]["env"],
            }  # fmt: skip
            argv = run.canaries["run"]["argv"]
            for group, base, app, leaks in (
                ("asgi", harness.Server, "tests.privacy.privacy_apps.service:app",
                 [f"/leak/{kind}" for kind in ("run", "openai", "anthropic", "httpx", "aiohttp", "sqlalchemy", "psycopg_pool", "asyncpg",
                                               "redis", "langchain", "mcp", *(["agents"] if AGENTS_SDK else []))]),
                ("wsgi", harness.GunicornServer, "tests.privacy.privacy_apps.wsgi_service:app", []),
                ("aiohttp_web", harness.AiohttpServer, "tests.privacy.privacy_apps.aiohttp_service:init", []),
            ):  # fmt: skip
                server_dir = workdir / group
                server_dir.mkdir()
                report = server_dir / "run-report.txt"
                loop, parser = ("asyncio", "h11") if group != "wsgi" else ("", "")
                server = _server_class(base, argv, report)(app, loop, parser, server_dir, env=env)
                _serve(run, group, server, leaks)
                run.written += [server.capture_path, report]
        run.upstream_seen = b"\n".join(_Echo.seen)
        with psycopg.connect(services.PG_DSN) as conn:
            run.database = json.dumps(conn.execute(f"SELECT k, v FROM {table}").fetchall())
        for group in ("redis",):
            c = run.canaries[group]
            run.redis_values = [client.get(c["key"]) or b"", client.get(c["pipeline_key"]) or b"", client.hget(c["hash"], c["field"]) or b""]
        _reports(run)
        yield run
    finally:
        echo.shutdown()
        echo.server_close()
        c = run.canaries["redis"]
        client.delete(c["key"], c["pipeline_key"], c["hash"])
        client.close()
        with psycopg.connect(services.PG_DSN, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


# --- the tests -------------------------------------------------------------------------------------


def _segments(path: Path) -> tuple[list[Request], list[Segment]]:
    data = read_captures([path])
    return list(data.requests), [s for found in data.segments_by_request.values() for s in found]


def _recorded_by(run: Run, group: str) -> None:
    """The hooks of `group` recorded the calls its canaries went through (so the canaries were not simply missed)."""
    requests, segments = _segments(run.captures["asgi"])
    names = {s.name for s in segments}
    attrs = [s.attrs for s in segments]
    if group == "openai":
        assert any(a.get("gen_ai.request.model") == "demo" for a in attrs), names
    elif group == "anthropic":
        assert {a.get("gen_ai.response.model") for a in attrs if a.get("gen_ai.provider.name") == "anthropic"} >= {"demo", "echo"}, names
    elif group in ("httpx", "aiohttp_client"):
        assert any(a.get("gen_ai.request.model") == "echo" or a.get("gen_ai.response.model") == "echo" for a in attrs), names
        assert sum(1 for n in names if n.startswith("HTTP ")) >= 1, names
    elif group in ("sqlalchemy", "psycopg_pool", "asyncpg"):
        assert any(a.get("db.query.summary", "").startswith("INSERT latprof_privacy_") for a in attrs), names
    elif group == "redis":
        assert {"SET", "GET", "HSET"} <= names, names
    elif group in ("langchain", "agents", "mcp"):
        framework = {"langchain": "langchain", "agents": "openai-agents", "mcp": "mcp"}[group]
        assert any(a.get("latprof.tool.framework") == framework for a in attrs), names


@pytest.mark.parametrize("group", ["openai", "anthropic", "httpx", "aiohttp_client", "sqlalchemy", "psycopg_pool", "asyncpg", "redis",
                                   "langchain", "agents", "mcp"])  # fmt: skip
def test_canaries_through_a_client_hook_are_nowhere_latprof_writes(run: Run, group: str) -> None:
    if group == "agents" and not AGENTS_SDK:
        services.missing("the OpenAI Agents SDK is not installed (the test-agents-sdk extra)", "openai-agents is")
    _recorded_by(run, group)
    canaries = run.group(group)
    if group in ("sqlalchemy", "psycopg_pool", "asyncpg"):  # the parameters reached the database
        assert run.canaries[group]["param_value"] in run.database
    elif group == "redis":
        assert run.redis_values == [run.canaries["redis"]["value"].encode()] * 3
    else:  # they went out to the upstream, or came back in the service's answers (a tool answers its result
        # only when it was called with its argument)
        seen = {p for p, c in run.canaries[group].items() if c.encode() in run.upstream_seen or c.encode() in run.responses}
        assert seen >= {p for p in PURPOSES[group] if p in ("prompt", "path", "query", "api_key", "completion", "result")}, seen
    assert hits(run.written, canaries) == []


@pytest.mark.parametrize("group", ["asgi", "wsgi", "aiohttp_web"])
def test_canaries_in_inbound_paths_headers_and_errors_are_nowhere_latprof_writes(run: Run, group: str) -> None:
    requests, _ = _segments(run.captures[group])
    routes = {r.route for r in requests}
    assert {r.status_code for r in requests} >= {200, 404, 500}, routes
    assert routes & {"GET /users/{user_id}/orders/{order_id}", "GET /users/<user_id>/orders/<order_id>"}, routes
    c = run.canaries[group]
    assert c["path_user"].encode() in run.responses  # the app saw its path parameters
    assert c["exception"].encode() in run.service_logs  # the service logged its own error: the message was made
    assert hits(run.written, run.group(group)) == []


def test_the_service_argv_and_environment_are_nowhere_latprof_writes(run: Run) -> None:
    assert all(c.encode() in run.responses for c in run.group("run"))  # the service got them
    assert hits(run.written, run.group("run")) == []


def test_no_canary_of_any_kind_anywhere(run: Run) -> None:
    """A catch-all over every file latprof wrote: not one `CANARY` (not even a canary cut short)."""
    assert len(run.written) >= 3 * 2 + 2 * len(REPORT.names()) + 4 * len(CHECK.names()) + 2 * len(DIFF.names())
    assert all(path.stat().st_size > 0 for path in run.written if path.suffix != ".md" and path.name != "latprof-printed.txt"), run.written
    found = [f"{p.name}: {readable(p)[readable(p).find(b'CANARY'):][:80]!r}" for p in run.written if b"CANARY" in readable(p)]
    assert found == []


def test_the_search_finds_a_canary_where_there_is_one(run: Run, tmp_path: Path) -> None:
    """The search is not blind: the canaries are in what the service logged and sent, plain or gzipped."""
    plain, packed = tmp_path / "plain.log", tmp_path / "packed.gz"
    plain.write_bytes(run.upstream_seen)
    packed.write_bytes(gzip.compress(run.upstream_seen))
    prompt = run.canaries["httpx"]["prompt"]
    assert hits([plain, packed], [prompt]) == [f"plain.log: {prompt}", f"packed.gz: {prompt}"]
