"""Hypothesis for the fuzz tests: the same cases from the same code on every run, no example database in the repository."""

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis caches what it learns of the code (constants, Unicode tables) in ./.hypothesis even
# without an example database: outside the working tree instead.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "latprof-hypothesis")

settings.register_profile(
    "latprof-fuzz",
    # The same cases on every run, so a failure in CI is the same failure on a laptop.
    # LATPROF_FUZZ_EXPLORE=1 draws new ones (a failure prints the seed for --hypothesis-seed).
    derandomize=not os.environ.get("LATPROF_FUZZ_EXPLORE"),
    database=None,  # no .hypothesis directory in the working tree
    deadline=None,  # the sandbox holds each case to its time limit, in the child
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.load_profile("latprof-fuzz")
