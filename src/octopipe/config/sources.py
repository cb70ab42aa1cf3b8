"""Where a job config comes from: a job file, `run`'s flags, `octopipe.run`'s keywords, each
over the one before (defaults < job file < flags or keywords), all read off `job.py`'s fields.

    config = from_file("job.toml")                          # [section] name = value
    config = with_values(config, {"training.steps": 10})    # dotted keys, checked
    add_flags(parser); config = from_flags(args, base)      # only the flags given override
    config = from_keywords(base, steps=10, lr=3e-4)         # octopipe.run's sugar
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from octopipe.config.job import SECTIONS, JobConfig, all_settings
from octopipe.errors import InputError

CONFIG_FLAG = "--config"


def with_values(config: JobConfig, values: Mapping[str, Any], where: Any = None) -> JobConfig:
    """`config` with `values` ({"section.name": value}) set, each checked against its setting;
    `where(setting)` names the source in an error (default: the setting's flag or key)."""
    by_key = {s.key: s for s in all_settings()}
    changed: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        s = by_key[key]
        changed.setdefault(s.section, {})[s.name] = s.check(value, where(s) if where else None)
    return dataclasses.replace(
        config,
        **{
            section: dataclasses.replace(getattr(config, section), **names)
            for section, names in changed.items()
        },
    )


def from_file(path: str | Path, base: JobConfig | None = None) -> JobConfig:
    """The job file `path` (TOML: `[section]` tables of `name = value`) over `base`; an unknown
    section or key, or a value of the wrong type or range, is refused in one line naming the
    file and the key."""
    import tomllib

    from octopipe.limits import MAX_INPUT_FILE_BYTES
    from octopipe.outfiles import unreadable_input

    where = str(path)
    fault = unreadable_input(path)
    if fault is not None:
        raise InputError(CONFIG_FLAG, f"{where} {fault}: expected a TOML job file")
    if Path(path).stat().st_size > MAX_INPUT_FILE_BYTES:
        raise InputError(where, f"larger than {MAX_INPUT_FILE_BYTES:,} bytes: not a job file")
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(where, "not UTF-8 text: not a TOML job file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(where, f"not a TOML job file: {exc}") from None
    except RecursionError:  # arrays or inline tables nested thousands deep
        raise InputError(where, "nested too deeply: not a job file") from None
    by_key = {s.key: s for s in all_settings()}
    values = {}
    for section, table in document.items():
        if section not in SECTIONS:
            raise InputError(
                where, f"unknown section [{section}]; sections: {', '.join(SECTIONS)}", section
            )
        if not isinstance(table, dict):
            raise InputError(where, f"expected a [{section}] table, got {table!r}", section)
        for name, value in table.items():
            key = f"{section}.{name}"
            if key not in by_key:
                known = ", ".join(s.name for s in by_key.values() if s.section == section)
                raise InputError(where, f"unknown key; [{section}] takes: {known}", key)
            values[key] = value
    return with_values(base or JobConfig(), values, lambda s: f"{where}: {s.key}")


GIVEN = "_settings_given"  # the namespace attribute holding the keys of the flags given


class _Store(argparse.Action):
    """argparse's store, noting that the flag was given: a flag equal to its default still
    overrides the job file."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        if getattr(namespace, GIVEN, None) is None:
            setattr(namespace, GIVEN, set())
        getattr(namespace, GIVEN).add(self.dest)


class _StoreTrue(_Store):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, True, option_string)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every setting that has a flag, as an argparse option (its default shown in the help)
    whose value overrides the job file only when given."""
    from octopipe.config.flags import add_setting_flag

    parser.add_argument(
        CONFIG_FLAG,
        metavar="JOB.toml",
        help="a job file of these settings ([section] name = value, docs/FORMATS.md); flags "
        "given beside it override it",
    )
    parser.set_defaults(**{GIVEN: None})
    for s in all_settings():
        if s.spec.flag is not None:
            store = _StoreTrue if s.kind is bool else _Store
            add_setting_flag(parser, s, dest=s.key, action=store)


def from_flags(args: argparse.Namespace) -> JobConfig:
    """The job file `--config` names (if any), with every flag given on top."""
    path = getattr(args, CONFIG_FLAG.lstrip("-"), None)
    config = JobConfig() if path is None else from_file(path)
    given = getattr(args, GIVEN, None) or set()
    return with_values(config, {key: vars(args)[key] for key in given})


def from_keywords(base: JobConfig, **keywords: Any) -> JobConfig:
    """`base` with `octopipe.run`'s keyword sugar applied (`steps=10`, `lr=3e-4`,
    `checkpoint_dir=...`): each keyword is one setting's (docs/FORMATS.md's table)."""
    by_keyword = {s.keyword: s for s in all_settings()}
    unknown = sorted(set(keywords) - set(by_keyword))
    if unknown:
        raise TypeError(f"run() got unexpected keyword argument(s) {', '.join(unknown)}")
    values = {by_keyword[k].key: _path_text(v) for k, v in keywords.items()}
    return with_values(base, values)


def keywords() -> list[str]:
    """The keywords `octopipe.run` takes as settings."""
    return [s.keyword for s in all_settings()]


def _path_text(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value
