"""Collectors that scrape an endpoint: the Prometheus metrics of self-hosted inference engines (`--engine-metrics`)."""
