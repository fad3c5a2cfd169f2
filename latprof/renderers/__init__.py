"""Renderers turn a finished `Report` into text for a person or a program; registered by name."""

from __future__ import annotations

from typing import Callable, TextIO

from latprof.report import Report

Renderer = Callable[[Report, TextIO], None]
_RENDERERS: dict[str, Renderer] = {}


def register(name: str) -> Callable[[Renderer], Renderer]:
    """Register a renderer under `name` (the value of `--format`)."""

    def decorate(fn: Renderer) -> Renderer:
        _RENDERERS[name] = fn
        return fn

    return decorate


def names() -> list[str]:
    _load_builtins()
    return sorted(_RENDERERS)


def get(name: str) -> Renderer:
    _load_builtins()
    return _RENDERERS[name]


def _load_builtins() -> None:
    from latprof.renderers import json, text  # noqa: F401  (registration side effect)
