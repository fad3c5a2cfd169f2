"""latprof's hook loader: `latprof run` puts this folder first on PYTHONPATH of the service.

Python imports `sitecustomize` at start-up, so every Python process the service starts
(workers, `python -m`, subprocesses) loads latprof's hooks before the service's own code.
Another `sitecustomize` that this one shadows is loaded afterwards, as it would have been.
"""

import os
import sys


def _load_hooks() -> None:
    try:
        from latprof.collectors.hooks.bootstrap import install_from_environment
    except Exception as exc:  # latprof is not installed in this interpreter's environment
        sys.stderr.write(
            f"latprof: hooks not loaded in {sys.executable}: cannot import latprof ({type(exc).__name__}: {exc});"
            " install latprof into the service's environment\n"
        )
        return
    try:
        install_from_environment()
    except Exception as exc:  # never stop the service from starting
        sys.stderr.write(f"latprof: hooks not loaded: {type(exc).__name__}: {exc}\n")


def _load_shadowed_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write(f"latprof: the service's own sitecustomize failed: {type(exc).__name__}: {exc}\n")


_load_hooks()
_load_shadowed_sitecustomize()
