"""Statement summaries (`db.query.summary`, shared by the sqlalchemy, psycopg_pool and asyncpg hooks) keep no word of a literal or comment."""

from __future__ import annotations

import pytest

from latprof.collectors.hooks.sqlalchemy import summarize

SECRET = "CANARY_summary_secret"

#: Statements whose literals, comments or quoted strings hold SECRET where a table name could be read.
STATEMENTS = (
    f"SELECT '{SECRET}'",
    f"SELECT 'it''s' FROM orders WHERE note = '{SECRET}'",
    f"SELECT E'\\' FROM {SECRET}'",  # an escaped quote in an E'' string does not end it
    f"SELECT e'\\\\\\' INTO {SECRET}' FROM orders",
    f"INSERT INTO orders VALUES (E'\\' INTO {SECRET}')",
    f"SELECT $$ FROM {SECRET} $$",
    f"SELECT $tag$ FROM {SECRET} $tag$ FROM orders",
    f"/* FROM {SECRET} */ SELECT 1",
    f"SELECT 1 -- FROM {SECRET}",
    f"UPDATE orders SET note = E'\\'{SECRET}' WHERE id = $1",
    f"CALL refresh(E'\\'', '{SECRET}')",
    f"SELECT U&'\\0041' FROM orders WHERE note = '{SECRET}'",
)


@pytest.mark.parametrize("statement", STATEMENTS)
def test_no_literal_or_comment_reaches_the_summary(statement: str) -> None:
    summary, operation = summarize(statement)
    assert SECRET not in summary and SECRET not in operation, (statement, summary)


def test_the_table_is_still_read_after_an_escaped_string() -> None:
    assert summarize("SELECT E'it\\'s' AS x FROM orders")[0] == "SELECT orders"
    assert summarize("SELECT e'\\\\' FROM orders")[0] == "SELECT orders"
    assert summarize(f"SELECT '{SECRET}' FROM orders")[0] == "SELECT orders"
