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
