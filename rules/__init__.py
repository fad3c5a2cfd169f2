"""The built-in rules, one module per rule (its contract: latprof.engine.Rule).

A new rule is a module here, its line in `MODULES` and its test in tests/rules/; a test fails
when a module of this folder is missing from `MODULES`.
"""

from types import ModuleType

from . import (
    capacity_exceeded,
    connection_setup,
    context_growth,
    cpu_bound,
    db_pool_exhaustion,
    engine_queueing,
    event_loop_blocked,
    http_pool_exhaustion,
    lock_contention,
    long_decode,
    provider_floor,
    request_queueing,
    retry_backoff,
    sequential_tool_calls,
    slow_query,
    uninstrumented_gap,
)

#: Every built-in rule module, by file name; `latprof.engine.discover_rules` takes their Rule classes.
MODULES: tuple[ModuleType, ...] = (
    capacity_exceeded,
    connection_setup,
    context_growth,
    cpu_bound,
    db_pool_exhaustion,
    engine_queueing,
    event_loop_blocked,
    http_pool_exhaustion,
    lock_contention,
    long_decode,
    provider_floor,
    request_queueing,
    retry_backoff,
    sequential_tool_calls,
    slow_query,
    uninstrumented_gap,
)
