"""`latprof run -- CMD`: hooks in every Python process of CMD, signals, exit codes, the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from latprof.capture.reader import read_captures
from latprof.collectors.hooks.launcher import available_hooks

# A service stand-in that records through the hooks' runtime, as a hook would: 120 requests,
# every 20th slow at the provider.
SERVICE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from latprof.collectors.hooks import runtime

    assert runtime.active(), "hooks were not loaded"
    for i in range(120):
        token = runtime.begin_request("POST /chat", runtime.now_ns())
        with runtime.segment("SELECT 1", "db.query"):
            time.sleep(0.001)
        with runtime.segment("chat m", "provider"):
            time.sleep(0.03 if i % 20 == 19 else 0.002)
        runtime.end_request(token)
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "child":
        code = "from latprof.collectors.hooks import runtime; t = runtime.begin_request('GET /child', runtime.now_ns()); runtime.end_request(t)"
        subprocess.run([sys.executable, "-c", code], check=True)
    if mode == "fork":
        pid = os.fork()
        if pid == 0:
            t = runtime.begin_request("GET /forked", runtime.now_ns())
            runtime.end_request(t)
            sys.exit(0)
        os.waitpid(pid, 0)
    if mode == "wait":
        print("ready", flush=True)
        time.sleep(60)
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))
    """
)


def latprof_run(tmp_path: Path, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    return subprocess.run(
        [sys.executable, "-m", "latprof", "run", "--out", str(tmp_path / "capture.jsonl"), "--skip-warmup", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=tmp_path,
        **kw,
    )


def test_run_records_reports_and_exits_with_the_command_code(tmp_path):
    script = tmp_path / "service.py"
    result = latprof_run(tmp_path, "--format", "json", "--", sys.executable, str(script), env={"EXIT_CODE": "3"})
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout)
    assert report["source"]["kind"] == "run"
    assert report["window"]["requests"] == 120
    assert report["verdict"]["layer"] == "provider"
    assert f"capture written to {tmp_path / 'capture.jsonl'}" in result.stderr
    data = read_captures([tmp_path / "capture.jsonl"])
    # every hook loaded; only the sleeps hook saw traffic (the stand-in's time.sleep calls)
    assert [q.kind for q in data.quality if q.kind not in ("closed", "overhead")] == ["hooks_loaded", "hook_active"]
    assert data.quality[-1].kind == "closed" and not data.unclosed  # the writer closed cleanly
    assert report["collection"]["collectors"] == ["sleeps"]


def test_every_python_process_the_command_starts_records_too(tmp_path):
    result = latprof_run(tmp_path, "--no-report", "--", sys.executable, str(tmp_path / "service.py"), "child")
    assert result.returncode == 0, result.stderr
    data = read_captures([tmp_path / "capture.jsonl"])
    assert len({h["pid"] for h in data.headers}) == 2
    assert sorted({r.route for r in data.requests}) == ["GET /child", "POST /chat"]
    assert len({q.pid for q in data.quality if q.kind == "hooks_loaded"}) == 2
    assert result.stdout == ""


def test_a_forked_child_says_it_inherited_the_hooks(tmp_path):
    result = latprof_run(tmp_path, "--no-report", "--", sys.executable, "-W", "ignore", str(tmp_path / "service.py"), "fork")
    assert result.returncode == 0, result.stderr
    data = read_captures([tmp_path / "capture.jsonl"])
    forked = [q for q in data.quality if q.kind == "hooks_loaded" and q.attrs.get("forked")]
    assert len(forked) == 1
    assert any(r.route == "GET /forked" and r.pid == forked[0].pid for r in data.requests)


def test_sigterm_reaches_the_command_and_the_capture_is_complete(tmp_path):
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    with subprocess.Popen(
        [sys.executable, "-m", "latprof", "run", "--out", str(tmp_path / "capture.jsonl"), "--no-report", "--",
         sys.executable, str(script), "wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM  # the service died by SIGTERM, like the shell says
    data = read_captures([tmp_path / "capture.jsonl"])
    assert len(data.requests) == 120  # its writer flushed on the way out, though its timer had not fired


def test_a_service_whose_python_cannot_import_latprof_fails_loudly(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    result = latprof_run(tmp_path, "--", str(bare / "bin" / "python"), "-c", "print('served')")
    assert result.returncode == 2
    assert "served" in result.stdout
    assert "latprof: hooks not loaded" in result.stderr  # said by the service's own interpreter
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("latprof: error: no process of") and "install latprof into the service's environment" in last
    assert "Traceback" not in result.stderr


def test_the_services_own_sitecustomize_still_runs(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    result = latprof_run(
        tmp_path,
        "--no-report",
        "--",
        sys.executable,
        "-c",
        "import os, sys; from latprof.collectors.hooks import runtime; print(os.environ.get('OWN_SITECUSTOMIZE'), runtime.active())",
        env={"PYTHONPATH": str(own)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ran True"


def test_unknown_command_is_one_line(tmp_path):
    result = latprof_run(tmp_path, "--", "no-such-command-latprof")
    assert result.returncode == 2
    assert result.stderr.strip() == "latprof: error: no-such-command-latprof: command not found"


def test_hooks_can_be_chosen_and_unknown_ones_are_refused(tmp_path):
    probe = "from latprof.collectors.hooks import bootstrap; import sys; print(sorted(bootstrap._installed))"
    result = latprof_run(tmp_path, "--no-report", "--hooks", "openai", "--", sys.executable, "-c", probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['openai']"
    bad = latprof_run(tmp_path, "--hooks", "openai,gpu", "--", sys.executable, "-c", "pass")
    assert bad.returncode == 2
    known = ", ".join(available_hooks())
    assert {"asgi", "asyncio_loop", "openai", "sqlalchemy"} <= set(available_hooks())
    assert bad.stderr.strip() == f"latprof: error: --hooks: no hook gpu (known: {known})"


def test_hooks_can_be_disabled(tmp_path):
    probe = "from latprof.collectors.hooks import bootstrap; import sys; print(sorted(bootstrap._installed))"
    result = latprof_run(
        tmp_path, "--no-report", "--disable", "openai,sqlalchemy", "--disable", "asgi", "--", sys.executable, "-c", probe
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(sorted(set(available_hooks()) - {"openai", "sqlalchemy", "asgi"}))
    bad = latprof_run(tmp_path, "--disable", "gpu", "--", sys.executable, "-c", "pass")
    assert bad.returncode == 2
    assert bad.stderr.strip() == f"latprof: error: --disable: no hook gpu (known: {', '.join(available_hooks())})"
    everything = latprof_run(tmp_path, "--disable", ",".join(available_hooks()), "--", sys.executable, "-c", "pass")
    assert everything.returncode == 2 and "every hook is disabled" in everything.stderr


def test_list_shows_every_hook_with_what_it_records(tmp_path):
    result = latprof_run(tmp_path, "--list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == available_hooks()
    for line in lines:
        name, summary = line.split(maxsplit=1)
        assert len(summary) > 20 and "cannot be imported" not in summary, line
    assert not (tmp_path / "capture.jsonl").exists()
    no_command = latprof_run(tmp_path)
    assert no_command.returncode == 2 and "no command" in no_command.stderr
