"""The configuration: finding the file, reading either spelling, and an error that names the file and key for every mistake."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from latprof.ci.config import Config, CustomCheck, Limit, RouteBudget, RuleSettings, find_config, load_config
from latprof.errors import ConfigError

# Every part of the shape, in latprof.toml spelling; `as_pyproject` gives the pyproject.toml one.
FULL = """\
skip_warmup_s = 1.5
min_tail_excess_ms = 15.0

[budget]
p99_ms = 2000
p50_ms = "+10%"
ttft_p99_ms = 1200
pool_wait_p99_ms = 50.5

[budget.layers."db.pool"]
share = 0.1
tail_ms = 100

[budget.layers.provider]
p99_ms = 900

[[budget.routes]]
route = "POST /chat"
p99_ms = 1500
max_ms = "-5%"

[rules.db-pool-exhaustion]
severity = "warning"
min_share_of_tail_excess = 0.3

[rules.provider-floor]
min_calls = 5
min_floor_ms = 300

[rules.uninstrumented-gap]
enabled = false

[[checks]]
id = "search-p99"
description = "search tool calls stay fast"
select = "segments"
where = {layer = "tool", name = "GET *search*", route = "POST /chat", attributes = {"server.address" = "127.0.0.1"}}
stat = "p99.9"
op = "<"
threshold = 300
message = "search p99 {value:.0f} ms (budget {threshold:.0f} ms, {count} calls)"
severity = "warning"

