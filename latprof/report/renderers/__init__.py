"""Renderers turn a finished `Report` into text for a person or a program; registered by name."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TextIO, TypeVar

from latprof.report.model import Report

T = TypeVar("T")


class Formats(Generic[T]):
    """Formatters of one kind of result (a check run, a diff), registered by name: the values of a `--format`."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._by_name: dict[str, Callable[[T, TextIO], None]] = {}

    def register(self, name: str) -> Callable[[Callable[[T, TextIO], None]], Callable[[T, TextIO], None]]:
        def decorate(fn: Callable[[T, TextIO], None]) -> Callable[[T, TextIO], None]:
            self._by_name[name] = fn
            return fn

        return decorate

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def render(self, value: T, name: str, out: TextIO) -> None:
        """Write `value` to `out` in the format `name`; ValueError for a name not registered."""
        try:
            formatter = self._by_name[name]
        except KeyError:
            raise ValueError(f"unknown {self.what} format {name!r}; known: {', '.join(self.names())}") from None
        formatter(value, out)


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
    from latprof.report.renderers import json, text  # noqa: F401  (registration side effect)
