import sys
from pathlib import Path

import pytest

# Make tests/timelines.py importable as `timelines` whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True, scope="session")
def _every_report_matches_the_schema():
    """Every report a test makes in-process is held to docs/report-v1.schema.json: `Report.to_dict`
    (which the JSON renderer and every `--format json` in a CliRunner call go through) validates
    what it returns. `pytest.fail` is not an Exception, so a CLI that turns errors into exit codes
    cannot swallow it. Reports printed by `latprof` subprocesses: the next fixture."""
    from report_schema import schema_errors

    from latprof.report.model import Report

    to_dict = Report.to_dict

    def validated(self: Report) -> dict:
        out = to_dict(self)
        errors = schema_errors(out)
        if errors:
            pytest.fail("a report does not match docs/report-v1.schema.json:\n  " + "\n  ".join(errors))
        return out

    Report.to_dict = validated  # type: ignore[method-assign]
    yield
    Report.to_dict = to_dict  # type: ignore[method-assign]


@pytest.fixture(autouse=True, scope="session")
def _every_printed_report_matches_the_schema():
    """Reports that `latprof` subprocesses print (`subprocess.run` of `python -m latprof ...
    --format json`, `latprof run` with a service's lines before the report) are held to the
    schema too: each one found on a finished command's stdout is validated."""
    import subprocess

    from report_schema import printed_report, schema_errors

    run = subprocess.run

    def checked(*args, **kwargs):  # type: ignore[no-untyped-def]
        done = run(*args, **kwargs)
        argv = args[0] if args else kwargs.get("args")
        if isinstance(argv, (list, tuple)) and any(str(a) == "latprof" or str(a).endswith("/latprof") for a in argv):
            report = printed_report(done.stdout)
            errors = schema_errors(report) if report is not None else []
            if errors:
                pytest.fail(f"{' '.join(map(str, argv))} printed a report that does not match docs/report-v1.schema.json:\n  "
                            + "\n  ".join(errors))  # fmt: skip
        return done

    subprocess.run = checked  # type: ignore[assignment]
    yield
    subprocess.run = run  # type: ignore[assignment]


#: Requests outside the cohorts a forced cohort-first analysis reads in `_cohort_first_says_what_the_full_analysis_says`:
#: few, so that most of a test's capture is left unread and the comparison means something.
COMPARED_SAMPLE_REQUESTS = 20


def cohort_first_differences(full, forced) -> list[str]:  # type: ignore[no-untyped-def]
    """What a cohort-first report (`forced`) says differently from the full analysis's (`full`) of the
    same capture: the verdict, the rules that fired, and every number the tail rests on - latency,
    window, p99 over time, each layer's tail excess and share of it. Layer p50/p99 are estimated:
    not compared (nor whether a layer with no time in any cohort has a row)."""
    a, b = full.to_dict(), forced.to_dict()
    out = []
    for key in ("latency_ms", "window", "source"):
        if a[key] != b[key]:
            out.append(f"{key}: {a[key]} != {b[key]}")
    va, vb = a["verdict"] or {}, b["verdict"] or {}
    for key in ("layer", "rule", "status", "share_of_tail_excess"):
        if va.get(key) != vb.get(key):
            out.append(f"verdict.{key}: {va.get(key)!r} != {vb.get(key)!r}")
    if sorted(f["rule"] for f in a["findings"]) != sorted(f["rule"] for f in b["findings"]):
        out.append(f"findings: {sorted(f['rule'] for f in a['findings'])} != {sorted(f['rule'] for f in b['findings'])}")
    # a layer with no time in any cohort (a row only because some request outside them had some) may be
    # missing from the sample: its row is an estimate, its tail numbers (0) are not
    tail_a = {row["layer"]: (row["tail_excess_ms"], row["share_of_tail_excess"]) for row in a["layers"]}
    tail_b = {row["layer"]: (row["tail_excess_ms"], row["share_of_tail_excess"]) for row in b["layers"]}
    tail_a, tail_b = ({k: v for k, v in tail.items() if v != (0.0, 0.0)} for tail in (tail_a, tail_b))
    if tail_a != tail_b:
        out.append(f"layers' tail excess: {tail_a} != {tail_b}")
    if a.get("p99_over_time") != b.get("p99_over_time"):
        out.append("p99_over_time differs (requests, p99, arrivals, completions or in flight of a window)")
    return out


@pytest.fixture(autouse=True, scope="session")
def _cohort_first_says_what_the_full_analysis_says():
    """Every capture a test diagnoses in-process (`latprof.pipeline.run_diagnosis`: analyze, check,
    diff, the demo, the rules' end-to-end tests with real services) is diagnosed a second time
    cohort-first, reading the segments of the cohorts, the windows' tails and only
    `COMPARED_SAMPLE_REQUESTS` others, and must give the same verdict, rules and tail numbers
    (`cohort_first_differences`); trace files too (mapped and inferred whole, then analysed cohort-first).
    Attach captures are read whole: not compared."""
    import latprof.pipeline as pipeline
    from latprof.analysis.requests import MIN_REQUESTS_FOR_VERDICT

    original = pipeline.run_diagnosis

    def compared(paths, **kwargs):  # type: ignore[no-untyped-def]
        paths = list(paths)
        full = original(paths, **kwargs)
        analysis = full.analysis
        if (kwargs.get("exact") or kwargs.get("trace_id") or analysis is None or analysis.population is not None
                or len(analysis.requests) < MIN_REQUESTS_FOR_VERDICT):  # fmt: skip
            return full
        forced = original(paths, **{**kwargs, "sample_requests": COMPARED_SAMPLE_REQUESTS, "max_read_share": 1.0})
        if forced.analysis is not None and forced.analysis.population is not None:
            problems = cohort_first_differences(full.report, forced.report)
            if problems:
                pytest.fail(f"a cohort-first analysis of {[str(p) for p in paths]} differs from the full one:\n  "
                            + "\n  ".join(problems))  # fmt: skip
        return full

    # A module that imports it by name later (latprof.demo.run) takes the compared one; one imported
    # already is patched (not imported here: the demo needs httpx, which some test sessions lack).
    pipeline.run_diagnosis = compared  # type: ignore[assignment]
    demo_run = sys.modules.get("latprof.demo.run")
    if demo_run is not None:
        demo_run.run_diagnosis = compared  # type: ignore[attr-defined]
    yield
    pipeline.run_diagnosis = original  # type: ignore[assignment]
    demo_run = sys.modules.get("latprof.demo.run")
    if demo_run is not None and getattr(demo_run, "run_diagnosis", None) is compared:
        demo_run.run_diagnosis = original  # type: ignore[attr-defined]


def pytest_sessionfinish(session, exitstatus):
    """With LATPROF_FORBID_SKIPS=1 (CI's per-version sessions) a skipped test fails the run."""
    import os

    if os.environ.get("LATPROF_FORBID_SKIPS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped and session.exitstatus == 0:
        session.exitstatus = 1
        if reporter:
            reporter.write_line(f"LATPROF_FORBID_SKIPS: {skipped} test(s) skipped; this session must test everything", red=True)
