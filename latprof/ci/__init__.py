"""latprof in CI: the config, `latprof check` and `latprof diff`, JUnit, SARIF, GitHub Actions, the pytest plugin."""
