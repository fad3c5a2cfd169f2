"""A finding's evidence as rows a person reads: a name, the value rounded, its unit (the terminal and HTML reports)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import islice
from typing import Any, Mapping, Sequence


@dataclass(frozen=True, slots=True)
class EvidenceRow:
    """One evidence entry: the JSON key unchanged, and how a report shows it."""

    key: str  # the JSON key, unchanged
    name: str  # human name: the key without its unit, underscores to spaces ("pool wait p99")
    value: str  # the value, sensibly rounded, without unit ("357", "0.95", "yes", "db.pool, provider")
    unit: str  # "ms", "s", "%", "MiB", ... or "" when none


def evidence_rows(evidence: Mapping[str, Any]) -> list[EvidenceRow]:
    """Every key of `evidence`, in its order (the JSON report's), for a person: named without its
    unit; a number rounded to about 3 significant digits (from 100 on to whole units, with thousands
    separators), its unit apart; booleans as yes/no; None as "-"; a list or dict compact, at most
    `MAX_ITEMS` items or `MAX_ENTRIES` entries (the rest counted: "+3 more"), each number with its
    unit in the value ("p50: 21.4 ms, p99: 366 ms") and no unit apart.

    The unit comes from the key, which report-v1 names with it (`pool_wait_p99_ms`, `tpot_ms_tail`,
    `accept_rate_per_s`, `rss_bytes`, `cpu_percent`). A share or utilisation is a fraction of 1 and
    is shown in percent (0.95 as 95 %); a value already in percent (`cpu_percent`) as it is.
    `inferred` keeps a row of its own ("yes"), so an inference still reads as one."""
    rows: list[EvidenceRow] = []
    for key, value in evidence.items():
        name, unit = _parse_key(str(key))
        unit = _for_value(unit or _NONE, value)
        scalar = isinstance(value, (int, float)) and not isinstance(value, bool)
        inline = not scalar  # a container's numbers carry their unit; a lone number's stands apart
        rows.append(EvidenceRow(str(key), name, _format(value, unit, 0, inline), unit.label if scalar else ""))
    return rows


def with_unit(value: str, unit: str) -> str:
    """A value and its unit as one string: "357 ms", "99.5%", "12/s", "2.78×"; the value alone without a unit."""
    if not unit:
        return value
    return f"{value}{unit}" if unit in _TIGHT or unit.startswith("/") else f"{value} {unit}"


#: Items shown of a list (at each depth); the rest are counted ("+3 more").
MAX_ITEMS = 5
#: Entries shown of a dict (at each depth): a record's fields (a statement's count, p50, p99, ...) or data (queue sources).
MAX_ENTRIES = 10
#: Characters shown of a string inside a list or dict (an SQL statement, a frame); a top-level string is a sentence, shown whole.
MAX_NESTED_CHARS = 60
#: Units written against the number: "99.5%", not "99.5 %".
_TIGHT = ("%", "×")


@dataclass(frozen=True, slots=True)
class _Unit:
    label: str
    scale: float = 1.0  # a share's 0.95 is 95 (%)
    kind: str = ""  # "bytes": scaled to B/KiB/MiB/... by the value's size; "unix": a timestamp


_NONE = _Unit("")
#: A key's token naming its unit (`wait_ms`, `idle_age_ms_p50`, `cpu_percent`, `rss_mib`).
_UNIT_TOKENS = {
    "ns": _Unit("ns"), "us": _Unit("µs"), "ms": _Unit("ms"), "s": _Unit("s"), "hz": _Unit("Hz"),
    "pct": _Unit("%"), "percent": _Unit("%"),
    "bytes": _Unit("B", kind="bytes"), "kib": _Unit("KiB"), "mib": _Unit("MiB"), "gib": _Unit("GiB"),
    "kb": _Unit("kB"), "mb": _Unit("MB"), "gb": _Unit("GB"),
}  # fmt: skip
#: Tokens that make a key a fraction of 1 (`share_of_tail_excess`, `mean_utilisation`): shown in percent.
_FRACTION_TOKENS = {"share", "utilisation", "utilization", "fraction", "coverage"}
_PER_SECOND = _Unit("/s")
_TIMESTAMP = _Unit("UTC", kind="unix")
_RATIO = _Unit("×")
_PERCENT_OF_FRACTION = _Unit("%", scale=100.0)
#: A ratio of two percentiles (`p99_over_p50`).
_PERCENTILE_RATIO = re.compile(r"(?:^|_)p\d+_over_p\d+$")
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
#: A dict key named like an evidence key (`p50_ms`, `count`), not data (a host, a frame, "idle in transaction").
_FIELD = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")


def _parse_key(key: str) -> tuple[str, _Unit | None]:
    """A key's human name and its unit, None when the key names none: `pool_wait_p99_ms` is
    ("pool wait p99", ms), `tpot_ms_tail` ("tpot tail", ms), `accept_rate_per_s` ("accept rate", /s),
    `share_of_tail_excess` ("share of tail excess", % of a fraction)."""
    tokens = key.split("_")
    unit: _Unit | None = None
    if tokens[-2:] in (["per", "s"], ["per", "second"]):
        unit, tokens = _PER_SECOND, tokens[:-2]
    elif tokens[-2:] == ["unix", "s"]:
        unit, tokens = _TIMESTAMP, tokens[:-2]
    else:
        at = next((i for i, token in enumerate(tokens) if token.lower() in _UNIT_TOKENS), None)
        if at is not None:  # a unit that opens the key stays in the name: "ms per 1k input tokens"
            unit, tokens = _UNIT_TOKENS[tokens[at].lower()], tokens if at == 0 else tokens[:at] + tokens[at + 1 :]
        elif _FRACTION_TOKENS & {token.lower() for token in tokens}:
            unit = _PERCENT_OF_FRACTION
        elif _PERCENTILE_RATIO.search(key):
            unit = _RATIO
    name = " ".join(token for token in tokens if token)
    return name or key.replace("_", " "), unit


def _for_value(unit: _Unit, value: Any) -> _Unit:
    """Bytes in the binary unit that suits the value's largest number; any other unit as it is."""
    if unit.kind != "bytes":
        return unit
    largest = max((abs(n) for n in _numbers(value) if math.isfinite(n)), default=0.0)
    power = 0
    while largest >= 1024 and power < len(_BYTE_UNITS) - 1:
        largest /= 1024
        power += 1
    return _Unit(_BYTE_UNITS[power], scale=1024.0**-power)


def _format(value: Any, unit: _Unit, depth: int, inline: bool = False) -> str:
    """`value` for a person; numbers in `unit`, its label after each number when `inline` (a nested key's own unit)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        text = _number(value, unit)
        return with_unit(text, unit.label) if inline else text
    if isinstance(value, str):
        return value if depth == 0 else _clip(value)
    if isinstance(value, Mapping):
        parts = [_entry(k, v, unit, depth + 1, inline) for k, v in islice(value.items(), MAX_ENTRIES)]
        return _joined(parts, len(value), "{}" if depth else "")
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        parts = [_format(v, unit, depth + 1, inline) for v in islice(value, MAX_ITEMS)]
        return _joined(parts, len(value), "[]" if depth else "")
    return _clip(str(value))


def _entry(key: Any, value: Any, unit: _Unit, depth: int, inline: bool) -> str:
    """One entry of a dict: a field (`p50_ms`) named as a top-level key is, its unit after its numbers;
    a data key (a host, a frame, a state) as it is, its numbers in the unit of the key above."""
    text = str(key)
    if not _FIELD.fullmatch(text):
        return f"{_clip(text)}: {_format(value, unit, depth, inline)}"
    name, own = _parse_key(text)
    if own is None:
        return f"{name}: {_format(value, unit, depth, inline)}"
    return f"{name}: {_format(value, _for_value(own, value), depth, inline=True)}"


def _joined(parts: list[str], total: int, brackets: str) -> str:
    if total > len(parts):
        parts.append(f"+{total - len(parts)} more")
    text = ", ".join(parts)
    return f"{brackets[0]}{text}{brackets[1]}" if brackets else text


def _number(value: float, unit: _Unit) -> str:
    if unit.kind == "unix":
        try:
            moment = datetime.fromtimestamp(value, timezone.utc)
        except (OverflowError, OSError, ValueError):  # not a timestamp after all: the number, whole
            return str(value)
        return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
    if unit.scale != 1.0:
        value = value * unit.scale
    if isinstance(value, int):
        return f"{value:,}"
    return _rounded(value)


def _rounded(value: float) -> str:
    """About 3 significant digits: 357, 35.7, 3.57, 0.357, 0.00357; from 100 on whole units with
    thousands separators (2,402 rather than 2,400); no exponent, no trailing zeros."""
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{round(value):,}"
    rounded = float(f"{value:.3g}")
    if rounded == int(rounded):
        return f"{int(rounded):,}"
    decimals = 2 - math.floor(math.log10(abs(rounded)))
    return f"{rounded:.{decimals}f}".rstrip("0").rstrip(".")


def _clip(text: str) -> str:
    return text if len(text) <= MAX_NESTED_CHARS else text[: MAX_NESTED_CHARS - 1] + "…"


def _numbers(value: Any) -> list[float]:
    """Every number in `value`, at any depth (booleans are not numbers here)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, Mapping):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        return [n for v in value for n in _numbers(v)]
    return []


