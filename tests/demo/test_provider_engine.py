"""The demo provider's engine mode: a vLLM-like continuous-batching scheduler, its timing and its /metrics."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from latprof.demo.engine import Engine
from latprof.demo.provider import Provider, ProviderConfig, _parser

#: An engine with no way to it and no prefill cost unless a test says otherwise.
BASE: dict[str, Any] = {"ttft_ms": 0, "engine_step_ms": 10, "engine_step_ms_per_running": 0, "engine_prefill_ms_per_1k_tokens": 0}


def _metrics(provider: Provider) -> dict[str, float]:
    """`/metrics` as {sample name (+ finished_reason): value}, every sample labelled as vLLM v1 does."""
    response = httpx.get(provider.url[: -len("/v1")] + "/metrics", timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            assert sample.labels["engine"] == "0" and sample.labels["model_name"], sample
            if sample.name.endswith("_bucket") or sample.name.endswith("_created"):
                continue
            reason = sample.labels.get("finished_reason")
            out[sample.name + (f"{{{reason}}}" if reason else "")] = sample.value
    return out


async def _stream(client: openai.AsyncOpenAI, prompt: str = "hi", **kwargs: Any) -> tuple[float, list[float], str]:
    """One streamed chat: its TTFT (seconds, client side), the times of its tokens, its text."""
    start = time.perf_counter()
    stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}], stream=True, **kwargs)
    times, text = [], ""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter())
            text += chunk.choices[0].delta.content
    return times[0] - start, times, text


def _client(provider: Provider, **kwargs: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=provider.url, api_key="unused", max_retries=0, **kwargs)


def test_overload_queues_requests_and_their_ttft_is_queue_plus_prefill() -> None:
    with Provider(**{**BASE, "engine_prefill_ms_per_1k_tokens": 200}, engine_max_running=4, output_tokens=20) as provider:
        assert _metrics(provider)["vllm:request_queue_time_seconds_sum"] == 0

        async def main() -> tuple[list[tuple[float, list[float], str]], list[dict[str, float]]]:
            async with _client(provider) as client:
                await _stream(client)  # the client's lazy imports out of the way
                scrapes = [await asyncio.to_thread(_metrics, provider)]
                tasks = [asyncio.create_task(_stream(client, "word " * 400)) for _ in range(8)]  # 2x max_running, 500-token prompts
                while not all(task.done() for task in tasks):
                    scrapes.append(await asyncio.to_thread(_metrics, provider))
                    await asyncio.sleep(0.02)
                return await asyncio.gather(*tasks), scrapes

        results, scrapes = asyncio.run(main())
        after = _metrics(provider)
        before = scrapes[0]
    assert any(s["vllm:num_requests_running"] == 4 and s["vllm:num_requests_waiting"] == 4 for s in scrapes)
    assert all(s["vllm:num_requests_running"] <= 4 for s in scrapes)
    queue_sums = [s["vllm:request_queue_time_seconds_sum"] for s in [*scrapes, after]]
    assert queue_sums == sorted(queue_sums) and queue_sums[-1] > queue_sums[0]
    assert all(len(times) == 20 for _, times, _ in results)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0
    assert after["vllm:request_success_total{stop}"] == 9 and after["vllm:request_queue_time_seconds_count"] == 9
    queue, prefill, first = ((after[name] - before[name]) for name in ("vllm:request_queue_time_seconds_sum",
                             "vllm:request_prefill_time_seconds_sum", "vllm:time_to_first_token_seconds_sum"))
    # the second wave waits the first one out: 20 steps of 10 ms and a 100 ms prefill, ~0.3 s each
    assert queue > 4 * 0.25
    ttft = sum(t for t, _, _ in results)
    assert ttft == pytest.approx(queue + prefill, rel=0.2)
    assert first == pytest.approx(queue + prefill, rel=0.01)
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 8 * 500
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 8 * 20


def test_time_per_output_token_rises_with_the_batch() -> None:
    def tpot(batch: int) -> tuple[float, float]:
        with Provider(**{**BASE, "engine_step_ms": 5, "engine_step_ms_per_running": 5}, engine_max_running=8, output_tokens=20) as provider:
            async def main() -> list[tuple[float, list[float], str]]:
                async with _client(provider) as client:
                    return await asyncio.gather(*(_stream(client) for _ in range(batch)))

            results = asyncio.run(main())
            after = _metrics(provider)
        client_side = sum((times[-1] - times[0]) / (len(times) - 1) for _, times, _ in results) / batch
        return after["vllm:time_per_output_token_seconds_sum"] / after["vllm:time_per_output_token_seconds_count"], client_side

    alone, alone_client = tpot(1)
    crowded, crowded_client = tpot(8)
    assert alone == pytest.approx(0.010, rel=0.3) and crowded == pytest.approx(0.045, rel=0.3)
    assert alone_client == pytest.approx(alone, rel=0.3) and crowded_client == pytest.approx(crowded, rel=0.3)


def test_a_small_kv_budget_preempts_and_every_answer_still_comes_whole() -> None:
    # 4 x (50 input + 30 output) tokens in a 200-token cache: three fit at first, then outgrow it
    with Provider(**BASE, engine_max_running=4, engine_kv_tokens=200, output_tokens=30) as provider:
        async def main() -> tuple[list[tuple[float, list[float], str]], Any]:
            async with _client(provider) as client:
                streams = [_stream(client, "x" * 200 + str(i)) for i in range(3)]
                whole = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "y" * 200}])
                return await asyncio.gather(asyncio.gather(*streams), whole)  # type: ignore[return-value]

        streamed, whole = asyncio.run(main())
        after = _metrics(provider)
    assert after["vllm:num_preemptions_total"] > 0
    assert all(len(times) == 30 and len(text.split()) == 30 for _, times, text in streamed)
    assert whole.usage.completion_tokens == 30 and len(whole.choices[0].message.content.split()) == 30
    assert after["vllm:request_success_total{stop}"] == 4 and after["vllm:generation_tokens_total"] == 4 * 30
    assert after["vllm:kv_cache_usage_perc"] == 0


def test_a_healthy_engine_has_no_queue() -> None:
    with Provider(**BASE, engine_max_running=8, output_tokens=20) as provider:
        async def main() -> list[dict[str, float]]:
            async with _client(provider) as client:
                await _stream(client)  # the client's lazy imports out of the way
                tasks = [asyncio.create_task(_stream(client)) for _ in range(3)]
                scrapes = []
                while not all(task.done() for task in tasks):
                    scrapes.append(await asyncio.to_thread(_metrics, provider))
                    await asyncio.sleep(0.02)
                return scrapes

        scrapes = asyncio.run(main())
        after = _metrics(provider)
    assert all(s["vllm:num_requests_waiting"] == 0 for s in scrapes) and max(s["vllm:num_requests_running"] for s in scrapes) == 3
    assert after["vllm:request_queue_time_seconds_sum"] / after["vllm:request_queue_time_seconds_count"] < 0.015  # within a step


def test_a_client_that_leaves_frees_its_slot_and_counts_as_an_abort() -> None:
    with Provider(**{**BASE, "engine_step_ms": 5}, engine_max_running=1, output_tokens=2000) as provider:
        async def main() -> float:
            async with _client(provider) as client:
                stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        break
                await stream.close()  # 10 s of answer left
                with pytest.raises(openai.APITimeoutError):  # a queued one that gives up leaves the queue too
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], timeout=0.3)
                start = time.perf_counter()
                await _stream(client, max_tokens=5)
                return time.perf_counter() - start

        took = asyncio.run(main())
        after = _metrics(provider)
    assert took < 1.0
    assert after["vllm:request_success_total{abort}"] == 2 and after["vllm:request_success_total{length}"] == 1
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0


def test_the_responses_api_streams_from_the_engine() -> None:
    with Provider(**BASE, engine_max_running=2, output_tokens=6, engine_model="served-model") as provider:
        async def main() -> list[str]:
            async with _client(provider) as client:
                stream = await client.responses.create(model="m", input="hi", stream=True)
                return [event.type async for event in stream]

        types = asyncio.run(main())
        text = httpx.get(provider.url[: -len("/v1")] + "/metrics").text
    assert types.count("response.output_text.delta") == 6 and types[-1] == "response.completed"
    assert 'vllm:time_per_output_token_seconds_count{engine="0",model_name="served-model"} 1.0' in text


def test_the_scheduler_steps_as_vllm_does() -> None:
    async def main() -> None:
        engine = Engine(2, kv_tokens=29, step_ms=10, step_ms_per_running=5, prefill_ms_per_1k_tokens=1000)
        a, b, c = (engine.submit(10, 5) for _ in range(3))
        assert engine.schedule(0.0) == 20 and engine.running == [a, b] and list(engine.waiting) == [c]  # c waits for a slot
        assert engine.step_seconds(20) == pytest.approx(0.040)  # 10 + 2 x 5 + 20 tokens of prefill
        engine.finish_step(1.0)
        assert (a.generated, a.first_token, a.first_scheduled, c.first_scheduled) == (1, 1.0, 0.0, None)
        assert engine.schedule(1.0) == 0  # 2 x (11 + 1) fits 29
        engine.finish_step(2.0)
        for now in range(3, 5):  # 2 x (12 + 1), then 2 x (13 + 1) = 28 still fit
            engine.schedule(float(now))
            engine.finish_step(float(now))
        assert engine.schedule(5.0) == 0 and engine.running == [a] and list(engine.waiting) == [b, c]  # 2 x (14 + 1) does not
        assert (engine.preemptions, b.preempted, b.generated) == (1, 1, 4)
        engine.finish_step(6.0)
        assert a.outcome == "stop" and b.outcome is None
        assert engine.schedule(7.0) == 14 + 10 and engine.running == [b, c]  # b prefills 10 + 4 again, c its 10
        engine.finish_step(8.0)
        assert (b.generated, b.first_token, c.first_token, c.first_scheduled) == (5, 1.0, 8.0, 7.0)
        assert b.outcome == "stop" and engine.running == [c]
        engine.abort(c)
        assert c.outcome == "abort" and not engine.running and engine.kv_usage == 0

    asyncio.run(main())


def test_engine_settings_are_per_server_validated_and_on_the_command_line() -> None:
    assert ProviderConfig().engine_max_running == 0
    with pytest.raises(ValueError, match="engine_kv_tokens"):
        ProviderConfig(engine_kv_tokens=-1)
    with pytest.raises(ValueError, match="engine_step_ms"):
        ProviderConfig(engine_step_ms=float("nan"))
    with pytest.raises(ValueError, match="per-server"):
        ProviderConfig().with_overrides({"engine_max_running": "3"})
    args = vars(_parser().parse_args(["--engine-max-running", "8", "--engine-kv-tokens", "4000", "--engine-model", "llama"]))
    assert (args["engine_max_running"], args["engine_kv_tokens"], args["engine_model"]) == (8, 4000, "llama")
    with Provider(**BASE, engine_max_running=2, output_tokens=3) as provider:
        client = openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="per-server"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], extra_body={"latprof": {"engine_kv_tokens": 5}})
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-latprof-engine-step-ms": "1"})
        assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).usage.completion_tokens == 3
    with Provider(output_tokens=1) as plain:
        assert httpx.get(plain.url[: -len("/v1")] + "/metrics").status_code == 404  # engine mode off: no /metrics


def test_metrics_answer_501_without_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import prometheus_client raises ImportError
    with Provider(**BASE, engine_max_running=2, output_tokens=3) as provider:
        client = openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=0)
        assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).usage.completion_tokens == 3
        response = httpx.get(provider.url[: -len("/v1")] + "/metrics")
    assert response.status_code == 501 and "prometheus_client" in response.text and response.text.count("\n") == 1
