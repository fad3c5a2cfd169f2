"""Every hook on its scaffold: install twice changes nothing, uninstall restores, a changed library keeps a part off."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
from recording import recording

from latprof.collectors.hooks import _scaffold, bootstrap
from latprof.events import QualityRecord
from latprof.semconv import NOTE_HOOK_OFF, NOTE_UNTESTED_VERSION


def importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def parts_here(scaffold: _scaffold.Hook) -> list[_scaffold.Library]:
    """The parts of a hook whose library this environment has (uvicorn's zttp protocols are not)."""
    return [lib for lib in scaffold.libraries if importable(lib.module) and all(importable(t.module) for t in lib.targets)]


def current(target: _scaffold.Target) -> Any:
    module = importlib.import_module(target.module)
    owner = getattr(module, target.owner) if target.owner else module
    return vars(owner).get(target.attribute)


# --- every hook ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(bootstrap.HOOKS))
def test_installing_twice_changes_nothing_and_uninstall_restores_the_very_same_objects(name):
    module = bootstrap.HOOKS[name]
    scaffold: _scaffold.Hook = module.scaffold
    assert scaffold.name == name
    was_installed = scaffold.installed
    module.uninstall()
    targets = [target for lib in parts_here(scaffold) for target in lib.targets]
    before = {target: current(target) for target in targets}
    assert all(getattr(value, _scaffold.MARK, None) is None for value in before.values())
    try:
        with recording() as events:
            assert module.install() is True
            patched = list(scaffold.patched)
            after = {target: current(target) for target in targets}
            for target in targets:  # every declared target is wrapped, and its wrapper knows the original
                assert getattr(after[target], _scaffold.MARK) is before[target], target.where()
            assert module.install() is True
            assert {target: current(target) for target in targets} == after
            assert len(scaffold.patched) == len(patched)
            assert all(a is b for entry, again in zip(patched, scaffold.patched) for a, b in zip(entry, again))
            # This environment has the lines the hooks are tested on: no part is off here.
            assert not [e for e in events if isinstance(e, QualityRecord) and e.kind == NOTE_HOOK_OFF]
    finally:
        module.uninstall()
    for target in targets:
        assert current(target) is before[target], target.where()
    for owner, attribute, original, _ in patched:
        assert vars(owner)[attribute] is original, (owner, attribute)
    if was_installed:
        module.install()


def test_no_two_hooks_patch_the_same_attribute():
    owner_of: dict[tuple[str, str, str], str] = {}
    for name, module in bootstrap.HOOKS.items():
        for lib in module.scaffold.libraries:
            for target in lib.targets:
                assert owner_of.setdefault((target.module, target.owner, target.attribute), name) == name, target


# --- the version gate, on a real module ----------------------------------------------------------


def _json_hook(targets: list[_scaffold.Target], tested: list[_scaffold.Tested]) -> tuple[_scaffold.Hook, list[str]]:
    applied: list[str] = []
    hook: _scaffold.Hook

    def apply(module: types.ModuleType) -> None:
        applied.append(module.__name__)
        hook.wrap(module, "dumps", lambda original: lambda *a, **k: original(*a, **k))

    hook = _scaffold.Hook("json_test", [_scaffold.Library("json", targets, apply, tested)])
    return hook, applied


def test_a_part_whose_target_is_missing_stays_off_with_its_note():
    import json as library

    original = library.dumps
    hook, applied = _json_hook([_scaffold.Target("json", "", "dumps"), _scaffold.Target("json", "", "no_such")], [])
    with recording() as events:
        assert hook.install() is True
    hook.uninstall()
    assert applied == [] and library.dumps is original and hook.patched == []
    (note,) = [e for e in events if isinstance(e, QualityRecord)]
    assert note.kind == NOTE_HOOK_OFF and note.attrs["collector"] == "json_test" and note.attrs["library"] == "json"
    assert note.message == "hook json_test is off for json: json.no_such is missing"


def test_a_target_that_changed_shape_keeps_the_part_off():
    hook, applied = _json_hook([_scaffold.Target("json", "", "dumps", True), _scaffold.Target("json", "", "__version__")], [])
    hook.install()
    hook.uninstall()
    assert applied == []
    (note,) = hook.notes
    assert note.attrs["changed"] == ["json.dumps is no longer a coroutine function", "json.__version__ is no longer callable (a str)"]


def test_an_untested_version_with_every_target_is_patched_and_noted():
    import json as library

    original = library.dumps
    version = library.__version__
    hook, applied = _json_hook([_scaffold.Target("json", "", "dumps", False)], [_scaffold.Tested("json", "0.1", "0.9")])
    with recording() as events:
        hook.install()
        assert applied == ["json"] and getattr(library.dumps, _scaffold.MARK) is original
    hook.uninstall()
    assert library.dumps is original
    (note,) = [e for e in events if isinstance(e, QualityRecord)]
    assert note.kind == NOTE_UNTESTED_VERSION and note.attrs["versions"] == {"json": version}
    assert note.message == f"hook json_test patched json {version}, a version it is not tested on (tested: json 0.1 to 0.9)"
    tested, _ = _json_hook([_scaffold.Target("json", "", "dumps")], [_scaffold.Tested("json", version, version)])
    tested.install()
    tested.uninstall()
    assert tested.notes == []


def test_a_part_that_fails_midway_is_undone_and_counted():
    import json as library

    originals = library.dumps, library.loads

    def apply(module: types.ModuleType) -> None:
        hook.wrap(module, "dumps", lambda original: lambda *a, **k: original(*a, **k))
        hook.wrap(module, "loads", lambda original: lambda *a, **k: original(*a, **k))
        raise RuntimeError("half done")

    hook = _scaffold.Hook("json_test", [_scaffold.Library("json", [], apply)])
    with recording():
        hook.install()
        assert (library.dumps, library.loads) == originals and hook.patched == []
    hook.uninstall()


@pytest.mark.parametrize(
    ("version", "oldest", "newest", "within"),
    [
        ("2.1.9", "2.0", "2.1", True), ("2.0.0", "2.0", "2.1", True), ("2.2.0", "2.0", "2.1", False),
        ("1.4.54", "2.0", "2.1", False), ("8.1.0", "5", "8", True), ("9.0.0b1", "5", "8", False),
        ("0.29.0", "0.29", "0.32", True), ("0.28.1", "0.29", "0.32", False), ("3.0.0rc2", "2", "3", True),
        ("dev", "1", "2", False),
    ],
)  # fmt: skip
def test_a_version_is_within_lines_compared_at_their_own_precision(version, oldest, newest, within):
    assert _scaffold.within(version, oldest, newest) is within


# --- a changed library under the real `latprof run` -------------------------------------------------

# Breaks the last part of every hook whose library is here (its first target: removed, or
# replaced by a value that is no longer a function, by turns), claims a redis-py version no
# hook is tested on, then installs every hook as `latprof run` does, and serves a few requests.
SERVICE = textwrap.dedent(
    """
    import importlib, json, time
    from latprof.collectors.hooks import _scaffold, bootstrap, runtime

    assert runtime.active(), "hooks were not loaded"

    def importable(module):
        try:
            importlib.import_module(module)
        except ImportError:
            return False
        return True

    broken = {}
    for i, name in enumerate(sorted(bootstrap.HOOKS)):
        parts = [lib for lib in bootstrap.HOOKS[name].scaffold.libraries
                 if importable(lib.module) and all(importable(t.module) for t in lib.targets)]
        if not parts:
            continue
        target = parts[-1].targets[0]
        module = importlib.import_module(target.module)
        owner = getattr(module, target.owner) if target.owner else module
        if i % 2:
            delattr(owner, target.attribute)
        else:
            setattr(owner, target.attribute, 42)
        broken[name] = {"where": target.where(), "library": parts[-1].module, "others": len(parts) - 1}
    import redis
    redis.__version__ = "99.0.0"
    bootstrap.install_hooks(sorted(bootstrap.HOOKS))
    left = {}
    for name, what in broken.items():
        scaffold = bootstrap.HOOKS[name].scaffold
        off = [lib for lib in scaffold.libraries if lib.module == what["library"]][-1]
        left[name] = {
            "off_patched": [e[1] for e in scaffold.patched if e[3] is off],
            "others_patched": len({id(e[3]) for e in scaffold.patched if e[3] is not off}),
        }
    for _ in range(60):
        token = runtime.begin_request("GET /ok", runtime.now_ns())
        time.sleep(0.001)
        runtime.end_request(token)
    with open("said.json", "w") as out:
        json.dump({"broken": broken, "left": left}, out)
    """
)


@pytest.fixture(scope="module")
def changed_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("changed")
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    result = subprocess.run(
        [sys.executable, "-m", "latprof", "run", "--out", str(tmp_path / "capture.jsonl"), "--skip-warmup", "0",
         "--format", "json", "--hooks", "asyncio_loop", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = json.loads((tmp_path / "said.json").read_text())
    return json.loads(result.stdout), said["broken"], said["left"]


HOOKS_WITH_PARTS = sorted(name for name, module in bootstrap.HOOKS.items() if parts_here(module.scaffold))


@pytest.mark.slow
@pytest.mark.parametrize("name", HOOKS_WITH_PARTS)
def test_a_hook_whose_target_changed_shape_stays_off_with_its_note_in_the_report(changed_run, name):
    report, broken, left = changed_run
    assert name in broken
    where = broken[name]["where"]
    notes = [w for w in report["collection"]["warnings"] if f"{NOTE_HOOK_OFF}: hook {name} is off" in w and where in w]
    assert len(notes) == 1, report["collection"]["warnings"]
    assert f"{where} is missing" in notes[0] or f"{where} is no longer callable (a int)" in notes[0]
    assert left[name]["off_patched"] == []  # that part stays off ...
    assert left[name]["others_patched"] == broken[name]["others"]  # ... and the hook's other parts work


@pytest.mark.slow
def test_an_untested_version_is_patched_and_reported_as_untested(changed_run):
    report, broken, left = changed_run
    (note,) = [w for w in report["collection"]["warnings"] if f"{NOTE_UNTESTED_VERSION}: hook redis" in w]
    assert note.endswith("hook redis patched redis 99.0.0, a version it is not tested on (tested: redis 5 to 8)")
    assert left["redis"]["others_patched"] == 1  # the sync client, whose part is whole


def _next_line(line: str) -> str:
    """The first version past a line: "0.55" -> "0.56", "3" -> "4"."""
    parts = line.split(".")
    return ".".join([*parts[:-1], str(int(parts[-1]) + 1)])


def test_the_test_environment_is_held_to_the_lines_the_hooks_are_tested_on():
    # tests/constraints.txt (used by the README's test command and nox) caps each library the
    # version gate knows just past its newest tested line, and every installed one is inside it.
    import importlib.metadata

    wanted: dict[str, set[str]] = {}
    for hook in bootstrap.HOOKS.values():
        for library in hook.scaffold.libraries:
            for tested in library.tested:
                dist = (tested.distribution or tested.package).replace("_", "-").lower()
                wanted.setdefault(dist, set()).add(f"<{_next_line(tested.newest)}")
    lines = (Path(__file__).parents[2] / "constraints.txt").read_text().splitlines()
    pinned = {}
    for line in lines:
        if line.strip() and not line.startswith("#"):
            dist, bound = line.split("<", 1)
            pinned[dist.strip().lower()] = {f"<{bound.strip()}"}
    assert pinned == wanted
    for dist, bounds in pinned.items():
        try:
            installed = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue  # not in this environment (nox's older lines leave some out)
        (bound,) = bounds
        ceiling = tuple(int(p) for p in bound[1:].split("."))
        assert tuple(int(p) for p in installed.split(".")[: len(ceiling)]) < ceiling, (dist, installed, bound)
