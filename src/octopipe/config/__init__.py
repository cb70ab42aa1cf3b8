"""The typed job config of `octopipe run`: every setting spelled once (`job`), as frozen
dataclasses by section, from which come `run`'s flags, the `--config` job file's keys,
`octopipe.run`'s keywords (`sources`) and the settings table of docs/FORMATS.md (`docs`).
Stdlib only, no torch: the CLI builds its parser from it on every start.
"""

from octopipe.config.job import JobConfig

__all__ = ["JobConfig"]
