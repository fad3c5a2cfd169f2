"""`latprof demo`'s parts that need no service: DSNs, scenario names, load mixes, long answers.

The scenarios themselves run end to end in tests/collectors/hooks/test_verdicts_e2e.py.
"""

from __future__ import annotations

import openai
import pytest

from latprof.demo.load import pick_path
from latprof.demo.provider import Provider, ProviderConfig, _ProviderServer
from latprof.demo.run import normalize_dsn, run_demo
from latprof.demo.scenarios import SCENARIOS, get_scenario
from latprof.errors import ConfigError


def test_normalize_dsn() -> None:
    assert normalize_dsn("postgresql://u@h:5432/d") == "postgresql+psycopg://u@h:5432/d"
    assert normalize_dsn("postgres://u@h/d") == "postgresql+psycopg://u@h/d"
    assert normalize_dsn("postgresql+psycopg2://u@h/d") == "postgresql+psycopg://u@h/d"
    assert normalize_dsn("sqlite:////tmp/x.db") == "sqlite+aiosqlite:////tmp/x.db"
    with pytest.raises(ConfigError):
        normalize_dsn("mysql://u@h/d")
    with pytest.raises(ConfigError):
        normalize_dsn("not a url")


def test_unknown_scenario_suggests() -> None:
    with pytest.raises(ConfigError, match="did you mean pool-held-across-llm"):
        get_scenario("pool-held-across-lm")
    assert "pool-held-across-llm" in SCENARIOS


def test_every_scenario_has_a_valid_provider_and_load_mix() -> None:
    for scenario in SCENARIOS.values():
        ProviderConfig(**scenario.provider)
        assert sum(share for _, share in scenario.mix) < 1, scenario.name


@pytest.mark.parametrize("option", [{"http": "zttp"}, {"loop": "trio"}])
def test_run_demo_refuses_an_unknown_server_option(option: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="choose one of"):
        run_demo("healthy", progress=None, **option)


def test_pick_path_sends_each_share_of_draws_to_its_path() -> None:
    mix = [("/export", 0.03), ("/admin", 0.02)]
    assert pick_path("/chat", mix, 0.0) == "/export"
    assert pick_path("/chat", mix, 0.0299) == "/export"
    assert pick_path("/chat", mix, 0.03) == "/admin"
    assert pick_path("/chat", mix, 0.05) == "/chat"
    assert pick_path("/chat", (), 0.0) == "/chat"


def _answer_lengths(provider: Provider, calls: int, **request: object) -> list[int]:
    client = openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=0)
    try:
        lengths = []
        for _ in range(calls):
            completion = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], **request
            )
            assert completion.usage is not None
            lengths.append(completion.usage.completion_tokens)
        return lengths
    finally:
        client.close()


def test_long_outputs_are_a_share_of_answers_deterministic_for_a_seed_and_capped() -> None:
    settings = {"ttft_ms": 0.0, "tpot_ms": 0.0, "output_tokens": 4, "long_output_tokens": 60}
    runs = []
    for _ in range(2):
        with Provider(long_output_probability=0.25, seed=3, **settings) as provider:
            runs.append(_answer_lengths(provider, 40))
    assert runs[0] == runs[1]  # the same calls are long for the same seed
    assert set(runs[0]) == {4, 60}
    assert 3 <= runs[0].count(60) <= 20
    with Provider(long_output_probability=1.0, **settings) as provider:
        assert _answer_lengths(provider, 2, max_tokens=10) == [10, 10]
    with Provider(long_output_probability=0.0, **settings) as provider:
        assert _answer_lengths(provider, 5) == [4] * 5


def test_long_outputs_leave_the_spikes_where_they_were() -> None:
    def spiked(**extra: object) -> list[bool]:
        config = ProviderConfig(ttft_ms=0.0, tpot_ms=0.0, output_tokens=1, spike_probability=0.3, spike_ms=1.0, seed=5, **extra)
        server = _ProviderServer(config)
        return [server._plan("chat", {"messages": []}, config).ttft_s > 0 for _ in range(30)]

    assert spiked() == spiked(long_output_probability=0.5, long_output_tokens=3)
    assert 3 <= sum(spiked()) <= 20


@pytest.mark.parametrize(
    "bad", [{"long_output_probability": 1.5}, {"long_output_probability": -0.1}, {"long_output_tokens": -1}]
)
def test_provider_config_refuses_bad_long_output_settings(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ProviderConfig(**bad)
