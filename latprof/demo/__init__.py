"""The bundled demo: an OpenAI-compatible provider whose every latency fault is a setting."""
