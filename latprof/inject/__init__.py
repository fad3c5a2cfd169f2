"""`latprof attach --inject`: load latprof's hooks into a running Python process for a while.

- `target`: what the process is (its Python, its workers, its user) and where the functions
  the injection calls live in its memory (`elf` reads them from the mapped files).
- `mechanism`: how code gets in (`Injector`; gdb in batch mode for CPython 3.10-3.13).
- `payload`: the private directory, the code the target runs, and what it reports back.
- `session`: one injection of every worker, the recording, the detach and the capture.

The code that runs inside the target is `latprof.collectors.hooks.injected`.
"""