[[checks]]
id = "few-pool-waits"
stat = "share"
where = {layer = "db.pool"}
threshold = 0.25
"""


def as_pyproject(latprof_toml: str) -> str:
    """The same keys under [tool.latprof] (tables get the prefix, top-level keys go under [tool.latprof])."""
    out = ["[project]", 'name = "svc"', "", "[tool.latprof]"]
    for line in latprof_toml.splitlines():
        if line.startswith("[[") and line.endswith("]]"):
            line = f"[[tool.latprof.{line[2:-2]}]]"
        elif line.startswith("[") and line.endswith("]"):
            line = f"[tool.latprof.{line[1:-1]}]"
        out.append(line)
    return "\n".join(out) + "\n"


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "\n" not in message  # the CLI prints it as one line
    return message


def _keys_without_prefix(config: Config) -> Config:
    """`config` as if read from latprof.toml: the keys of its limits and checks without `tool.latprof.`."""

    def bare(key: str) -> str:
        return key.removeprefix("tool.latprof.")

    def limits(table: dict[str, Limit]) -> dict[str, Limit]:
        return {name: dataclasses.replace(limit, key=bare(limit.key)) for name, limit in table.items()}

    return dataclasses.replace(
        config,
        path=None,
        budget=limits(config.budget),
        layer_budgets={layer: limits(table) for layer, table in config.layer_budgets.items()},
        route_budgets=[RouteBudget(r.route, limits(r.limits)) for r in config.route_budgets],
        checks=[dataclasses.replace(c, key=bare(c.key)) for c in config.checks],
    )


# --- reading both spellings -----------------------------------------------------------------------


def test_pyproject_and_latprof_toml_with_the_same_keys_give_equal_configs(tmp_path: Path) -> None:
    from_pyproject = load_config(write(tmp_path / "a", "pyproject.toml", as_pyproject(FULL)))
    from_latprof_toml = load_config(write(tmp_path / "b", "latprof.toml", FULL))
    assert from_pyproject.path == str(tmp_path / "a" / "pyproject.toml")
    assert from_latprof_toml.path == str(tmp_path / "b" / "latprof.toml")
    # Keys name where a value was configured, in that file's spelling; everything else is equal.
    assert from_pyproject.budget["p99_ms"].key == "tool.latprof.budget.p99_ms"
    assert from_latprof_toml.budget["p99_ms"].key == "budget.p99_ms"
    assert from_pyproject.checks[0].key == "tool.latprof.checks[0]" and from_latprof_toml.checks[0].key == "checks[0]"
    assert _keys_without_prefix(from_pyproject) == dataclasses.replace(from_latprof_toml, path=None)


def test_every_value_of_the_full_example_is_read_as_written(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "latprof.toml", FULL))
    assert config.skip_warmup_s == 1.5
    assert config.min_tail_excess_ms == 15.0
    assert config.budget == {
        "p99_ms": Limit("budget.p99_ms", value=2000.0),
        "p50_ms": Limit("budget.p50_ms", relative_pct=10.0),
        "ttft_p99_ms": Limit("budget.ttft_p99_ms", value=1200.0),
        "pool_wait_p99_ms": Limit("budget.pool_wait_p99_ms", value=50.5),
    }
    assert config.layer_budgets == {
        "db.pool": {"share": Limit('budget.layers."db.pool".share', 0.1), "tail_ms": Limit('budget.layers."db.pool".tail_ms', 100.0)},
        "provider": {"p99_ms": Limit("budget.layers.provider.p99_ms", 900.0)},
    }
    assert config.route_budgets == [
        RouteBudget("POST /chat", {"p99_ms": Limit("budget.routes[0].p99_ms", 1500.0),
                                   "max_ms": Limit("budget.routes[0].max_ms", relative_pct=-5.0)}),
    ]  # fmt: skip
    assert config.needs_baseline
    assert config.rules == {
        "db-pool-exhaustion": RuleSettings(True, "warning", {"min_share_of_tail_excess": 0.3}),
        "provider-floor": RuleSettings(True, "error", {"min_calls": 5, "min_floor_ms": 300.0}),
        "uninstrumented-gap": RuleSettings(False, "error", {}),
    }
    assert config.rule("slow-query") == RuleSettings()  # not configured: on, gating, defaults
    assert config.checks == [
        CustomCheck(
            key="checks[0]", id="search-p99", select="segments", stat="p99.9", op="<", threshold=300.0,
            message="search p99 {value:.0f} ms (budget {threshold:.0f} ms, {count} calls)", level="warning",
            description="search tool calls stay fast", route="POST /chat", layer="tool", name="GET *search*",
            attributes={"server.address": "127.0.0.1"},
        ),
        CustomCheck(key="checks[1]", id="few-pool-waits", select="requests", stat="share", op="<=", threshold=0.25, layer="db.pool"),
    ]  # fmt: skip


def test_a_config_without_relative_budgets_needs_no_baseline(tmp_path: Path) -> None:
    assert not load_config(write(tmp_path, "latprof.toml", "[budget]\np99_ms = 100\n")).needs_baseline
    assert load_config(write(tmp_path, "latprof.toml", '[[budget.routes]]\nroute = "GET /"\np50_ms = "5%"\n')).needs_baseline


# --- finding the file -----------------------------------------------------------------------------

WITH_TABLE = "[tool.latprof]\nskip_warmup_s = 1\n"
WITHOUT_TABLE = '[project]\nname = "svc"\n[tool.ruff]\nline-length = 100\n'


def test_latprof_toml_comes_before_dot_latprof_toml_before_pyproject_toml(tmp_path: Path) -> None:
    write(tmp_path, "pyproject.toml", WITH_TABLE)
    assert find_config(tmp_path) == tmp_path / "pyproject.toml"
    write(tmp_path, ".latprof.toml", "")
    assert find_config(tmp_path) == tmp_path / ".latprof.toml"
    write(tmp_path, "latprof.toml", "")
    assert find_config(tmp_path) == tmp_path / "latprof.toml"


def test_a_pyproject_without_a_latprof_table_is_skipped_and_the_search_goes_up(tmp_path: Path) -> None:
    project = tmp_path / "repo" / "service"
    write(project, "pyproject.toml", WITHOUT_TABLE)
    write(tmp_path / "repo", "pyproject.toml", WITH_TABLE)
    assert find_config(project) == tmp_path / "repo" / "pyproject.toml"
    assert find_config(project / "src" / "pkg") == tmp_path / "repo" / "pyproject.toml"  # need not exist


def test_the_nearest_directory_wins_over_a_better_name_further_up(tmp_path: Path) -> None:
    project = tmp_path / "repo" / "service"
    write(tmp_path / "repo", "latprof.toml", "")
    write(project, "pyproject.toml", WITH_TABLE)
    assert find_config(project) == project / "pyproject.toml"
    assert find_config(tmp_path / "repo") == tmp_path / "repo" / "latprof.toml"


def test_nothing_found_is_none_and_loads_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "pyproject.toml", WITHOUT_TABLE)
    assert find_config(tmp_path) is None
    monkeypatch.chdir(tmp_path)
    assert load_config() == Config()


def test_the_search_starts_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "latprof.toml", "[budget]\np99_ms = 750\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert find_config() == tmp_path / "latprof.toml"
    config = load_config()
    assert config.path == str(tmp_path / "latprof.toml") and config.budget["p99_ms"].value == 750
    assert load_config(search=False) == Config()


def test_a_broken_pyproject_is_found_so_that_loading_it_says_what_is_wrong(tmp_path: Path) -> None:
    path = write(tmp_path, "pyproject.toml", "[tool.latprof\n")
    assert find_config(tmp_path) == path
    assert error_of(path).startswith(f"{path}: not valid TOML: ")


# --- every mistake names the file and the key -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        pytest.param("pyproject.toml", "[tool.latprof]\nskip_warmup = 2\n",
                     "tool.latprof.skip_warmup: unknown key (did you mean 'skip_warmup_s'?)", id="unknown-top-level-key-pyproject"),
        pytest.param("latprof.toml", "[budgte]\np99_ms = 1\n",
                     "budgte: unknown key (did you mean 'budget'?)", id="unknown-top-level-key"),
        pytest.param("latprof.toml", "[tables]\n",
                     "tables: unknown key; known keys: skip_warmup_s, min_tail_excess_ms, budget, rules, checks", id="unknown-key-no-close-match"),
        pytest.param("pyproject.toml", "[tool.latprof.budget]\np99_ms = true\n",
                     "tool.latprof.budget.p99_ms: must be a number, not True", id="p99-a-boolean"),
        pytest.param("latprof.toml", "[budget]\np99_ms = [2000]\n",
                     "budget.p99_ms: must be a number, not an array", id="p99-an-array"),
        pytest.param("pyproject.toml", '[tool.latprof.budget]\np99_ms = "fast"\n',
                     "tool.latprof.budget.p99_ms: must be a number or a change against the baseline like '+10%', not 'fast'",
                     id="p99-a-word"),
        pytest.param("latprof.toml", '[budget]\np50_ms = "+10 percent"\n',
                     "budget.p50_ms: must be a number or a change against the baseline like '+10%', not '+10 percent'",
                     id="bad-relative"),
        pytest.param("latprof.toml", "[budget]\np99_ms = -1\n", "budget.p99_ms: must be at least 0, not -1", id="negative-budget"),
        pytest.param("latprof.toml", "[budget]\np95_ms = 1\n",
                     "budget.p95_ms: unknown key (did you mean 'p99_ms'?)", id="unknown-budget"),
        pytest.param("pyproject.toml", '[tool.latprof.budget.layers."db.pool"]\nshare = 1.5\n',
                     'tool.latprof.budget.layers."db.pool".share: must be at most 1, not 1.5', id="share-over-1"),
        pytest.param("latprof.toml", '[budget.layers."db.pol"]\nshare = 0.5\n',
                     "budget.layers.\"db.pol\": not a layer (did you mean 'db.pool'?)", id="unknown-layer"),
        pytest.param("latprof.toml", "[budget.layers.provider]\np95_ms = 5\n",
                     "budget.layers.provider.p95_ms: unknown key (did you mean 'p99_ms'?)", id="unknown-layer-metric"),
        pytest.param("latprof.toml", "[[budget.routes]]\np99_ms = 5\n",
                     'budget.routes[0].route: is required: the route as recorded, like "POST /chat"', id="route-without-route"),
        pytest.param("latprof.toml", '[[budget.routes]]\nroute = "GET /"\n[[budget.routes]]\nroute = "POST /chat"\n',
                     "budget.routes[0]: sets no budget; one of p50_ms, p90_ms, p99_ms, max_ms", id="route-without-budget"),
        pytest.param("latprof.toml", '[budget]\nroutes = {route = "GET /"}\n',
                     "budget.routes: must be an array of tables ([[tool.latprof.budget.routes]])", id="routes-not-an-array"),
        pytest.param("pyproject.toml", "[tool.latprof.rules.db-pool-exhaustoin]\nenabled = false\n",
                     "tool.latprof.rules.db-pool-exhaustoin: no such rule (did you mean 'db-pool-exhaustion'?)", id="unknown-rule"),
        pytest.param("latprof.toml", "[rules.no-such-thing-at-all]\n",
                     "rules.no-such-thing-at-all: no such rule; `latprof rules` lists them", id="unknown-rule-no-close-match"),
        pytest.param("latprof.toml", "[rules.db-pool-exhaustion]\nmin_share_of_tail_exces = 0.1\n",
                     "rules.db-pool-exhaustion.min_share_of_tail_exces: unknown key (did you mean 'min_share_of_tail_excess'?)",
                     id="unknown-threshold"),
        pytest.param("pyproject.toml", "[tool.latprof.rules.provider-floor]\nmin_calls = 2.5\n",
                     "tool.latprof.rules.provider-floor.min_calls: must be an integer, not 2.5", id="int-threshold-a-float"),
        pytest.param("latprof.toml", '[rules.provider-floor]\nmin_floor_ms = "200ms"\n',
                     "rules.provider-floor.min_floor_ms: must be a number, not '200ms'", id="float-threshold-a-string"),
        pytest.param("latprof.toml", "[rules.db-pool-exhaustion]\nenabled = 0\n",
                     "rules.db-pool-exhaustion.enabled: must be true or false, not 0", id="enabled-not-a-bool"),
        pytest.param("latprof.toml", '[rules.db-pool-exhaustion]\nseverity = "critical"\n',
                     "rules.db-pool-exhaustion.severity: must be one of error, warning, not 'critical'", id="bad-severity"),
        pytest.param("latprof.toml", "[rules]\ndb-pool-exhaustion = false\n",
                     "rules.db-pool-exhaustion: must be a table, not False", id="rule-not-a-table"),
        pytest.param("pyproject.toml", '[[tool.latprof.checks]]\nstat = "p99"\nthreshold = 1\n',
                     "tool.latprof.checks[0].id: is required: a lower-case id like 'search-tool-p99', not None", id="check-without-id"),
        pytest.param("latprof.toml", '[[checks]]\nid = "Search P99"\nstat = "p99"\nthreshold = 1\n',
                     "checks[0].id: is required: a lower-case id like 'search-tool-p99', not 'Search P99'", id="check-bad-id"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "p99"\n',
                     "checks[0].threshold: is required", id="check-without-threshold"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "p99"\nthreshold = 1\n[[checks]]\nid = "a"\nstat = "max"\nthreshold = 2\n',
                     "checks[1].id: 'a' is used by another check", id="duplicate-check-id"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "p100"\nthreshold = 1\n',
                     "checks[0].stat: must be pNN (p50, p99, p99.9), mean, max, count or share, not 'p100'", id="stat-p100"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "median"\nthreshold = 1\n',
                     "checks[0].stat: must be pNN (p50, p99, p99.9), mean, max, count or share, not 'median'", id="stat-median"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "p0"\nthreshold = 1\n',
                     "checks[0].stat: must be pNN (p50, p99, p99.9), mean, max, count or share, not 'p0'", id="stat-p0"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nthreshold = 1\n',
                     "checks[0].stat: must be pNN (p50, p99, p99.9), mean, max, count or share, not None", id="check-without-stat"),
        pytest.param("pyproject.toml", '[[tool.latprof.checks]]\nid = "a"\nstat = "p99"\nop = "=<"\nthreshold = 1\n',
                     "tool.latprof.checks[0].op: must be one of < <= > >= == !=, not '=<'", id="bad-op"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nselect = "spans"\nstat = "p99"\nthreshold = 1\n',
                     "checks[0].select: must be one of requests, segments, not 'spans'", id="bad-select"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "share"\nthreshold = 10\n',
                     "checks[0].threshold: a share is between 0 and 1, not 10", id="share-threshold-over-1"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "p99"\nthreshold = "300ms"\n',
                     "checks[0].threshold: must be a number, not '300ms'", id="threshold-a-string"),
        pytest.param("pyproject.toml", '[[tool.latprof.checks]]\nid = "a"\nstat = "p99"\nthreshold = 1\nmessage = "p99 {p99} ms"\n',
                     "tool.latprof.checks[0].message: cannot be formatted ('p99'); fields: value, threshold, count, id",
                     id="message-unknown-field"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "p99"\nthreshold = 1\nmessage = "{value:d} ms"\n',
                     "checks[0].message: cannot be formatted (Unknown format code 'd' for object of type 'float');"
                     " fields: value, threshold, count, id", id="message-bad-format-spec"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "p99"\nthreshold = 1\nwhere = {name = "GET *"}\n',
                     'checks[0].where.name: selects segments by name: set select = "segments"', id="name-with-select-requests"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nselect = "segments"\nstat = "p99"\nthreshold = 1\nwhere = {layer = "tools"}\n',
                     "checks[0].where.layer: not a layer (did you mean 'tool'?)", id="where-unknown-layer"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "p99"\nthreshold = 1\nwhere = {path = "/chat"}\n',
                     "checks[0].where.path: unknown key; known keys: route, layer, name, attributes", id="where-unknown-key"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "p99"\nthreshold = 1\nlimit = 3\n',
                     "checks[0].limit: unknown key; known keys: id, description, select, where, stat, op, threshold, message, severity",
                     id="check-unknown-key"),
        pytest.param("latprof.toml", '[[checks]]\nid = "a"\nstat = "p99"\nthreshold = 1\nseverity = "info"\n',
                     "checks[0].severity: must be one of error, warning, not 'info'", id="check-bad-severity"),
        pytest.param("latprof.toml", '[checks]\nid = "a"\n',
                     "checks: must be an array of tables ([[tool.latprof.checks]])", id="checks-not-an-array"),
        pytest.param("latprof.toml", "skip_warmup_s = -2\n", "skip_warmup_s: must be at least 0, not -2", id="negative-warmup"),
        pytest.param("latprof.toml", "min_tail_excess_ms = -1\n", "min_tail_excess_ms: must be at least 0, not -1", id="negative-tail-floor"),
        pytest.param("latprof.toml", 'min_tail_excess_ms = "20ms"\n', "min_tail_excess_ms: must be a number, not '20ms'", id="tail-floor-a-string"),
    ],
)  # fmt: skip
def test_a_mistake_is_an_error_naming_the_file_and_the_key(tmp_path: Path, name: str, text: str, expected: str) -> None:
    path = write(tmp_path, name, text)
    assert error_of(path) == f"{path}:{expected}"


def test_a_file_that_is_not_toml_says_so_with_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "latprof.toml", '[budget]\np99_ms = 2000\np50_ms 500\n')
    message = error_of(path)
    assert message.startswith(f"{path}: not valid TOML: ")
    assert "line 3" in message


def test_a_missing_file_and_a_directory_are_errors_naming_the_path(tmp_path: Path) -> None:
    assert error_of(tmp_path / "nope.toml") == f"{tmp_path / 'nope.toml'}: no such config file"
    (tmp_path / "latprof.toml").mkdir()
    assert error_of(tmp_path / "latprof.toml") == f"{tmp_path / 'latprof.toml'}: is a directory, not a config file"


def test_a_pyproject_named_explicitly_must_have_the_latprof_table(tmp_path: Path) -> None:
    path = write(tmp_path, "pyproject.toml", WITHOUT_TABLE)
    assert error_of(path) == f"{path}: has no [tool.latprof] table"


def test_the_rules_a_config_may_name_are_the_ones_passed(tmp_path: Path) -> None:
    from latprof.engine import discover_rules

    path = write(tmp_path, "latprof.toml", "[rules.slow-query]\nenabled = false\n")
    only_pool = [cls for cls in discover_rules() if cls.id == "db-pool-exhaustion"]
    with pytest.raises(ConfigError, match=r"rules\.slow-query: no such rule"):
        load_config(path, rule_classes=only_pool)
    assert load_config(path).rule("slow-query").enabled is False


@pytest.mark.parametrize("message", ["p99 {value.ms} ms", "p99 {value[0]} ms"])
def test_a_message_with_an_attribute_or_index_of_a_number_is_a_config_error(tmp_path: Path, message: str) -> None:
    path = write(tmp_path, "latprof.toml", f'[[checks]]\nid = "a"\nstat = "p99"\nthreshold = 1\nmessage = "{message}"\n')
    assert error_of(path).startswith(f"{path}:checks[0].message: cannot be formatted")


def test_two_budgets_for_the_same_route_and_metric_are_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "latprof.toml", '[[budget.routes]]\nroute = "GET /chat"\np99_ms = 100\n'
                                           '[[budget.routes]]\nroute = "GET /chat"\np99_ms = 60000\n')  # fmt: skip
    assert error_of(path).startswith(f"{path}:budget.routes[1]")
