"""Trace readers: the spans a team already has (OTLP JSON and protobuf, Jaeger, Zipkin, `latprof receive`) as events."""
