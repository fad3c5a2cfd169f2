"""The report at the end of `latprof run`: set apart from the service's own output by a banner, and
followed by where the capture was written and the command that shows the report again.

Runs the real `latprof run -- python -c ...`; the command records requests through the hooks'
runtime and prints an access-log line for each, as a web server would.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

from latprof.engine import fmt_ms

# 100 requests, every 20th slow at the provider, each with a line of access log on stdout and stderr.
SERVICE = textwrap.dedent(
    """
    import sys, time
    from latprof.collectors.hooks import runtime

    assert runtime.active(), "hooks were not loaded"
    for i in range(100):
        token = runtime.begin_request("POST /chat", runtime.now_ns())
        with runtime.segment("chat m", "provider"):
            time.sleep(0.02 if i % 20 == 19 else 0.001)
        runtime.end_request(token)
        print(f'INFO:     127.0.0.1:5{i:04d} - "POST /chat HTTP/1.1" 200 OK', flush=True)
        print(f'access: request {i} done', file=sys.stderr, flush=True)
    """
)


def latprof_run(tmp_path: Path, *args: str, merged: bool = False, service: str = SERVICE) -> subprocess.CompletedProcess[str]:
    """`latprof run --out tmp_path/capture.jsonl ARGS -- python -c SERVICE`, stdout and stderr apart (or `merged` in one pipe)."""
    return subprocess.run(
        [sys.executable, "-m", "latprof", "run", "--out", str(tmp_path / "capture.jsonl"), *args,
         "--", sys.executable, "-c", service],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip


def footer_command(stderr: str, capture: Path) -> list[str]:
    """The command the footer gives to see the report again, as argv."""
    (footer,) = [line for line in stderr.splitlines() if line.startswith(f"latprof: capture written to {capture}; ")]
    return shlex.split(footer.split("to see this report again: ", 1)[1])


def test_the_text_report_comes_after_a_banner_naming_the_capture_and_before_a_footer(tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    result = latprof_run(tmp_path, "--skip-warmup", "0", merged=True)
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    banner = next(i for i, line in enumerate(lines) if f"latprof report — {capture}" in line)
    verdict = next(i for i, line in enumerate(lines) if line.startswith("VERDICT"))
    footer = next(i for i, line in enumerate(lines) if line.startswith(f"latprof: capture written to {capture}; "))
    last_log = max(i for i, line in enumerate(lines) if line.startswith(("INFO:", "access:")))
    assert last_log < banner < verdict < footer == len(lines) - 1
    assert sum(line.startswith("INFO:") for line in lines) == 100  # the service's output, all before the banner
    assert lines[footer] == (
        f"latprof: capture written to {capture}; to see this report again: latprof analyze {capture} --skip-warmup 0"
    )
    assert "What latprof could see" in "\n".join(lines[verdict:footer])


def test_a_json_report_keeps_stdout_clean_and_the_footer_command_shows_the_same_report(tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    result = latprof_run(tmp_path, "--skip-warmup", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    service_log = [line for line in result.stdout.splitlines() if line.startswith("INFO:")]
    report = json.loads(result.stdout[result.stdout.index("\n{") :])  # after the service's own lines: the report alone
    assert len(service_log) == 100 and report["source"]["inputs"] == [str(capture)]
    assert f"latprof report — {capture}" in result.stderr
    again_argv = footer_command(result.stderr, capture)
    assert again_argv == ["latprof", "analyze", str(capture), "--skip-warmup", "0"]
    again = subprocess.run([sys.executable, "-m", *again_argv, "--format", "json"], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    shown = json.loads(again.stdout)
    assert shown["verdict"] == report["verdict"] and shown["layers"] == report["layers"]
    assert shown["window"]["requests"] == report["window"]["requests"] == 100


def test_with_the_default_warm_up_the_footer_command_needs_no_option(tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    result = latprof_run(tmp_path, "--no-report")
    assert result.returncode == 0, result.stderr
    assert "latprof report" not in result.stderr
    assert f"latprof: capture written to {capture}; its report: latprof analyze {capture}\n" in result.stderr


def test_a_report_written_to_a_file_is_said_with_the_capture(tmp_path: Path) -> None:
    capture, output = tmp_path / "capture.jsonl", tmp_path / "report.json"
    result = latprof_run(tmp_path, "--skip-warmup", "0", "--format", "json", "-o", str(output))
    assert result.returncode == 0, result.stderr
    assert json.loads(output.read_text())["source"]["inputs"] == [str(capture)]
    assert f"latprof: report written to {output}\n" in result.stderr
    assert footer_command(result.stderr, capture) == ["latprof", "analyze", str(capture), "--skip-warmup", "0"]


def test_the_live_report_is_judged_by_the_config_as_the_footer_command_judges_the_capture(tmp_path: Path) -> None:
    # Every 20th request waits 200 ms more at the provider: by default, a verdict.
    service = SERVICE.replace("0.02 if i % 20 == 19", "0.2 if i % 20 == 19")
    capture = tmp_path / "capture.jsonl"
    default = latprof_run(tmp_path, "--skip-warmup", "0", "--format", "json", service=service)
    assert default.returncode == 0, default.stderr
    verdict = json.loads(default.stdout[default.stdout.index("\n{") :])["verdict"]
    assert (verdict["layer"], verdict["status"]) == ("provider", "layer"), verdict
    # A latprof.toml in the working directory asks for a tail of 5 s before a verdict: the live report has none ...
    (tmp_path / "latprof.toml").write_text("min_tail_excess_ms = 5000\n")
    floored = latprof_run(tmp_path, "--skip-warmup", "0", "--format", "json", service=service)
    assert floored.returncode == 0, floored.stderr
    live = json.loads(floored.stdout[floored.stdout.index("\n{") :])
    assert (live["verdict"]["layer"], live["verdict"]["status"]) == (None, "no_tail"), live["verdict"]
    assert f"under the {fmt_ms(5000)} worth acting on (min_tail_excess_ms)" in live["verdict"]["summary"]
    # ... and neither has the footer's command, from the same directory.
    again_argv = footer_command(floored.stderr, capture)
    again = subprocess.run([sys.executable, "-m", *again_argv, "--format", "json"], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["verdict"] == live["verdict"]
    # --config names a file elsewhere: the footer's command names it too.
    elsewhere = tmp_path / "conf" / "strict.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text("min_tail_excess_ms = 5000\n")
    (tmp_path / "latprof.toml").unlink()
    named = latprof_run(tmp_path, "--skip-warmup", "0", "--format", "json", "--config", str(elsewhere), service=service)
    assert named.returncode == 0, named.stderr
    assert json.loads(named.stdout[named.stdout.index("\n{") :])["verdict"]["status"] == "no_tail"
    assert footer_command(named.stderr, capture)[-2:] == ["--config", str(elsewhere)]


def test_a_bad_config_stops_latprof_run_before_the_service_starts(tmp_path: Path) -> None:
    (tmp_path / "latprof.toml").write_text("min_tail_excess_ms = 'a lot'\n")
    result = latprof_run(tmp_path, "--skip-warmup", "0")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "latprof.toml" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "INFO:" not in result.stdout and not (tmp_path / "capture.jsonl").exists()  # the service never ran


def test_run_writes_the_html_page_with_the_tails_waterfalls(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    result = latprof_run(tmp_path, "--skip-warmup", "0", "--format", "html", "-o", str(page))
    assert result.returncode == 0, result.stderr
    assert f"latprof: report written to {page}" in result.stderr
    again = subprocess.run([sys.executable, "-m", "latprof", "analyze", str(tmp_path / "capture.jsonl"), "--skip-warmup", "0",
                            "--format", "json"], capture_output=True, text=True, timeout=60)  # fmt: skip
    report = json.loads(again.stdout)
    html = page.read_text()
    assert report["verdict"]["summary"].replace("'", "&#x27;") in html
    # the slowest requests (every 20th, 20 ms at the provider) drawn, their provider segment among their bars
    assert html.count('data-role="tail"') >= 1 and 'class="seg" data-layer="provider"' in html


def test_include_attributes_without_html_stops_run_before_the_service_starts(tmp_path: Path) -> None:
    result = latprof_run(tmp_path, "--include-attributes")
    assert result.returncode == 2 and "--format html" in result.stderr
    assert not (tmp_path / "capture.jsonl").exists()
