"""Test sessions per supported line of the libraries the hooks patch and the stack signatures match (run by .ci/run).

The README's test command covers the newest releases (openai 3.x on httpx2, SQLAlchemy
2.1, psycopg_pool 3.3, asyncpg 0.32, redis-py 8); `nox -s hooks_legacy` runs the hook tests
against the older supported lines (openai 2.x on httpx, anthropic 1.0, SQLAlchemy 2.0, psycopg_pool 3.2,
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


#: End-to-end verdict tests whose every line of library code the tests kept on the older lines already
#: drive (the hook tests, and the kept verdicts: the pool held across the LLM call on PostgreSQL, streamed
#: long outputs, provider spikes, the sampled capture): the same demo service under the other server, or
#: the tool-call rule's negative cases, which read no library-line-specific event.
LINE_REDUNDANT_E2E = (
    "test_verdicts_e2e.py::test_pool_held_across_llm_sqlite", "test_verdicts_e2e.py::test_threadpool_queueing",
    "test_verdicts_e2e.py::test_provider_floor", "test_verdicts_e2e.py::test_healthy", "test_verdicts_e2e.py::test_blocking_call",
    "test_verdicts_e2e.py::test_growing_context",
    "test_tools_e2e.py::test_langchain_tools_gathered_or_dependent_do_not_fire",
    "test_tools_e2e.py::test_gathered_dependent_and_agent_loop_calls_do_not",
)  # fmt: skip

#: Hook test modules none of whose services import openai, SQLAlchemy, psycopg_pool, asyncpg or redis.
LINE_INDEPENDENT_HOOK_TESTS = ("aiohttp_client_hook", "aiohttp_web_hook", "asgi_hook", "locks_hook", "loop_hook", "sampling_e2e",
                               "tool_dependencies")  # fmt: skip


@nox.session
def hooks_legacy(session: nox.Session) -> None:
    session.install("-e", ".[test]", "-c", "tests/constraints.txt", "openai>=2,<3", "sqlalchemy>=2.0,<2.1", "psycopg-pool>=3.2,<3.3", "asyncpg>=0.29,<0.30", "redis>=5,<6",
                    "anthropic>=1.0,<1.1")  # its first line: no span of its own (the anthropic hook writes one), no lazy stream iterator
    session.run(
        "python",
        "-c",
        "import anthropic, openai, sqlalchemy, psycopg_pool, asyncpg, redis; print('anthropic', anthropic.__version__, '- openai', openai.__version__, '- sqlalchemy',"
        " sqlalchemy.__version__, '- psycopg_pool', psycopg_pool.__version__, '- asyncpg', asyncpg.__version__,"
        " '- redis', redis.__version__)",
    )
    session.run(
        "python", "-m", "pytest", "tests/collectors/hooks", "tests/collectors/attach/test_signatures.py",  # stack signatures per library line
        "tests/attach/test_attach_async_e2e.py",  # asyncio attach: openai 2.x, SQLAlchemy 2.0 and asyncpg 0.29 in the service
        # stock OpenTelemetry traces of services that call the provider with the openai client: openai 2.x runs on httpx, so
        # its LLM calls are httpx client spans (with 3.x nothing stock sees them). The other trace tests (readers, the
        # receiver, services calling the provider with plain httpx) do not depend on these lines: the README command runs them.
        "tests/collectors/traces/test_otlp_e2e.py", "tests/collectors/traces/test_demo_traced_e2e.py",
        # the OpenAI Agents SDK runs on openai 3.x only: its test is the README command's
        "--deselect", "tests/collectors/hooks/test_agent_tools_hook.py::test_agents_sdk_function_tools_run_in_parallel_with_their_call_ids",
        # hook tests whose services use none of these libraries (Starlette, aiohttp, Flask's lock route; the loop, the
        # sampler, the tool-dependency reading): the README command's run is theirs
        *(f"--ignore=tests/collectors/hooks/test_{name}.py" for name in LINE_INDEPENDENT_HOOK_TESTS),
        "--ignore=tests/collectors/hooks/test_litellm_hook.py",  # LiteLLM is not installed here: `nox -s litellm` tests it
        *(f"--deselect=tests/collectors/hooks/{test}" for test in LINE_REDUNDANT_E2E),
        *session.posargs, env={"LATPROF_FORBID_SKIPS": "1"},
    )  # fmt: skip


@nox.session(python=INJECT_PYTHONS)
def inject_pythons(session: nox.Session) -> None:
    """The injection's tests with the service, latprof and the injection all on one CPython line (skips fail);
    the demo faults and the soak (which need the demo's libraries) run in the README's environment."""
    session.install("-e", ".", "pytest", "jsonschema", "uvicorn", "gunicorn", "flask", "-c", "tests/constraints.txt")
    tests = session.posargs or ["tests/inject/test_inject.py", "tests/inject/test_inject_container.py"]
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, env={"LATPROF_FORBID_SKIPS": "1"})


@nox.session
def litellm(session: nox.Session) -> None:
    """The litellm hook's tests and LiteLLM's own OpenTelemetry spans, with LiteLLM (the `test-litellm` extra) in an
    environment of its own: it brings about 330 MB and 20 packages (boto3, tokenizers, huggingface_hub, ...) that no
    other test needs. Skips fail; LiteLLM reads its bundled model cost map instead of fetching it from the internet."""
    session.install("-e", ".[test-litellm]", "pytest", "jsonschema", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http",
                    "-c", "tests/constraints.txt")  # fmt: skip
    tests = session.posargs or [
        "tests/collectors/hooks/test_litellm_hook.py", "tests/collectors/traces/genai/test_litellm_otel.py",
        "tests/collectors/hooks/test_scaffold.py::test_the_test_environment_is_held_to_the_lines_the_hooks_are_tested_on",
        "tests/collectors/hooks/test_scaffold.py::test_installing_twice_changes_nothing_and_uninstall_restores_the_very_same_objects[litellm]",
    ]  # fmt: skip
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests,
                env={"LATPROF_FORBID_SKIPS": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_PROXY": "127.0.0.1,localhost",
                     "no_proxy": "127.0.0.1,localhost"})  # fmt: skip


@nox.session
def clickhouse(session: nox.Session) -> None:
    """The ClickHouse reader against ClickHouse's own engine in-process (chdb, the `test-clickhouse` extra: 180 MB and
    pandas and pyarrow, which no other test needs): the exporter's tables loaded with real recordings, read by latprof's
    queries directly and through clickhouse-connect over HTTP. Skips fail."""
    session.install("-e", ".[test-clickhouse]", "-c", "tests/constraints.txt")
    tests = session.posargs or ["tests/collectors/traces/test_clickhouse.py"]
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow", *tests,
                env={"LATPROF_FORBID_SKIPS": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})  # fmt: skip


#: What every GenAI instrumentation session installs: latprof, the test runner, the official openai
#: client (its line from the constraints), the stock SDK and its OTLP/HTTP exporter.
GENAI_BASE = ["-e", ".", "pytest", "jsonschema", "openai", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"]


#: What the demo traced by an instrumentation needs besides (`latprof demo --traces KIND`, tests/collectors/traces/genai/test_demo_genai.py).
GENAI_DEMO = ["opentelemetry-instrumentation-fastapi", "opentelemetry-instrumentation-sqlalchemy", "opentelemetry-instrumentation-httpx"]


def _genai_tests(session: nox.Session, module: str, *packages: str, demo: str = "") -> None:
    """Install `packages` (the instrumentation, pinned to the lines docs/genai.md lists) beside GENAI_BASE and run
    `module` of tests/collectors/traces/genai only (skips fail: an instrumentation that did not import was not tested);
    with `demo` (its `latprof demo --traces` kind), the demo's LLM faults traced by it too."""
    base = ["-e", ".[demo]", *GENAI_BASE[2:], *GENAI_DEMO] if demo else GENAI_BASE
    session.install(*base, *packages, "-c", "tests/constraints.txt")
    tests = [f"tests/collectors/traces/genai/{module}", *(["tests/collectors/traces/genai/test_demo_genai.py"] if demo else [])]
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, *session.posargs,
                env={"LATPROF_FORBID_SKIPS": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                     "LATPROF_TEST_GENAI_KIND": demo})  # fmt: skip


