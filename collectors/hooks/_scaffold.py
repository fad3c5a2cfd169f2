"""What every hook is built on: what it patches and in which library versions, install/uninstall, one mark.

Not a hook itself (as OpenTelemetry's `BaseInstrumentor` is not an instrumentation). A hook
module describes what it patches as a `Hook` made of `Library` parts and binds its
`install`/`uninstall` to it; its wrappers and hot paths stay in its own module.

- **Install** registers each library part to be patched when the service imports its
  `module` (now, if it already is): a service pays nothing for a library it never imports.
  Idempotent; `uninstall` puts every replaced attribute back, the very same object, latest
  first, and runs the parts' undo steps (event listeners to remove).
- **One mark.** A wrapper carries its original as `__latprof_original__`: an attribute that
  carries it is never wrapped again, even by another copy of the hook's module. An attribute
  is patched by one hook only.
- **The version gate.** Each part names its `Target`s (module, class, attribute) and the
  version lines it is tested on. When the library is imported and a target is missing or has
  changed shape (no longer a function defined on that class, or async where it was sync or
  the other way round), the part stays off and says so in a quality note (`NOTE_HOOK_OFF`),
  which the report lists under what latprof could see; the hook's other parts still work. A
  version outside the tested lines whose targets are all there is patched, and noted as
  untested (`NOTE_UNTESTED_VERSION`).
- **Never raises.** Patching a part is all or nothing: when it raises, what it did is undone
  and the error counted for the hook.
- **Installed late.** A hook may be installed into a process that is already serving
  (`latprof attach --inject`): a part is applied at once to a library imported long ago, and
  whatever the library set up at start (an application loaded, a lock created, a function
  imported under another name) was set up without it. Each hook's `late_coverage()` says in
  one sentence what it sees and misses then (`Hook.late_coverage` keeps that from raising).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
import types
from typing import Any, Callable, NamedTuple, Sequence

from latprof.collectors.hooks import runtime
from latprof.events import QualityRecord
from latprof.semconv import NOTE_HOOK_OFF, NOTE_UNTESTED_VERSION

#: The mark: a wrapper's original, on the wrapper.
MARK = "__latprof_original__"
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, without importing inspect into every process


class Target(NamedTuple):
    """An attribute a hook replaces: `module.owner.attribute` (`owner` "" for a module attribute).

    `is_async` says whether it must be a coroutine function (True), must not be (False), or
    either (None). The attribute must be defined on `owner` itself, not inherited.
    """

    module: str
    owner: str
    attribute: str
    is_async: bool | None = None

    def where(self) -> str:
        return ".".join(part for part in (self.module, self.owner, self.attribute) if part)


class Tested(NamedTuple):
    """The version lines of `package` a part is tested on, oldest and newest, each as "2.0" or "3".

    `distribution`: the name it is installed under, when not the package's (`openai_agents`).
    """

    package: str
    oldest: str
    newest: str
    distribution: str = ""


class Library:
    """One part of a hook: what it patches of one library, when `module` is imported.

    `apply(module)` replaces the attributes (through the hook's `replace`/`wrap`), and may add
    undo steps; it is called only when every target is there. `tested` are the version lines
    the part is tested on (none for the standard library).
    """

    __slots__ = ("module", "targets", "apply", "tested")

    def __init__(
        self,
        module: str,
        targets: Sequence[Target],
        apply: Callable[[types.ModuleType], None],
        tested: Sequence[Tested] = (),
    ) -> None:
        self.module = module
        self.targets = tuple(targets)
        self.apply = apply
        self.tested = tuple(tested)

    def __repr__(self) -> str:
        return f"Library({self.module!r})"


class Hook:
    """A hook's patches: `install`, `uninstall`, and `replace`/`wrap` for its parts' `apply`.

    `reset` runs after `uninstall` put everything back (to forget what `apply` set up besides,
    such as a histogram). `installed` and `patched` may be read by a hook's wrappers.
    """

    def __init__(self, name: str, libraries: Sequence[Library], reset: Callable[[], None] | None = None) -> None:
        self.name = name
        self.libraries = tuple(libraries)
        self._reset = reset
        self.lock = threading.RLock()
        self.installed = False
        #: (owner, attribute, original, part) of every attribute replaced, in patch order.
        self.patched: list[tuple[Any, str, Any, Library]] = []
        #: (part, step): run by `uninstall` before the originals are restored, latest first.
        self.undo: list[tuple[Library, Callable[[], None]]] = []
        #: The parts patched (or found off) since install.
        self.done: set[Library] = set()
        #: What the hook said about its libraries: the `NOTE_HOOK_OFF` / `NOTE_UNTESTED_VERSION` records.
        self.notes: list[QualityRecord] = []
        self._current: Library | None = None  # the part whose `apply` runs

    # --- install / uninstall ---------------------------------------------------------------

    def install(self) -> bool:
        """Patch each library when it is imported (now, if it already is). Idempotent; never raises."""
        with self.lock:
            if self.installed:
                return True
            self.installed = True
        for library in self.libraries:
            try:
                runtime.when_imported(library.module, functools.partial(self._patch, library))
            except Exception as exc:
                runtime.count_error(self.name, exc)
        return True

    def uninstall(self) -> None:
        """Undo every patch: the originals are back, the very same objects; never raises. The parts in
        the reverse of their install order, so that what a later part relies on stays until that part is
        gone (wsgi: a request a gunicorn worker starts while it is still wrapped gets its Flask route)."""
        with self.lock:
            self.installed = False
            for library in reversed(self.libraries):
                self._unpatch(library)
            self.done.clear()
            if self._reset is not None:
                try:
                    self._reset()
                except Exception as exc:
                    runtime.count_error(self.name, exc)

    # --- for the parts' apply --------------------------------------------------------------

    def replace(self, owner: Any, name: str, wrapper: Any) -> bool:
        """Set `owner.name` (defined on `owner` itself) to `wrapper`, unless it is wrapped already.

        False when it is (or when `owner` does not define `name`).
        """
        original = vars(owner).get(name)
        if original is None or getattr(original, MARK, None) is not None:
            return False
        setattr(wrapper, MARK, original)
        setattr(owner, name, wrapper)
        self.patched.append((owner, name, original, self._current or self.libraries[0]))
        return True

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> bool:
        """`replace` `owner.name` by `make(original)`, made to look like the original (`functools.wraps`)."""
        original = vars(owner).get(name)
        if original is None or getattr(original, MARK, None) is not None:
            return False
        return self.replace(owner, name, functools.wraps(original)(make(original)))

    def on_uninstall(self, step: Callable[[], None], part: Library | None = None) -> None:
        """Run `step` at `uninstall` (an event listener to remove), before the originals are restored.

        The step belongs to the part whose `apply` runs, or to `part` (called from elsewhere,
        such as a wrapper that set up instance state), or to the first part.
        """
        with self.lock:
            self.undo.append((self._current or part or self.libraries[0], step))

    def replace_aliases(self, names: dict[str, tuple[Any, Any]], skip: tuple[str, ...] = ()) -> int:
        """`replace` the module-level `name` of every imported module where it is `original`, by `wrapper`
        (`names`: name -> (original, wrapper)); how many were replaced.

        What modules imported before install bound with `from time import sleep`: a hook
        installed into a process that is already serving finds them bound to the original.
        latprof's own modules, and modules named in `skip` or under them, are left alone. An
        alias that cannot be replaced is counted as an error, never fatal to the part.
        """
        done = 0
        for module_name, module in list(sys.modules.items()):
            if module_name.startswith("latprof.") or module_name in skip or module_name.startswith(tuple(f"{s}." for s in skip)):
                continue
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for name, (original, wrapper) in names.items():
                if namespace.get(name) is original:
                    try:
                        done += self.replace(module, name, wrapper)
                    except Exception as exc:
                        runtime.count_error(self.name, exc)
        return done

    # --- installed late ----------------------------------------------------------------------

    def imported(self) -> list[str]:
        """The modules of the hook's parts that the process has imported (its libraries in use)."""
        return [library.module for library in self.libraries if library.module in sys.modules]

    def loaded(self, label: str) -> str:
        """"`label` is loaded", or "`label` is not imported in this process" when none of the parts' modules is."""
        return f"{label} is loaded" if self.imported() else f"{label} is not imported in this process"

    def late_coverage(self, describe: Callable[[], str]) -> str:
        """One sentence from `describe()` (what the hook sees and misses when installed into a process
        that is already serving), capitalised and ended; never raises."""
        try:
            text = " ".join(str(describe()).split())
        except Exception as exc:
            runtime.count_error(self.name, exc)
            return f"What the {self.name} hook misses when installed late could not be told ({type(exc).__name__})."
        text = text[:1].upper() + text[1:]
        return text if text.endswith(".") else text + "."

    # --- one part ----------------------------------------------------------------------------

    def _patch(self, library: Library, module: types.ModuleType) -> None:
        """The part's library was imported: check its targets and version, then patch it, all or nothing."""
        with self.lock:
            if not self.installed or library in self.done:
                return
            self.done.add(library)
            try:
                changed = [f"{target.where()} {problem}" for target in library.targets for problem in _problem(target)]
                versions = _versions(library)
                if changed:
                    self._note(NOTE_HOOK_OFF, library, versions, f"is off for {_named(library, versions)}: {'; '.join(changed)}",
                               {"changed": changed})  # fmt: skip
                    return
                outer, self._current = self._current, library  # apply may import what another part waits for
                try:
                    library.apply(module)
                finally:
                    self._current = outer
                noted = {p for n in self.notes if n.kind == NOTE_UNTESTED_VERSION for p in n.attrs.get("untested", ())}
                untested = [package for package, _, tested in versions if not tested and package not in noted]
                if untested:  # once per package, not once per part
                    lines = ", ".join(f"{t.package} {t.oldest}" + (f" to {t.newest}" if t.newest != t.oldest else "") for t in library.tested)
                    self._note(NOTE_UNTESTED_VERSION, library, versions,
                               f"patched {_named(library, versions)}, a version it is not tested on (tested: {lines})",
                               {"untested": untested})  # fmt: skip
            except Exception as exc:
                self._unpatch(library)
                runtime.count_error(self.name, exc)

    def _unpatch(self, library: Library) -> None:
        """Run the part's undo steps (errors counted) and restore its originals, latest first."""
        steps = [step for part, step in self.undo if part is library]
        self.undo = [(part, step) for part, step in self.undo if part is not library]
        for step in reversed(steps):
            try:
                step()
            except Exception as exc:
                runtime.count_error(self.name, exc)
        mine = [entry for entry in self.patched if entry[3] is library]
        self.patched = [entry for entry in self.patched if entry[3] is not library]
        for owner, name, original, _ in reversed(mine):
            try:
                setattr(owner, name, original)
            except Exception as exc:  # uninstall never raises: the others are still put back
                runtime.count_error(self.name, exc)

    def _note(self, kind: str, library: Library, versions: list[tuple[str, str, bool]], message: str, attrs: dict[str, Any]) -> None:
        record = QualityRecord(
            kind,
            runtime.now_ns(),
            runtime.pid(),
            f"hook {self.name} {message}",
            1,
            {"collector": self.name, "library": library.module, "versions": {p: v for p, v, _ in versions}, **attrs},
        )
        self.notes.append(record)
        runtime.emit(record)


def _problem(target: Target) -> list[str]:
    """What is wrong with `target` in the library as imported: [] when it is there and of its shape."""
    try:
        module = importlib.import_module(target.module)
    except Exception as exc:
        return [f"cannot be imported ({type(exc).__name__})"]
    owner: Any = getattr(module, target.owner, None) if target.owner else module
    if owner is None:
        return [f"is missing ({target.owner} is gone)"]
    value = vars(owner).get(target.attribute)
    if value is None:
        return ["is missing"]
    value = getattr(value, MARK, value)  # wrapped by another copy of the hook: judge the original
    function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    if not callable(function):
        return [f"is no longer callable (a {type(function).__name__})"]
    if target.is_async is not None:
        code = getattr(function, "__code__", None)
        is_async = code is not None and bool(code.co_flags & _CO_COROUTINE)
        if is_async != target.is_async:
            return ["is now a coroutine function" if is_async else "is no longer a coroutine function"]
    return []


def _versions(library: Library) -> list[tuple[str, str, bool]]:
    """(package, installed version, whether within its tested lines) of each tested package found."""
    out = []
    for tested in library.tested:
        version = package_version(tested.package, tested.distribution)
        if version is not None:
            out.append((tested.package, version, within(version, tested.oldest, tested.newest)))
    return out


def _named(library: Library, versions: list[tuple[str, str, bool]]) -> str:
    return ", ".join(f"{package} {version}" for package, version, _ in versions) or library.module


def package_version(package: str, distribution: str = "") -> str | None:
    """The installed version of an imported `package`: its `__version__`, else its dist-info's; None if unknown.

    Not `importlib.metadata`, whose import costs the service tens of milliseconds. The
    dist-info is looked up next to the package, by `distribution` or the package's name.
    """
    module = sys.modules.get(package)
    if module is None:
        return None
    version = vars(module).get("__version__")  # not getattr: a module __getattr__ may warn (Flask)
    if isinstance(version, str):
        return version
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path:
        return None
    site = os.path.dirname(os.path.dirname(path))
    prefix = (distribution or package).lower().replace("-", "_") + "-"
    try:
        for entry in os.listdir(site):
            if entry.endswith(".dist-info") and entry.lower().startswith(prefix):  # name-version.dist-info
                return entry[len(prefix) : -len(".dist-info")]
    except OSError:
        pass
    return None


def _numbers(version: str) -> tuple[int, ...]:
    """The leading numeric components of a version: "2.1.0rc1" -> (2, 1, 0)."""
    out = []
    for part in version.split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out)


def within(version: str, oldest: str, newest: str) -> bool:
    """Whether `version` is on a line from `oldest` to `newest`, each compared at its own precision."""
    numbers = _numbers(version)
    low, high = _numbers(oldest), _numbers(newest)
    return bool(numbers) and numbers[: len(low)] >= low and numbers[: len(high)] <= high
