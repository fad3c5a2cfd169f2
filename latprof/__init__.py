"""latprof: which layer really owns your AI service's p99."""

__version__ = "0.1.0"
