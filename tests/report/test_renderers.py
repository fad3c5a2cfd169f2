"""Renderers format a finished report into a fixed-width console or JSON, computing nothing; every
kind of result has its formats in one registry."""

from __future__ import annotations

import dataclasses
import io
import json
import re

import pytest
from rich.console import Console
from timelines import analysed, population

from latprof.report import renderers
from latprof.engine import Finding, fingerprint
from latprof.report.renderers.report_text import print_report
from latprof.report.model import build_report


def report_with_pool_tail():
    a = analysed(population(200, [("db.query", 20), ("provider", 400)], [("db.pool", 3000), ("db.query", 20), ("provider", 400)]))
    finding = Finding(
        "db-pool-exhaustion",
        "db.pool",
        "critical",
        0.95,
        3000.0,
        "The slowest 1% waited 3.0 s longer for a connection.",
        {"pool_max": 5, "peak_waiters": 24},
        "Release the connection before the LLM call.",
        fingerprint("db-pool-exhaustion", "db.pool", "main"),
    )
    return build_report(a, [finding])


def render(report, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    print_report(report, console)
    return console.export_text()


def test_text_puts_the_verdict_first_then_layers_findings_and_collection():
    text = render(report_with_pool_tail(), 120)
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0].startswith("latprof  run: <test>")
    assert lines[1].startswith("200 requests over 23 s   p50 422 ms · p90 424 ms · p99 3.4 s")
    assert lines[2].startswith("VERDICT  db.pool  db.pool owns 100% of the tail")
    order = [text.index(s) for s in ("VERDICT", "layer", "Findings", "p99 over time", "What latprof could see")]
    assert order == sorted(order)
    table = text[text.index("layer") : text.index("Findings")]
    assert "db.pool" in table and "3.0 s" in table and "100%" in table and "█" * 20 in table
    assert "waiting to check a connection" in table  # wide consoles explain each layer
    assert "● critical db-pool-exhaustion  db.pool  impact 3.0 s" in text
    assert evidence_lines(text) == ["evidence", "  pool max        5", "  peak waiters    24"]
    assert "fix: Release the connection before the LLM call." in text
    assert "coverage 100%" in text


