"""The scoreboard: how often each way of collecting names the right layer on latprof's own faults.

    python benchmarks/accuracy.py [--modes run,attach,inject,stock,openllmetry,openinference,openai-v2,traces]
                                  [--repeat 1] [--seconds 14] [--dsn URL] [--write docs/accuracy.md]

Runs every `latprof demo` scenario (a FastAPI + SQLAlchemy + openai service with one known fault,
a provider started here, open-loop load) once per mode and repetition: `run` records it with
`latprof run`'s hooks, `attach` starts it plainly and samples it with `latprof attach --pid`
(`latprof demo --attach`), `inject` starts it plainly and records it with `latprof attach
--pid --inject` (`latprof demo --inject`). `stock` starts it traced with the stock OpenTelemetry SDK and
instrumentations only (FastAPI, SQLAlchemy, httpx), exporting to `latprof receive`, and diagnoses
those traces (`latprof demo --traces stock`); `openllmetry`, `openinference` and `openai-v2` add
that GenAI instrumentation of the openai client (installed first: see docs/genai.md).
`traces` runs the stock-OpenTelemetry services of the OTLP
end-to-end tests instead (`tests/collectors/traces/otlp_harness.py`: FastAPI traced with the
stock instrumentations only, one known fault each) and analyses their OTLP files, as
`latprof analyze FILE` does. Each verdict is scored against the scenario's known layer:

- **right**: the known layer (or no layer, where the scenario has no tail);
- **honest**: no layer, or `unattributed`, where the data could not tell;
- **wrong**: another layer; **confidently wrong** when its confidence is >= 0.5 (the CI test
  `tests/attach/test_accuracy_e2e.py` fails on those).

Prints a Markdown table; `--write FILE` replaces the part of FILE between the scoreboard markers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from latprof.demo.otel import KINDS as TRACE_KINDS
from latprof.demo.run import run_demo
from latprof.demo.scenarios import SCENARIOS, Scenario
from latprof.layers import UNATTRIBUTED

#: A verdict naming a wrong layer at this confidence or more sends people to fix the wrong thing.
CONFIDENT = 0.5
BEGIN, END = "<!-- scoreboard:begin -->", "<!-- scoreboard:end -->"
PG_DSN = os.environ.get("LATPROF_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario | Traced
    mode: str
    layer: str | None
    status: str
    confidence: float | None
    rule: str | None

    @property
    def score(self) -> str:
        return score(self.scenario.expected_layer, self.layer, self.confidence)

    def cell(self) -> str:
        said = self.layer or self.status.replace("_", " ")
        more = ", ".join(x for x in (f"{self.confidence:.2f}" if self.layer else "", self.rule or "") if x)
        return f"{said}{f' ({more})' if more else ''}: {self.score}"


def score(expected: str | None, layer: str | None, confidence: float | None) -> str:
    """right, honest, wrong, or confidently wrong (see the module's docstring)."""
    if layer == expected:
        return "right"
    if layer is None or layer == UNATTRIBUTED:
        return "honest"
    return "confidently wrong" if (confidence or 0.0) >= CONFIDENT else "wrong"


@dataclass(frozen=True)
class Traced:
    """A stock-OpenTelemetry service of the OTLP end-to-end tests: `scenario` of its harness on `db`."""

    name: str
    scenario: str
    db: str
    expected_layer: str | None


#: The OTLP harness's scenarios with one known fault (its agent loop has none: it is left out).
TRACED = [
    Traced("pool-held (SQLAlchemy: connect spans)", "pool_held", "sqlalchemy", "db.pool"),
    Traced("pool-held (asyncpg: no pool span)", "pool_held", "asyncpg", "db.pool"),
    Traced("sequential-tools", "sequential_tools", "sqlalchemy", "tool"),
    Traced("slow-query", "slow_query", "psycopg_pool", "db.query"),
    Traced("queued-backend (a called service)", "queued_backend", "sqlalchemy", "queue"),
    Traced("healthy", "healthy", "sqlalchemy", None),
]


def run_traced(traced: Traced) -> Outcome:
    """Record `traced` with the OTLP harness (as the end-to-end tests do) and analyse the file."""
    tests = Path(__file__).resolve().parents[1] / "tests"
    for path in (tests, tests / "collectors" / "traces"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    from otlp_harness import record_otlp  # the tests' harness: a real traced service, provider and load

    from latprof.pipeline import run_diagnosis

    with tempfile.TemporaryDirectory(prefix="latprof-accuracy-") as tmp:
        verdict = run_diagnosis([record_otlp(Path(tmp), traced.scenario, db=traced.db)]).report.verdict
    return Outcome(traced, "traces", verdict.layer, verdict.status, verdict.confidence, verdict.rule)


def run_one(scenario: Scenario, mode: str, seconds: float, dsn: str | None) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="latprof-accuracy-") as tmp:
        result = run_demo(scenario.name, dsn=dsn, capture=Path(tmp) / "capture.jsonl", duration_s=seconds,
                          progress=None, attach=mode == "attach", inject=mode == "inject",
                          traces=mode if mode in TRACE_KINDS else None)  # fmt: skip
    verdict = result.report.verdict
    return Outcome(scenario, mode, verdict.layer, verdict.status, verdict.confidence, verdict.rule)


def table(outcomes: list[Outcome], modes: list[str], scenarios: list[Scenario] | list[Traced] | None = None) -> str:
    scenarios = list(SCENARIOS.values()) if scenarios is None else scenarios
    lines = ["| scenario | known layer | " + " | ".join(modes) + " |", "|---|---|" + "---|" * len(modes)]
    for scenario in scenarios:
        cells = []
        for mode in modes:
            got = [o for o in outcomes if o.scenario is scenario and o.mode == mode]
            cells.append("<br>".join(o.cell() for o in got) or "-")
        lines.append(f"| {scenario.name} | {scenario.expected_layer or 'none (no tail)'} | " + " | ".join(cells) + " |")
    lines.append("")
    for mode in modes:
        got = [o for o in outcomes if o.mode == mode]
        counts = {k: sum(1 for o in got if o.score == k) for k in ("right", "honest", "wrong", "confidently wrong")}
        lines.append(f"- **{mode}**: right {counts['right']} of {len(got)}, honest {counts['honest']},"
                     f" wrong {counts['wrong']}, confidently wrong {counts['confidently wrong']}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="run,attach,inject,stock,traces",
                        help="comma-separated: run, attach, inject, stock, openllmetry, openinference, openai-v2, traces")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=14.0, help="seconds of load per run")
    parser.add_argument("--dsn", default=PG_DSN, help="the demo's database (PostgreSQL, so attach sees its sockets)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--write", type=Path, help="replace the scoreboard between its markers in this file")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    demo_modes = [m for m in modes if m != "traces"]
    outcomes: list[Outcome] = []
    started = time.strftime("%Y-%m-%d")
    for _ in range(args.repeat):
        for name in args.scenarios.split(",") if demo_modes else ():
            for mode in demo_modes:
                outcome = run_one(SCENARIOS[name], mode, args.seconds, args.dsn)
                print(f"{name:22} {mode:7} {outcome.cell()}", file=sys.stderr, flush=True)
                outcomes.append(outcome)
        for traced in TRACED if "traces" in modes else ():
            outcome = run_traced(traced)
            print(f"{traced.name:22} traces  {outcome.cell()}", file=sys.stderr, flush=True)
            outcomes.append(outcome)
    text = table(outcomes, demo_modes) if demo_modes else ""
    if "traces" in modes:
        text += ("\n" if text else "") + "Stock OpenTelemetry traces (the OTLP end-to-end tests' services):\n\n"
        text += table(outcomes, ["traces"], TRACED)
    print(text)
    if args.write:
        page = args.write.read_text()
        head, _, rest = page.partition(BEGIN)
        _, _, tail = rest.partition(END)
        note = (f"Measured {started} by `python benchmarks/accuracy.py --modes {args.modes} --repeat {args.repeat}"
                f" --seconds {args.seconds:g} --write {args.write}` (PostgreSQL at 127.0.0.1, 2-core VM).\n\n")  # fmt: skip
        args.write.write_text(f"{head}{BEGIN}\n{note}{text}{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
