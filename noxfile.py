"""Test sessions per supported line of the libraries the hooks patch and the stack signatures match (run by .ci/run).

The README's test command covers the newest releases (openai 3.x on httpx2, SQLAlchemy
2.1, psycopg_pool 3.3, asyncpg 0.32, redis-py 8); `nox -s hooks_legacy` runs the hook tests
against the older supported lines (openai 2.x on httpx, SQLAlchemy 2.0, psycopg_pool 3.2,
asyncpg 0.29, redis-py 5) in an environment of their own. Skips are failures here: a hook
test that skips has not tested that line.
"""

import glob
import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["hooks_legacy", "inject_pythons"]


def _pyenv(version: str) -> str:
    """CPython `version` as pyenv installed it (its shims answer only for the global version), else from PATH."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))
    return found[-1] if found else f"python{version}"


#: `attach --inject` is tested on every supported CPython (3.11 from pyenv is the README command's): pyenv's builds (shared libpython) and
#: Debian's own python3 package (libpython linked statically into a non-PIE executable).
INJECT_PYTHONS = [_pyenv(v) for v in ("3.10", "3.12", "3.13")] + (
    ["/usr/bin/python3.11"] if os.path.exists("/usr/bin/python3.11") else []
)


@nox.session
def hooks_legacy(session: nox.Session) -> None:
    session.install("-e", ".[test]", "-c", "tests/constraints.txt", "openai>=2,<3", "sqlalchemy>=2.0,<2.1", "psycopg-pool>=3.2,<3.3", "asyncpg>=0.29,<0.30", "redis>=5,<6")
    session.run(
        "python",
        "-c",
        "import openai, sqlalchemy, psycopg_pool, asyncpg, redis; print('openai', openai.__version__, '- sqlalchemy',"
        " sqlalchemy.__version__, '- psycopg_pool', psycopg_pool.__version__, '- asyncpg', asyncpg.__version__,"
        " '- redis', redis.__version__)",
    )
    session.run(
        "python", "-m", "pytest", "tests/collectors/hooks", "tests/collectors/attach/test_signatures.py",  # stack signatures per library line
        "tests/attach/test_attach_async_e2e.py",  # asyncio attach: openai 2.x, SQLAlchemy 2.0 and asyncpg 0.29 in the service
        "tests/collectors/traces",  # stock OpenTelemetry traces: openai 2.x runs on httpx, so its LLM calls are httpx client spans
        # the OpenAI Agents SDK runs on openai 3.x only: its test is the README command's
        "--deselect", "tests/collectors/hooks/test_agent_tools_hook.py::test_agents_sdk_function_tools_run_in_parallel_with_their_call_ids",
        *session.posargs, env={"LATPROF_FORBID_SKIPS": "1"},
    )  # fmt: skip


@nox.session(python=INJECT_PYTHONS)
def inject_pythons(session: nox.Session) -> None:
    """The injection's tests with the service, latprof and the injection all on one CPython line (skips fail);
    the demo faults and the soak (which need the demo's libraries) run in the README's environment."""
    session.install("-e", ".", "pytest", "jsonschema", "uvicorn", "gunicorn", "flask", "-c", "tests/constraints.txt")
    tests = session.posargs or ["tests/inject/test_inject.py", "tests/inject/test_inject_container.py"]
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, env={"LATPROF_FORBID_SKIPS": "1"})
