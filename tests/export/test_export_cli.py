"""`latprof export` through click: files written, and bad input as one line on stderr with exit code 2."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from latprof.cli import main

EXAMPLE = Path(__file__).parents[2] / "examples" / "healthy.jsonl.gz"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("fmt", ["perfetto", "otlp"])
def test_export_writes_the_file_and_nothing_on_stdout(fmt: str, tmp_path: Path) -> None:
    target = tmp_path / f"out.{fmt}"
    code, out, err = invoke("export", str(EXAMPLE), "--format", fmt, "-o", str(target))
    assert (code, out, err) == (0, "", "")
    first = json.loads(target.read_text().splitlines()[0])
    assert ("traceEvents" if fmt == "perfetto" else "resourceSpans") in first


def test_without_output_the_export_goes_to_stdout() -> None:
    code, out, _ = invoke("export", str(EXAMPLE), "--format", "otlp")
    assert code == 0 and all("resourceSpans" in json.loads(line) for line in out.splitlines())


def one_line_error(code: int, err: str) -> str:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


def test_a_missing_capture_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code, _, err = invoke("export", str(tmp_path / "nope.jsonl"), "--format", "perfetto", "-o", str(tmp_path / "x.json"))
    assert "no such file" in one_line_error(code, err)
    assert not (tmp_path / "x.json").exists()


def test_a_malformed_capture_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "request", "oops": 1}\nnot json\n')
    code, _, err = invoke("export", str(bad), "--format", "otlp", "-o", str(tmp_path / "x.jsonl"))
    assert "not a latprof capture" in one_line_error(code, err)


def test_a_capture_damaged_before_its_end_is_one_line_and_exit_2(tmp_path: Path) -> None:
    lines = gzip.decompress(EXAMPLE.read_bytes()).splitlines(keepends=True)
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b"".join(lines[:5] + [b'{"type": "segm\n'] + lines[5:10]))
    code, _, err = invoke("export", str(torn), "--format", "perfetto", "-o", str(tmp_path / "x.json"))
    assert "malformed line" in one_line_error(code, err)


def test_a_torn_last_line_is_skipped_and_the_rest_exported(tmp_path: Path) -> None:
    lines = gzip.decompress(EXAMPLE.read_bytes()).splitlines(keepends=True)
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b"".join(lines[:40]) + b'{"type": "segm')
    code, _, _ = invoke("export", str(torn), "--format", "otlp", "-o", str(tmp_path / "x.jsonl"))
    assert code == 0 and (tmp_path / "x.jsonl").read_text()


def test_an_empty_capture_is_one_line_and_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = invoke("export", str(empty), "--format", "otlp")
    assert "empty" in one_line_error(code, err)


@pytest.mark.parametrize("where", ["missing-dir/x.json", "a-file/x.json"])
def test_an_unwritable_output_is_one_line_and_exit_2(where: str, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    code, _, err = invoke("export", str(EXAMPLE), "--format", "perfetto", "-o", str(tmp_path / where))
    assert "cannot write" in one_line_error(code, err)


def test_an_unknown_format_is_a_usage_error() -> None:
    code, _, err = invoke("export", str(EXAMPLE), "--format", "zipkin")
    assert code == 2 and "zipkin" in err
