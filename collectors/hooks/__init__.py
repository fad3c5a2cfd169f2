"""In-process hooks: what `latprof run` loads into the service to record its requests, layer by layer."""
