"""ASGI applications and a server harness for the hook tests (importable by uvicorn as `tests.collectors.hooks.apps.*`)."""
