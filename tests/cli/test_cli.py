"""The CLI through click's runner: the examples' verdicts, formats, options, and bad input."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from latprof.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

EXPECTED = {  # the examples are recordings of `latprof demo` scenarios (examples/record.py)
    "pool_held_across_llm": ("db.pool", "db-pool-exhaustion"),
    "queueing": ("queue", "request-queueing"),
    "provider_floor": (None, None),
    "provider_spikes": ("provider", "provider-floor"),
    "event_loop_blocked": ("event_loop", "event-loop-blocked"),
    "long_decode": ("model", "long-decode"),
    "healthy": (None, None),
}


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_analyze_names_the_right_layer_for_each_example(name):
    result = run("analyze", str(EXAMPLES / f"{name}.jsonl.gz"), "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    layer, rule = EXPECTED[name]
    assert report["verdict"]["layer"] == layer
    assert report["verdict"]["rule"] == rule
    assert report["source"]["kind"] == "run"
    assert report["collection"]["warmup_requests_skipped"] > 0


def test_pool_example_says_connections_were_held_across_the_llm_call():
    report = json.loads(run("analyze", str(EXAMPLES / "pool_held_across_llm.jsonl.gz"), "--format", "json").output)
    evidence = report["findings"][0]["evidence"]
    assert evidence["held_across_llm_share"] >= 0.9
    assert evidence["pool_max"] == 3
    assert "Release the database connection before the LLM call" in report["findings"][0]["fix"]


def test_text_report_leads_with_the_verdict(tmp_path):
    result = run("analyze", str(EXAMPLES / "queueing.jsonl.gz"))
    assert result.exit_code == 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[2].startswith("VERDICT  queue")
    assert "request-queueing" in result.output and "fix:" in result.output
    assert "p99 over time" in result.output and "What latprof could see" in result.output


def test_output_file_and_skip_warmup(tmp_path):
    out = tmp_path / "report.json"
    result = run("analyze", str(EXAMPLES / "healthy.jsonl.gz"), "--format", "json", "-o", str(out), "--skip-warmup", "0")
    assert result.exit_code == 0 and result.output == ""
    report = json.loads(out.read_text())
    assert report["collection"]["warmup_requests_skipped"] == 0
    more = json.loads(run("analyze", str(EXAMPLES / "healthy.jsonl.gz"), "--format", "json", "--skip-warmup", "10").output)
    assert more["collection"]["warmup_requests_skipped"] > 0
    assert more["window"]["requests"] < report["window"]["requests"]


def test_several_inputs_are_merged():
    one = json.loads(run("analyze", str(EXAMPLES / "queueing.jsonl.gz"), "--format", "json").output)
    both = json.loads(
        run("analyze", str(EXAMPLES / "queueing.jsonl.gz"), str(EXAMPLES / "healthy.jsonl.gz"), "--format", "json").output
    )
    assert len(both["source"]["inputs"]) == 2
    assert both["window"]["requests"] > one["window"]["requests"]


def _torn(tmp_path: Path) -> Path:
    path = tmp_path / "torn.jsonl"
    path.write_bytes(gzip.decompress((EXAMPLES / "queueing.jsonl.gz").read_bytes()) + b'{"type": "segm')
    return path


def test_torn_last_line_is_a_warning_not_an_error(tmp_path):
    result = run("analyze", str(_torn(tmp_path)), "--format", "json")
    assert result.exit_code == 0
    report = json.loads(result.output)
    assert report["verdict"]["layer"] == "queue"
    assert any("torn last line" in w for w in report["collection"]["warnings"])


QUALITY = '{"type": "quality", "kind": "x", "ts_ns": 1, "pid": 1}\n'


def put(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.jsonl", "no such file"),
        (lambda d: d, "holds no capture files"),
        (lambda d: put(d / "e.jsonl", ""), "file is empty"),
        (lambda d: put(d / "x.jsonl", "garbage\n"), "not a latprof capture"),
        (lambda d: put(d / "v.jsonl", '{"type": "header", "schema": "latprof.capture/9"}\n' + QUALITY), "latprof.capture/9"),
        (
            lambda d: put(d / "m.jsonl", '{"type": "header", "schema": "latprof.capture/1"}\n{oops\n' + QUALITY),
            "m.jsonl:2: malformed line",
        ),
    ],
    ids=["missing", "empty-directory", "empty-file", "unknown-format", "schema-version", "malformed"],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, make, message):
    result = CliRunner().invoke(main, ["analyze", str(make(tmp_path))])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("latprof: error: ") and message in lines[0]
    assert "Traceback" not in result.output


def test_unknown_format_and_bad_option_are_usage_errors():
    result = CliRunner().invoke(main, ["analyze", str(EXAMPLES / "healthy.jsonl.gz"), "--format", "yaml"])
    assert result.exit_code == 2 and "yaml" in result.output
    result = CliRunner().invoke(main, ["analyze", str(EXAMPLES / "healthy.jsonl.gz"), "--skip-warmup", "-1"])
    assert result.exit_code == 2


def test_unwritable_output_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    result = CliRunner().invoke(main, ["analyze", str(EXAMPLES / "healthy.jsonl.gz"), "-o", str(tmp_path / "file" / "r.json")])
    assert result.exit_code == 2 and "cannot write" in result.output


def test_rules_lists_every_rule_and_explain_prints_docs_and_thresholds():
    listing = run("rules")
    assert listing.exit_code == 0
    ids = [line.split()[0] for line in listing.output.splitlines()]
    assert {"db-pool-exhaustion", "request-queueing", "provider-floor", "long-decode", "event-loop-blocked", "slow-query"} <= set(ids)
    explained = run("rules", "explain", "provider-floor")
    assert explained.exit_code == 0
    for section in ("What it detects:", "Why it matters for p99:", "Evidence:", "How to fix:", "Example:", "Thresholds:"):
        assert section in explained.output
    assert "min_calls = 20" in explained.output


def test_explain_unknown_rule_suggests_the_closest():
    result = CliRunner().invoke(main, ["rules", "explain", "db-pool-exhaustoin"])
    assert result.exit_code == 2
    assert "did you mean db-pool-exhaustion?" in result.output


def test_internal_errors_are_one_line_unless_debug(monkeypatch):
    import latprof.pipeline

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(latprof.pipeline, "run_diagnosis", broken)
    result = CliRunner().invoke(main, ["analyze", str(EXAMPLES / "healthy.jsonl.gz")])
    assert result.exit_code == 3
    assert result.output.strip() == "latprof: internal error: RuntimeError: boom (run with --debug for the traceback)"
    debug = CliRunner().invoke(main, ["--debug", "analyze", str(EXAMPLES / "healthy.jsonl.gz")])
    assert isinstance(debug.exception, RuntimeError)


def test_the_installed_command_exits_with_the_right_code_and_complete_output():
    # `python -m latprof` is the console script's entry (it leaves with os._exit after flushing).
    import subprocess
    import sys

    ok = subprocess.run(
        [sys.executable, "-m", "latprof", "analyze", str(EXAMPLES / "queueing.jsonl.gz"), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0
    assert json.loads(ok.stdout)["verdict"]["layer"] == "queue"
    bad = subprocess.run([sys.executable, "-m", "latprof", "analyze", "missing.jsonl"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr == "latprof: error: missing.jsonl: no such file or directory\n"
    assert bad.stdout == ""


def test_a_reader_that_leaves_early_ends_latprof_quietly():
    """`latprof rules | head -1`: the pipe closes before latprof writes; no traceback, exit 0."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the child starts: its first write fails with EPIPE
    proc = subprocess.run(
        [sys.executable, "-m", "latprof", "rules", "explain", "db-pool-exhaustion"],
        stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
    )  # fmt: skip
    os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
