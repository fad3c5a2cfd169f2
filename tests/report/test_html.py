"""`--format html`: one self-contained page, every capture string escaped, attributes from an allowlist.

The page is checked as text here; tests/report/test_html_browser.py opens it in Chromium.
"""

from __future__ import annotations

import json
import re

import pytest

from report.html_pages import EXAMPLES, HOSTILE, OTLP_FIXTURES, STATEMENT, URL, csp_of, hostile_capture, inline, latprof, sha256_source


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    return hostile_capture(tmp_path_factory.mktemp("hostile") / "hostile.jsonl")


def test_the_policy_allows_exactly_the_pages_own_style_and_script():
    page = latprof("analyze", str(EXAMPLES[0]), "--format", "html").stdout
    (style,), (script,) = inline(page, "style"), inline(page, "script")
    policy = csp_of(page)
    assert policy.startswith("default-src 'none';")
    assert f"style-src {sha256_source(style)};" in policy and f"script-src {sha256_source(script)};" in policy
    # nothing else inline that the policy would have to allow, and nothing to load
    assert page.count("<script") == 1 and page.count("<style") == 1
    assert not re.search(r"\s(?:style|on[a-z]+)=", page), "an inline style or event-handler attribute"
    assert not re.search(r"""(?:src|href)=["']?(?:https?:|//)|url\(|@import""", page), "a reference to something outside the file"


def test_hostile_capture_strings_are_escaped_everywhere(hostile, tmp_path):
    out = tmp_path / "r.html"
    result = latprof("analyze", str(hostile), "--format", "html", "-o", str(out))
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    report = json.loads(latprof("analyze", str(hostile), "--format", "json").stdout)
    assert report["findings"], "the capture should give at least one finding to render"
    assert "<script>alert" not in page and "<img" not in page  # no element made of capture text
    escaped = HOSTILE.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;").replace("'", "&#x27;")
    assert escaped in page  # the text is there, as text: in the route, the segment names, the pool's name
    assert page.count("<script") == 1


def test_statements_and_urls_only_with_include_attributes(hostile):
    plain = latprof("analyze", str(hostile), "--format", "html").stdout
    assert STATEMENT not in plain and "private-words" not in plain
    assert "api.internal" in plain  # an allowlisted attribute (server.address) is shown
    full = latprof("analyze", str(hostile), "--format", "html", "--include-attributes").stdout
    assert STATEMENT in full and URL in full


def test_include_attributes_without_html_is_a_usage_error(hostile):
    result = latprof("analyze", str(hostile), "--include-attributes")
    assert result.returncode == 2 and "--format html" in result.stderr and "Traceback" not in result.stderr


def test_every_finding_and_the_verdict_are_in_the_page_of_each_example():
    for example in EXAMPLES:
        report = json.loads(latprof("analyze", str(example), "--format", "json").stdout)
        page = latprof("analyze", str(example), "--format", "html").stdout
        verdict = report["verdict"]["summary"].replace("&", "&amp;").replace("'", "&#x27;").replace('"', "&quot;")
        assert verdict.replace("<", "&lt;").replace(">", "&gt;") in page, example
        for finding in report["findings"]:
            assert f'id="finding-{finding["rule"]}"' in page, (example, finding["rule"])
        for request_id in {i for f in report["findings"] for i in f["evidence"].get("example_request_ids", [])}:
            assert f'data-request-id="{request_id}"' in page, (example, request_id)


def test_a_single_trace_is_drawn_and_explained():
    page = latprof("analyze", str(OTLP_FIXTURES[0]), "--format", "html").stdout
    report = json.loads(latprof("analyze", str(OTLP_FIXTURES[0]), "--format", "json").stdout)
    assert report["requests"], "a single trace is explained request by request"
    assert 'id="requests"' in page and 'class="wf-row"' in page
    for explained in report["requests"]:
        assert f'data-request-id="{explained["request_id"]}"' in page


def test_a_report_saved_as_json_is_not_an_input_for_html_pictures_but_diff_renders(tmp_path):
    saved = tmp_path / "before.json"
    assert latprof("analyze", str(EXAMPLES[0]), "--format", "json", "-o", str(saved)).returncode == 0
    out = tmp_path / "diff.html"
    result = latprof("diff", str(saved), str(EXAMPLES[-1]), "--format", "html", "-o", str(out))
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    assert 'id="before"' in page and 'id="after"' in page and 'id="layers"' in page
    assert page.count("<script") == 1 and "default-src 'none'" in csp_of(page)


def test_a_request_with_thousands_of_segments_draws_the_longest_and_counts_the_rest(tmp_path):
    from latprof.capture.writer import CaptureWriter
    from latprof.events import Request, Segment

    path = tmp_path / "wide.jsonl"
    writer = CaptureWriter(path, flush_interval_s=0.05)
    origin, ms = 1_764_000_000 * 10**9, 1_000_000
    for i in range(60):
        rid, start = f"r{i}", origin + i * 100 * ms
        for k in range(2_000):  # an N+1 of 2,000 statements
            writer.emit(Segment(rid, f"{rid}-{k}", None, f"SELECT row {k}", "db.query", start + k * 40_000, start + k * 40_000 + 30_000, 1))
        writer.emit(Request(rid, "GET /report", start, start + (90 if i % 20 == 19 else 81) * ms, 1, ms, 200))
    writer.close()
    page = latprof("analyze", str(path), "--format", "html").stdout
    assert page.count('class="seg"') <= 6 * 300  # MAX_TAIL_EXAMPLES + the median, MAX_BARS each
    assert "1700 shorter segments not drawn" in page
    assert len(page.encode()) < 2 * 2**20


@pytest.mark.long
def test_the_page_of_a_100k_request_capture_stays_under_2_mib(tmp_path):
    import subprocess
    import sys

    from report.html_pages import ROOT

    capture = tmp_path / "big.jsonl"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_capture.py"), str(capture), "--requests", "100000"], check=True,
                   capture_output=True)  # fmt: skip
    out = tmp_path / "big.html"
    result = latprof("analyze", str(capture), "--format", "html", "-o", str(out), timeout=600)
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    assert out.stat().st_size <= 2 * 2**20 and page.count('class="wf-row"') >= 2 and 'id="over-time"' in page
