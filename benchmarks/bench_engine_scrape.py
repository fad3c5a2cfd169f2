"""What `--engine-metrics` costs latprof's own process per scrape, and what it asks of the engine.

    python benchmarks/bench_engine_scrape.py [--scrapes 200] [--trials 5]

For each engine page in tests/collectors/scrape/fixtures/ (vLLM v0 and v1, SGLang, TGI,
llama.cpp's server) and for the demo provider's engine mode serving vLLM's metrics over HTTP:
the CPU time per scrape of the parsing and the deltas (`EngineScrape.take`), and, for the live
engine, of the whole scrape (HTTP GET on loopback included, `EngineScraper.scrape_once`), with
the page's size. At one scrape a second, the CPU per scrape in ms is the share of a core in
tenths of a percent. Medians over trials, with the spread (this machine is noisy). The scraper
runs in latprof's process, never in the service: what the engine pays is serving its own
/metrics once a second, which Prometheus already asks of it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from latprof.collectors.scrape.prometheus import EngineScrape, EngineScraper

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "collectors" / "scrape" / "fixtures"


def per_scrape_ms(run: object, scrapes: int, trials: int) -> tuple[float, float, float]:
    """(median, min, max) over trials of the CPU ms per call of `run` (a callable taking the call's number)."""
    results = []
    for _ in range(trials):
        began = time.process_time()
        for i in range(scrapes):
            run(i)  # type: ignore[operator]
        results.append((time.process_time() - began) * 1000 / scrapes)
    return statistics.median(results), min(results), max(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    print(f"{'page':<28} {'bytes':>7} {'families':>8} {'events':>6}  CPU ms per scrape (median, min-max)")
    for page in sorted(FIXTURES.glob("*.prom")):
        text = page.read_text()
        state = EngineScrape("http://127.0.0.1:9/metrics", pid=1)
        state.take(text, 0)  # the baseline
        events = len(state.take(text, 1))
        median, low, high = per_scrape_ms(lambda i: state.take(text, i + 2), args.scrapes, args.trials)
        families = text.count("# TYPE")
        print(f"{page.name:<28} {len(text.encode()):>7} {families:>8} {events:>6}  {median:.3f} ({low:.3f}-{high:.3f})")
    from latprof.demo.provider import Provider

    from openai import OpenAI

    with Provider(ttft_ms=0, engine_max_running=4, output_tokens=4) as provider:
        client = OpenAI(base_url=provider.url, api_key="bench")
        for _ in range(8):  # every histogram has observations
            client.chat.completions.create(model="bench", messages=[{"role": "user", "content": "hi"}])
        collected: list[object] = []
        scraper = EngineScraper([provider.metrics_url], collected.append)
        scraper.scrape_once()
        import urllib.request

        size = len(urllib.request.urlopen(provider.metrics_url, timeout=5).read())
        median, low, high = per_scrape_ms(lambda i: scraper.scrape_once(), args.scrapes, args.trials)
        summary = scraper.stop()[0]
        print(f"{'demo engine over HTTP':<28} {size:>7} {'':>8} {'':>6}  {median:.3f} ({low:.3f}-{high:.3f})"
              f"  [{summary.scrapes} scrapes, {summary.failed} failed; the provider's serving thread is in this"
              " process and counted too]")  # fmt: skip


if __name__ == "__main__":
    main()
