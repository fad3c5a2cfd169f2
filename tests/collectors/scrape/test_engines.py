"""The engine tables: each fixture `/metrics` page is recognised and every measure it holds is found."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from latprof.collectors.scrape.engines import ENGINES, MEASURES, Engine, EngineMetric, detect

FIXTURES = Path(__file__).parent / "fixtures"

# Per fixture: the engine, then each measure the page holds -> (family, kind, scale), read off the
# fixture text by hand (see fixtures/README.md for where each page comes from), not from the table.
S = 1000.0  # seconds -> ms
EXPECTED: dict[str, tuple[str, dict[str, tuple[str, str, float]]]] = {
    "vllm-v1.prom": ("vllm", {
        "waiting": ("vllm:num_requests_waiting", "gauge", 1.0),
        "running": ("vllm:num_requests_running", "gauge", 1.0),
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "gauge", 1.0),  # the deprecated gpu_ one is there too
        "preemptions": ("vllm:num_preemptions", "counter", 1.0),
        "finished": ("vllm:request_success", "counter", 1.0),
        "queue": ("vllm:request_queue_time_seconds", "histogram", S),
        "prefill": ("vllm:request_prefill_time_seconds", "histogram", S),
        "decode": ("vllm:request_decode_time_seconds", "histogram", S),
        "inference": ("vllm:request_inference_time_seconds", "histogram", S),
        "ttft": ("vllm:time_to_first_token_seconds", "histogram", S),
        "e2e": ("vllm:e2e_request_latency_seconds", "histogram", S),
    }),
    "vllm-v0.prom": ("vllm", {
        "waiting": ("vllm:num_requests_waiting", "gauge", 1.0),
        "running": ("vllm:num_requests_running", "gauge", 1.0),
        "kv_cache_usage": ("vllm:gpu_cache_usage_perc", "gauge", 1.0),
        "preemptions": ("vllm:num_preemptions", "counter", 1.0),
        "finished": ("vllm:request_success", "counter", 1.0),
    }),
    "sglang.prom": ("sglang", {
        "waiting": ("sglang:num_queue_reqs", "gauge", 1.0),
        "running": ("sglang:num_running_reqs", "gauge", 1.0),
        "kv_cache_usage": ("sglang:token_usage", "gauge", 1.0),
        "ttft": ("sglang:time_to_first_token_seconds", "histogram", S),
        "e2e": ("sglang:e2e_request_latency_seconds", "histogram", S),
    }),
    "sglang-collector.prom": ("sglang", {
        "waiting": ("sglang:num_queue_reqs", "gauge", 1.0),
        "running": ("sglang:num_running_reqs", "gauge", 1.0),
        "kv_cache_usage": ("sglang:token_usage", "gauge", 1.0),
        "preemptions": ("sglang:num_retracted_requests", "counter", 1.0),
        "finished": ("sglang:num_requests", "counter", 1.0),
        "queue": ("sglang:queue_time_seconds", "histogram", S),
        "ttft": ("sglang:time_to_first_token_seconds", "histogram", S),
        "e2e": ("sglang:e2e_request_latency_seconds", "histogram", S),
    }),
    "tgi.prom": ("tgi", {
        "waiting": ("tgi_queue_size", "gauge", 1.0),
        "running": ("tgi_batch_current_size", "gauge", 1.0),
        "finished": ("tgi_request_success", "counter", 1.0),
        "queue": ("tgi_request_queue_duration", "histogram", S),
        "inference": ("tgi_request_inference_duration", "histogram", S),
        "e2e": ("tgi_request_duration", "histogram", S),
    }),
    "llamacpp.prom": ("llamacpp", {
        "waiting": ("llamacpp:requests_deferred", "gauge", 1.0),
        "running": ("llamacpp:requests_processing", "gauge", 1.0),
    }),
    "llamacpp-examples.prom": ("llamacpp", {
        "waiting": ("llamacpp:requests_deferred", "gauge", 1.0),
        "running": ("llamacpp:requests_processing", "gauge", 1.0),
        "kv_cache_usage": ("llamacpp:kv_cache_usage_ratio", "gauge", 1.0),
    }),
}

# Per fixture: what its engine can publish (some version of it) but this page does not have.
MISSING: dict[str, list[str]] = {
    "vllm-v1.prom": [],
    "vllm-v0.prom": ["queue", "prefill", "decode", "inference", "ttft", "e2e"],
    "sglang.prom": ["preemptions", "finished", "queue"],
    "sglang-collector.prom": [],
    "tgi.prom": [],
    "llamacpp.prom": ["kv_cache_usage"],
    "llamacpp-examples.prom": [],
}

PLAIN_EXPORTER = """\
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.47
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 8.4217856e+07
# HELP http_requests_total Requests served.
# TYPE http_requests_total counter
http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 201.0
"""


def families(text: str) -> dict[str, str]:
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def fixture_families(name: str) -> dict[str, str]:
    return families((FIXTURES / name).read_text())


def by_name(name: str) -> Engine:
    return next(engine for engine in ENGINES if engine.name == name)


def test_every_fixture_file_is_covered_and_small() -> None:
    pages = sorted(path.name for path in FIXTURES.glob("*.prom"))
    assert pages == sorted(EXPECTED) == sorted(MISSING)
    for page in pages:
        assert (FIXTURES / page).stat().st_size < 30_000, page


@pytest.mark.parametrize("page", sorted(EXPECTED))
def test_detect_picks_the_engine_of_each_page(page: str) -> None:
    engine = detect(fixture_families(page))
    assert engine is not None and engine.name == EXPECTED[page][0]


@pytest.mark.parametrize("page", sorted(EXPECTED))
def test_every_measure_on_the_page_is_found_with_its_kind_and_scale(page: str) -> None:
    types = fixture_families(page)
    engine_name, held = EXPECTED[page]
    engine = by_name(engine_name)
    for measure in MEASURES:
        metric = engine.metric_for(measure, types)
        if measure not in held:
            assert metric is None, (page, measure, metric)
            continue
        family, kind, scale = held[measure]
        assert metric == EngineMetric(family, kind, measure, scale), (page, measure)
        assert types[family] == kind, (page, family)  # the page's own type agrees with the table's kind


@pytest.mark.parametrize("page", sorted(MISSING))
def test_missing_names_what_the_page_lacks(page: str) -> None:
    engine = by_name(EXPECTED[page][0])
    assert engine.missing(fixture_families(page)) == MISSING[page]


def test_the_newest_name_wins_when_a_page_carries_both() -> None:
    types = fixture_families("vllm-v1.prom")
    assert {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"} <= set(types)
    metric = by_name("vllm").metric_for("kv_cache_usage", types)
    assert metric is not None and metric.family == "vllm:kv_cache_usage_perc"
    del types["vllm:kv_cache_usage_perc"]
    metric = by_name("vllm").metric_for("kv_cache_usage", types)
    assert metric is not None and metric.family == "vllm:gpu_cache_usage_perc"


def test_type_compatibility() -> None:
    vllm = by_name("vllm")
    # A family of another type is not the measure; an untyped (`unknown`) one matches any kind.
    assert vllm.metric_for("waiting", {"vllm:num_requests_waiting": "counter"}) is None
    metric = vllm.metric_for("waiting", {"vllm:num_requests_waiting": "unknown"})
    assert metric is not None and metric.family == "vllm:num_requests_waiting"
    untyped = families("vllm:num_requests_running 3\nvllm:e2e_request_latency_seconds_sum 4.5\n")
    assert untyped == {"vllm:num_requests_running": "unknown", "vllm:e2e_request_latency_seconds_sum": "unknown"}
    assert vllm.metric_for("running", untyped) is not None
    assert vllm.metric_for("e2e", untyped) is None  # the parser names it by its sample, `_sum` and all


def test_other_exporters_and_empty_pages_detect_no_engine() -> None:
    assert detect(families(PLAIN_EXPORTER)) is None
    assert detect([]) is None
    assert detect(["vllmx_requests", "tgiqueue", "sglang_requests", "llamacpp_requests"]) is None


def test_detect_goes_by_the_majority_of_families() -> None:
    mixed = families(PLAIN_EXPORTER) | fixture_families("tgi.prom") | {"vllm:num_requests_running": "gauge"}
    engine = detect(mixed)
    assert engine is not None and engine.name == "tgi"


def test_the_tables_hold_only_known_measures_kinds_and_positive_scales() -> None:
    assert [engine.name for engine in ENGINES] == ["vllm", "sglang", "tgi", "llamacpp"]
    for engine in ENGINES:
        for metric in engine.metrics:
            assert metric.measure in MEASURES and metric.kind in ("gauge", "counter", "histogram")
            assert metric.scale > 0
            assert engine.owns(metric.family), metric.family
            assert not metric.family.endswith("_total") or metric.kind != "counter", metric.family
            if metric.kind == "histogram":
                assert metric.scale == 1000.0, metric.family  # every engine histogram is in seconds
