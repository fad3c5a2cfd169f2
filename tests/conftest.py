import sys
from pathlib import Path

# Make tests/timelines.py importable as `timelines` whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))


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
