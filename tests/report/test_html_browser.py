"""The HTML report opened in a real headless Chromium (Debian's `chromium`, driven by Playwright;
never `playwright install`): it loads with no console error and no request but its own file, the
verdict and every finding are in the DOM, the waterfall has a row per example request with
segments of that request's layers, and with JavaScript off the verdict, layer table and findings
still show. Each page's screenshot is kept in `LATPROF_ARTIFACTS` (default
`build/test-artifacts/`); `LATPROF_UPDATE_SCREENSHOT=1` also writes the README's picture
(docs/html-report.png) from the first example's page.

Without Chromium or Playwright the tests skip with the reason; under CI=true that fails.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

import services  # tests/services.py: skip on a developer box, fail under CI=true
from latprof.capture.reader import read_captures
from report.html_pages import EXAMPLES, HOSTILE, OTLP_FIXTURES, ROOT, hostile_capture, latprof

pytestmark = pytest.mark.slow  # a browser, and latprof in subprocesses

ARTIFACTS = Path(os.environ.get("LATPROF_ARTIFACTS") or ROOT / "build" / "test-artifacts") / "html"
SCREENSHOT = ROOT / "docs" / "html-report.png"
#: Chromium as root in a container, with nothing of its own reaching out (updates, sync, field trials).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-default-apps", "--disable-features=Translate"]  # fmt: skip


def _chromium() -> str | None:
    return os.environ.get("LATPROF_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = _chromium()
    if executable is None:
        services.missing("no Chromium (Debian: apt-get install chromium)", "chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        services.missing("Playwright is not installed (pip install -e '.[test]')", "playwright")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Opened:
    """A page opened from a file: what the console said, what was requested, the page itself."""

    def __init__(self, browser: Any, path: Path, *, javascript: bool = True, screenshot: str | None = None) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900}, java_script_enabled=javascript)
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("dialog", lambda d: (self.console.append(f"dialog: {d.message}"), d.dismiss()))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")
        if screenshot:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(ARTIFACTS / f"{screenshot}.png"), full_page=True)

    def texts(self, selector: str) -> list[str]:
        return [t.strip() for t in self.page.locator(selector).all_inner_texts()]

    def attribute(self, selector: str, name: str) -> list[str]:
        return [str(v) for v in self.page.locator(selector).evaluate_all(f"els => els.map(e => e.getAttribute({name!r}))")]

    def assert_clean(self, path: Path) -> None:
        assert self.console == [], self.console
        assert self.requests == [path.as_uri()], self.requests

    def close(self) -> None:
        self.context.close()


def _html_and_json(*args: str, out: Path) -> dict[str, Any]:
    result = latprof(*args, "--format", "html", "-o", str(out))
    assert result.returncode == 0, result.stderr
    report = latprof(*args, "--format", "json")
    assert report.returncode == 0, report.stderr
    return dict(json.loads(report.stdout))


def _segment_layers(capture: Path) -> dict[str, set[str]]:
    """Per request id, the layers of its segments as the capture holds them."""
    data = read_captures([capture])
    return {rid: {s.layer for s in segments if s.layer} for rid, segments in data.segments_by_request.items()}


def _check_report_page(opened: Opened, report: dict[str, Any]) -> None:
    (verdict,) = opened.texts("#verdict .sentence")
    assert verdict == report["verdict"]["summary"]
    cards = opened.attribute("article.finding:not(.request)", "id")
    assert cards == [f"finding-{f['rule']}" for f in report["findings"]]
    for finding in report["findings"]:
        (summary,) = opened.texts(f"#finding-{finding['rule']} > p:not(.fix):not(.dim)")
        assert summary == finding["summary"]
        rows = opened.texts(f"#finding-{finding['rule']} table.evidence tr")
        assert len(rows) == len(finding["evidence"])  # every evidence item, one row each
    layers = opened.texts("#layers tbody tr td:first-child")
    assert layers == [row["layer"] for row in report["layers"]]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name.split(".")[0])
def test_each_example_page_loads_clean_with_its_verdict_findings_and_waterfalls(browser, example, tmp_path):
    out = tmp_path / "report.html"
    report = _html_and_json("analyze", str(example), out=out)
    name = example.name.split(".")[0]
    opened = Opened(browser, out, screenshot=name)
    try:
        opened.assert_clean(out)
        _check_report_page(opened, report)
        drawn = opened.attribute(".wf-row", "data-request-id")
        roles = opened.attribute(".wf-row", "data-role")
        examples = {i for f in report["findings"] for i in f["evidence"].get("example_request_ids", [])}
        assert examples <= set(drawn) and roles.count("median") <= 1 and "tail" in roles
        layers = _segment_layers(example)
        for request_id in drawn:
            row = f'.wf-row[data-request-id="{request_id}"]'
            shown = {layer for layer in opened.attribute(f"{row} .seg", "data-layer") if layer}
            assert shown == layers[request_id], (request_id, shown, layers[request_id])
            on_path = {layer for layer in opened.attribute(f"{row} .piece", "data-layer") if layer}
            assert on_path <= shown
        if report["verdict"]["layer"] not in (None, "unattributed"):
            # the tail's examples spend time on the critical path in the layer the verdict names
            tail_paths = [set(opened.attribute(f'.wf-row[data-request-id="{i}"] .piece', "data-layer"))
                          for i, role in zip(drawn, roles) if role == "tail"]  # fmt: skip
            assert any(report["verdict"]["layer"] in path for path in tail_paths)
        # a click on a segment shows its details (the script runs under the page's policy)
        opened.page.locator(".wf-row .seg:has(text)").first.click()  # a bar wide enough to carry its name
        assert opened.page.locator("#detail").is_visible() and opened.texts("#detail")[0]
        opened.assert_clean(out)
    finally:
        opened.close()
    if os.environ.get("LATPROF_UPDATE_SCREENSHOT") == "1" and example.name.startswith("pool_held_across_llm"):
        # the README's picture: the page as a reader's `latprof analyze examples/... --format html` makes it
        assert latprof("analyze", str(example.relative_to(ROOT)), "--format", "html", "-o", str(out)).returncode == 0
        shot = Opened(browser, out)
        shot.assert_clean(out)
        shot.page.screenshot(path=str(SCREENSHOT), full_page=True, clip={"x": 0, "y": 0, "width": 1280, "height": 1640})
        shot.close()


def test_without_javascript_the_verdict_layers_and_findings_still_show(browser, tmp_path):
    example = next(p for p in EXAMPLES if p.name.startswith("pool_held_across_llm"))
    out = tmp_path / "report.html"
    report = _html_and_json("analyze", str(example), out=out)
    opened = Opened(browser, out, javascript=False, screenshot="no-javascript")
    try:
        opened.assert_clean(out)
        _check_report_page(opened, report)
        assert opened.page.locator(".wf-row .seg").count() > 0  # SVG draws without the script
    finally:
        opened.close()


def test_hostile_names_show_as_text_and_run_nothing(browser, tmp_path):
    capture = hostile_capture(tmp_path / "hostile.jsonl")
    out = tmp_path / "report.html"
    report = _html_and_json("analyze", str(capture), out=out)
    opened = Opened(browser, out, screenshot="hostile")
    try:
        opened.assert_clean(out)  # no dialog, no request for the <img>
        _check_report_page(opened, report)
        assert opened.page.locator("script").count() == 1 and opened.page.locator("img").count() == 0
        assert any(HOSTILE in t for t in opened.texts(".wf-head b"))  # the route, as text
    finally:
        opened.close()


def test_a_trace_file_page_explains_its_request(browser, tmp_path):
    out = tmp_path / "trace.html"
    report = _html_and_json("analyze", str(OTLP_FIXTURES[0]), out=out)
    opened = Opened(browser, out, screenshot="trace")
    try:
        opened.assert_clean(out)
        _check_report_page(opened, report)
        assert opened.attribute(".wf-row", "data-request-id") == [r["request_id"] for r in report["requests"]]
        kinds = [f["kind"] for r in report["requests"] for f in r["findings"]]
        assert len(opened.texts(".request-finding")) == len(kinds)
    finally:
        opened.close()


def test_a_diff_page_shows_both_sides_and_the_findings_that_came_and_went(browser, tmp_path):
    before, after = (next(p for p in EXAMPLES if p.name.startswith(n)) for n in ("healthy", "pool_held_across_llm"))
    out = tmp_path / "diff.html"
    result = latprof("diff", str(before), str(after), "--format", "html", "-o", str(out))
    assert result.returncode == 0, result.stderr
    diff = json.loads(latprof("diff", str(before), str(after), "--format", "json").stdout)
    opened = Opened(browser, out, screenshot="diff")
    try:
        opened.assert_clean(out)
        assert opened.texts("#summary .sentence") == [diff["summary"]]
        assert opened.texts("#before .sentence") == [diff["before"]["verdict"]["summary"]]
        assert opened.texts("#after .sentence") == [diff["after"]["verdict"]["summary"]]
        assert opened.texts("#layers tbody tr td:first-child") == [row["layer"] for row in diff["layers"]]
        assert opened.attribute("ul.appeared li", "data-rule") == [f["rule"] for f in diff["findings"]["appeared"]]
        assert opened.attribute("ul.disappeared li", "data-rule") == [f["rule"] for f in diff["findings"]["disappeared"]]
    finally:
        opened.close()


def test_an_attach_capture_page_shows_the_second_by_second_timeline(browser, tmp_path):
    """A real attach capture: gunicorn sync workers saturated by offered load, sampled from outside."""
    sys.path.insert(0, str(ROOT / "tests"))
    from attach.procs import attach_under_load

    attach_under_load(tmp_path, ["-w", "2"], "/chat/1?ms=100", 8, duration_s=4)
    capture = tmp_path / "attach.jsonl"
    out = tmp_path / "attach.html"
    report = _html_and_json("analyze", str(capture), out=out)
    assert report["source"]["kind"] == "attach"
    opened = Opened(browser, out, screenshot="attach")
    try:
        opened.assert_clean(out)
        _check_report_page(opened, report)
        seconds = [w for w in report["p99_over_time"]["windows"] if "busy_workers" in w or "requests_in_flight" in w]
        assert opened.page.locator("#over-time .win").count() == len(seconds) >= 2
    finally:
        opened.close()
