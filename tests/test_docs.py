"""The README and docs/: short, generated parts fresh, every link resolving, nothing pointing outside the repository."""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RULES_DOC = DOCS / "rules.md"
REGENERATE_RULES = "python -m latprof rules --format markdown > docs/rules.md"

#: The README is what a newcomer reads in two minutes; the rest belongs in docs/.
README_MAX_LINES = 200
#: `.ci/run` runs the line two lines after this marker (the line after it opens the fence).
TEST_COMMAND_MARKER = "<!-- test-command -->"
TEST_COMMAND = "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test,test-agents-sdk]' -c tests/constraints.txt && python -m pytest"
FAST_SUBSET = 'python -m pytest -m "not slow"'

#: Text that points at files outside this repository (the notes it was written from).
OUTSIDE = re.compile(r"\.\./shared|/work/|DESIGN\.md|STYLE\.md|signals\.md|(?<![\w./-])spec/")

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks (whose `#` lines are not headings)."""
    return _FENCE.sub("", text)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a markdown file (lower case, punctuation
    dropped, spaces as hyphens; a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(prose(path.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    text = _CODE_SPAN.sub("", prose(path.read_text(encoding="utf-8")))
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


def test_docs_rules_md_is_what_latprof_rules_prints() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "latprof", "rules", "--format", "markdown"],
        cwd=ROOT, capture_output=True, text=True, encoding="utf-8", check=True,
    ).stdout  # fmt: skip
    written = RULES_DOC.read_text(encoding="utf-8") if RULES_DOC.exists() else ""
    if written != printed:
        diff = "".join(list(difflib.unified_diff(written.splitlines(True), printed.splitlines(True),
                                                 "docs/rules.md", "latprof rules --format markdown"))[:40])
        pytest.fail(f"docs/rules.md is stale: regenerate it from the repository's root with\n"
                    f"    {REGENERATE_RULES}\n{diff}")  # fmt: skip


def test_readme_is_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move details into docs/ and link them"
    )


def test_readme_keeps_the_test_command_ci_runs_and_the_fast_subset() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert TEST_COMMAND_MARKER in lines, "README.md lost the test-command marker .ci/run looks for"
    at = lines.index(TEST_COMMAND_MARKER)
    assert lines[at + 1] == "```sh" and lines[at + 2] == TEST_COMMAND
    assert FAST_SUBSET in README.read_text(encoding="utf-8")
    assert re.search(r'^\s*"slow:', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M), (
        "the fast subset leaves out the `slow` marker, which pyproject.toml must declare"
    )


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_and_heading_that_exist(doc: Path) -> None:
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_links_every_docs_page() -> None:
    readme = README.read_text(encoding="utf-8")
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if f"(docs/{p.name}" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_text_points_outside_the_repository(doc: Path) -> None:
    hits = [
        f"{doc.relative_to(ROOT)}:{n}: {line.strip()}"
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, "text pointing outside the repository:\n" + "\n".join(hits)


def source_files() -> list[Path]:
    """Every Python file of the project (not following latprof/'s links to collectors/ and rules/)."""
    import os

    found = []
    for top in ("latprof", "collectors", "rules", "tests", "benchmarks", "examples"):
        for folder, dirs, files in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [Path(folder, f) for f in files if f.endswith(".py")]
    return sorted(found)


def test_no_code_comment_points_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in source_files()
        if path.resolve() != this
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert len(source_files()) > 100
    assert not hits, "code pointing outside the repository (point at docs/ instead):\n" + "\n".join(hits)


def test_the_link_checker_finds_broken_links_and_knows_headings(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A `latprof check` page\n\n```sh\n# not a heading\n```\n\n## Same\n\n## Same\n\n"
        "[ok](#a-latprof-check-page) [two](#same-1) [web](https://example.com) `[code](missing.md)`\n",
        encoding="utf-8",
    )
    assert anchors(page) == {"a-latprof-check-page", "same", "same-1"}
    assert relative_links(page) == ["#a-latprof-check-page", "#same-1"]