@nox.session(tags=["genai"])
def genai_otel_v2(session: nox.Session) -> None:
    """OpenTelemetry's openai-v2 (2.4b0 imports `opentelemetry.util.genai.instruments`, gone in util-genai 1.2b0; it imports httpx, which openai 3 does not bring)."""
    _genai_tests(session, "test_otel_openai_v2.py", "opentelemetry-instrumentation-openai-v2==2.4b0", "opentelemetry-util-genai==1.1b0", "httpx")


@nox.session(tags=["genai"])
def genai_openllmetry(session: nox.Session) -> None:
    """OpenLLMetry's (traceloop) openai instrumentation."""
    _genai_tests(session, "test_openllmetry.py", "opentelemetry-instrumentation-openai==0.62.4", demo="openllmetry")


@nox.session(tags=["genai"])
def genai_openinference(session: nox.Session) -> None:
    """OpenInference's (Arize Phoenix) openai instrumentation."""
    _genai_tests(session, "test_openinference.py", "openinference-instrumentation-openai==0.1.66", demo="openinference")


@nox.session(tags=["genai"])
def genai_logfire(session: nox.Session) -> None:
    """Logfire's `instrument_openai`, exporting to a local OTLP endpoint."""
    _genai_tests(session, "test_logfire.py", "logfire==5.4.0")