def evidence_lines(text: str) -> list[str]:
    """The finding's evidence block, from its label to the fix, less the finding's indent and the padding."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "evidence")
    end = next(i for i, line in enumerate(lines) if i > start and line.strip().startswith("fix:"))
    return [line[2:].rstrip() for line in lines[start:end]]


def report_with_evidence(evidence: dict[str, object]):
    report = report_with_pool_tail()
    finding = dataclasses.replace(report.findings[0], evidence=evidence)
    return dataclasses.replace(report, findings=[finding])


def test_the_evidence_is_a_table_of_every_key_in_order_with_values_rounded_and_units():
    evidence = {
        "pool_wait_p99_ms": 356.568, "share_of_tail_excess": 0.9951, "mean_utilisation": 0.7185, "cpu_percent": 95.0,
        "accept_rate_per_s": 12.345, "dominates_median": True, "ms_per_1k_input_tokens": None,
        "pools": ["sqlite:///demo.db", "postgresql://db/app"], "queue_sources": {"threadpool": 381},
        "mean_hold_ms": 235.898,
    }  # fmt: skip
    rows = [line.strip() for line in evidence_lines(render(report_with_evidence(evidence), 120))[1:]]
    assert [re.split(r"\s{2,}", line) for line in rows] == [
        ["pool wait p99", "357 ms"],
        ["share of tail excess", "99.5%"],
        ["mean utilisation", "71.9%"],
        ["cpu", "95%"],
        ["accept rate", "12.3/s"],
        ["dominates median", "yes"],
        ["ms per 1k input tokens", "-"],
        ["pools", "sqlite:///demo.db, postgresql://db/app"],
        ["queue sources", "threadpool: 381"],
        ["mean hold", "236 ms"],
    ]


def test_a_finding_without_evidence_has_no_evidence_block():
    text = render(report_with_evidence({}), 120)
    assert "evidence" not in text and "fix: Release the connection" in text


def test_an_inferred_finding_says_so_in_its_evidence_and_not_dimmed():
    evidence = {"pool_wait_p99_ms": 300.0, "inferred": True, "inferred_from": "gaps between the spans of a trace"}
    console = Console(file=io.StringIO(), width=120, record=True, color_system="standard", force_terminal=True)
    print_report(report_with_evidence(evidence), console)
    styled = console.export_text(styles=True, clear=False)
    assert [line.strip() for line in evidence_lines(console.export_text())[1:]] == [
        "pool wait p99    300 ms", "inferred         yes", "inferred from    gaps between the spans of a trace"
    ]  # fmt: skip
    inferred_from = next(line for line in styled.splitlines() if "gaps between the spans" in line)
    pool_wait = next(line for line in styled.splitlines() if "pool wait p99" in line)
    assert "\x1b[2m" in pool_wait and "\x1b[2m" not in inferred_from and "\x1b[33m" in inferred_from


def test_narrow_console_keeps_the_numbers_and_drops_the_explanations():
    text = render(report_with_pool_tail(), 80)
    assert "waiting to check a connection" not in text
    table = text[text.index("layer") : text.index("Findings")]
    assert "tail excess" in table and "3.0 s" in table and "100%" in table
    assert max(len(line) for line in text.splitlines()) <= 80


def test_long_evidence_wraps_within_a_narrow_console():
    ids = [f"request-{i:04d}" for i in range(5)]
    text = render(report_with_evidence({"tail_ttft_above_floor_and_prompt_ms": 1802.192, "example_request_ids": ids}), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    lines = evidence_lines(text)
    assert lines[1].split() == ["tail", "ttft", "above", "floor", "and", "prompt", "1,802", "ms"]
    value_at = lines[1].index("1,802")  # the values' column: the ids wrap inside it, under one another
    assert lines[2][:value_at].strip() == "example request ids" and len(lines) > 3
    assert " ".join(line[value_at:].strip() for line in lines[2:]) == ", ".join(ids)


def test_no_tail_verdict_is_rendered_as_such():
    a = analysed(population(200, [("provider", 400)], [("provider", 500)]))
    text = render(build_report(a, []), 100)
    assert "VERDICT  no tail  No tail worth explaining" in text
    assert "Findings" not in text


def test_json_renderer_writes_the_report_dict():
    report = report_with_pool_tail()
    out = io.StringIO()
    renderers.REPORT.render("json", report, out)
    assert json.loads(out.getvalue()) == json.loads(json.dumps(report.to_dict()))


def test_renderers_are_registered_by_name():
    assert {"text", "json"} <= set(renderers.REPORT.names())


def test_too_few_requests_is_no_verdict_not_a_healthy_service():
    a = analysed(population(20, [("provider", 400)], [("db.pool", 3000), ("provider", 400)]))
    text = render(build_report(a, []), 100)
    assert "VERDICT  no verdict  Too few requests for a verdict: 20 analysed, 50 needed" in text


def test_an_asyncio_attach_report_shows_requests_in_flight_and_the_loop_per_second():
    from dataclasses import replace

    from latprof.report.model import WindowRow

    rows = [WindowRow(float(s), None, None, {"workers": 1, "busy_workers": 0, "top_layer": "event_loop", "accept_queue": 0,
                                             "requests_in_flight": flight, "loop_busy_share": busy})
            for s, (flight, busy) in enumerate([(12.0, 0.05), (11.5, 0.5)])]  # fmt: skip
    report = report_with_pool_tail()
    text = render(replace(report, source={**report.source, "kind": "attach"}, p99_over_time=rows, window_s=1.0), 120)
    assert "per second (requests in flight, event loop busy, accept queue)" in text
    assert "0s  in flight  12.0  loop   5%  queue 0" in text and "1s  in flight  11.5  loop  50%  queue 0" in text


def test_every_kind_of_result_has_its_formats_in_one_registry():
    assert {kind: formats.names() for kind, formats in renderers.KINDS.items()} == {
        "report": ["html", "json", "text"],
        "check": ["json", "markdown", "text"],
        "diff": ["html", "json", "markdown", "text"],
        "rules": ["json", "markdown", "text"],
    }


def test_each_command_offers_the_formats_of_its_kind():
    import click

    from latprof.cli import main

    def choices(*path: str) -> list[str]:
        command = main
        for name in path:
            assert isinstance(command, click.Group)
            command = command.commands[name]
        (option,) = [p for p in command.params if p.name == "fmt"]
        assert isinstance(option.type, click.Choice)
        return list(option.type.choices)

    for command in ("analyze", "run", "attach", "receive", "demo"):
        assert choices(command) == renderers.REPORT.names()
    assert choices("check") == renderers.CHECK.names()
    assert choices("diff") == renderers.DIFF.names()
    assert choices("rules") == renderers.RULES.names()


def test_a_registered_format_is_named_and_rendered_and_an_unknown_one_is_a_value_error():
    shout: renderers.Formats[str] = renderers.Formats("shout", lambda: None)

    @shout.register("upper")
    def upper(value: str, out) -> None:
        out.write(value.upper())

    out = io.StringIO()
    shout.render("upper", "p99", out)
    assert out.getvalue() == "P99" and shout.names() == ["upper"] and shout.get("upper") is upper
    with pytest.raises(ValueError, match="unknown shout format 'lower'; known: upper"):
        shout.render("lower", "p99", out)
