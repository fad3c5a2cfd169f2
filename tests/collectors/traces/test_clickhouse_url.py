"""How a `clickhouse://` input is read from the command line: the URL, the times, the credentials, the rates of the pick.

What reaches a server is tested against ClickHouse's engine in `test_clickhouse.py` (`nox -s clickhouse`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from latprof.collectors.traces.clickhouse import is_clickhouse_url, parse_time, parse_url, rates, source_of
from latprof.errors import InputError

ROOT = Path(__file__).resolve().parents[3]
NOW = 1_796_620_000 * 10**9


def test_a_url_names_the_server_database_and_table_with_defaults() -> None:
    target, warnings = parse_url("clickhouse://ch.internal/otel", env={})
    assert (target.host, target.port, target.database, target.table, target.username, target.password) == (
        "ch.internal", 8123, "otel", "otel_traces", "default", "")
    assert warnings == [] and target.shown == "clickhouse://ch.internal/otel"
    secure, _ = parse_url("clickhouses://ch:9443/?table=spans_v2&since=2h&service=chat", env={})
    assert (secure.scheme, secure.port, secure.database, secure.table) == ("clickhouses", 9443, "default", "spans_v2")
    assert secure.given == {"since": "2h", "service": "chat"}
    assert parse_url("clickhouses://ch/otel", env={})[0].port == 8443
    assert is_clickhouse_url("clickhouse://x/y") and is_clickhouse_url("ClickHouses://x") and not is_clickhouse_url("traces.json")


def test_credentials_come_from_the_environment_and_a_password_in_the_url_is_warned_about_never_shown() -> None:
    target, warnings = parse_url("clickhouse://ch/otel", env={"LATPROF_CLICKHOUSE_USER": "reader", "LATPROF_CLICKHOUSE_PASSWORD": "pw1"})
    assert (target.username, target.password, warnings) == ("reader", "pw1", [])
    assert parse_url("clickhouse://ch/otel", env={"CLICKHOUSE_USER": "u", "CLICKHOUSE_PASSWORD": "pw2"})[0].password == "pw2"
    target, warnings = parse_url("clickhouse://me:hunter2@ch:8123/otel?table=t", env={"LATPROF_CLICKHOUSE_PASSWORD": "env"})
    assert (target.username, target.password) == ("me", "hunter2")
    assert "hunter2" not in target.shown + repr(target) + "".join(warnings)
    assert target.shown == "clickhouse://ch:8123/otel?table=t" and "holds a password" in warnings[0]


@pytest.mark.parametrize(("url", "message"), [
    ("clickhouse:///otel", "no host"),
    ("clickhouse://ch/ot-el", "database name 'ot-el' is not a plain identifier"),
    ("clickhouse://ch/otel?table=x;drop", "table name 'x;drop' is not a plain identifier"),
    ("clickhouse://ch/otel?table=`x`", "table name '`x`' is not a plain identifier"),
    ("clickhouse://ch/otel?tabel=x", "unknown parameter(s) tabel"),
])  # fmt: skip
def test_a_url_latprof_cannot_use_is_one_clear_error(url: str, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_url(url, env={})


def test_times_are_ages_epoch_seconds_or_iso_8601() -> None:
    assert parse_time("1h", NOW) == NOW - 3600 * 10**9
    assert parse_time("90s", NOW) == NOW - 90 * 10**9 and parse_time("2d", NOW) == NOW - 2 * 86400 * 10**9
    assert parse_time("1796620000", NOW) == NOW
    assert parse_time("2026-12-07T05:00:00Z", NOW) == parse_time("2026-12-07T06:00:00+01:00", NOW) == parse_time("2026-12-07 05:00:00", NOW)
    for bad in ("yesterday", "1 hour", "", "-1h"):
        with pytest.raises(ValueError):
            parse_time(bad, NOW)


def test_the_range_comes_from_the_url_else_the_options() -> None:
    source = source_of("clickhouse://ch/otel?since=2h&until=1h", since="10m", service="chat", now_ns=NOW, env={})
    assert (source.selection.since_ns, source.selection.until_ns) == (NOW - 7200 * 10**9, NOW - 3600 * 10**9)
    assert source.selection.service == "chat" and source.selection.route == ""
    assert source_of("clickhouse://ch/otel", since="10m", now_ns=NOW, env={}).selection.until_ns == NOW
    with pytest.raises(InputError, match="--since"):
        source_of("clickhouse://ch/otel", now_ns=NOW, env={})
    with pytest.raises(InputError, match="before --until"):
        source_of("clickhouse://ch/otel", since="1h", until="2h", now_ns=NOW, env={})


def test_a_small_range_comes_back_whole_and_a_large_one_one_in_k() -> None:
    assert set(rates(20_000, 10_000, 20_000).values()) == {1}
    large = rates(1_000_000, 10_000, 20_000)
    # the tail (50k) and the median cohort (200k) past the cap of 20k, each second's p99 (10k) whole, 750k others to ~10k
    assert large == {"k_tail": 3, "k_median": 10, "k_window": 1, "k_other": 75}
    assert set(rates(1_000_000, 10_000, 20_000, exact=True).values()) == {1}  # --exact: every request comes back


def _latprof(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_the_table_options_without_a_clickhouse_input_are_a_usage_error() -> None:
    done = _latprof("-m", "latprof", "analyze", "examples/healthy.jsonl.gz", "--since", "1h")
    assert done.returncode == 2 and "apply to clickhouse:// inputs only" in done.stderr


def test_without_clickhouse_connect_the_error_says_what_to_install() -> None:
    """Run as in an environment without the `clickhouse` extra (the import made to fail)."""
    code = "import sys; sys.modules['clickhouse_connect'] = None; from latprof.cli import main; main(['analyze', 'clickhouse://127.0.0.1:9/otel', '--since', '1h'])"
    done = _latprof("-c", code)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("latprof: error: clickhouse://127.0.0.1:9/otel: reading ClickHouse needs clickhouse-connect:"
                                   " pip install 'latprof[clickhouse]'")  # fmt: skip


def test_the_pick_is_sized_as_a_captures() -> None:
    from latprof.analysis import cohort_first
    from latprof.collectors.traces import clickhouse

    assert (clickhouse.DEFAULT_SAMPLE_REQUESTS, clickhouse.DEFAULT_COHORT_CAP, clickhouse.MAX_READ_SHARE) == (
        cohort_first.DEFAULT_SAMPLE_REQUESTS, cohort_first.DEFAULT_COHORT_CAP, cohort_first.MAX_READ_SHARE)


def test_rows_straddling_chunks_are_read_whole_and_an_answer_that_is_not_rows_is_one_error() -> None:
    from latprof.collectors.traces.clickhouse import rows

    assert list(rows([b'[1, "a"]\n[2, "b', b'"]\n[3,', b' "c"]'])) == [[1, "a"], [2, "b"], [3, "c"]]
    with pytest.raises(InputError, match="not JSONCompactEachRow rows"):
        list(rows([b"<html>502 Bad Gateway</html>\n"]))
