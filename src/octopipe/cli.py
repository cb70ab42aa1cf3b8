"""The `octopipe` command: discovers one subcommand per module in `octopipe.commands`.

Each command module defines `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`, and
imports at its top only what building the parser needs (no torch, no matplotlib): `--help` and
the light commands start fast. Here only dispatch, the help layout (every default shown) and the
one-line error contract live: a user's fault (OctoPipeError)
prints one line and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import sys
import warnings

from octopipe import commands
from octopipe.errors import OctoPipeError, OctoPipeWarning


class _DefaultsShown(argparse.HelpFormatter):
    """Every option's help ends with "(default: X)", unless the text already says its default
    in parentheses or there is none to show (a flag, or an option whose absence means
    something)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or not action.option_strings
            or "(default" in text
        ):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse, with the one-line error contract: a bad flag is one line and exit 2 (the
    usage stays behind --help), and no flag is taken for an abbreviation of another
    (`--device 2` is not `--devices 2`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {shortened(message)} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or only the subcommand `only` names (a command's own run need
    not import every other command's modules: `run` reaches its ranks' start sooner)."""
    parser = _Parser(
        prog="octopipe",
        description="Plan, simulate and run pipeline-parallel training.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in [only] if only else _command_modules():
        module = importlib.import_module(f"{commands.__name__}.{name}")
        cmd = sub.add_parser(
            module.NAME, help=module.HELP, description=module.HELP, formatter_class=_DefaultsShown
        )
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def _command_modules() -> list[str]:
    """Every command's module name (a module whose name starts with `_` helps one)."""
    found = pkgutil.iter_modules(commands.__path__)
    return sorted(m.name for m in found if not m.name.startswith("_"))


def _named_command(argv: list[str]) -> str | None:
    """The module of the command `argv` starts with, if it names one exactly."""
    if not argv or argv[0].startswith("-"):
        return None
    name = argv[0].replace("-", "_")
    if argv[0] != name.replace("_", "-") or name not in _command_modules():
        return None
    return name


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=_named_command(argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad flag (its one line is out) or --help: the exit code
        return int(exc.code or 0)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warnings(args.command, warnings.showwarning)
            return int(args._run(args) or 0)
    except OctoPipeError as exc:
        print(f"octopipe {args.command}: error: {shortened(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file the command reads or writes: name it, no traceback
        where = shortened(str(exc.filename or "file"))
        print(f"octopipe {args.command}: error: {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


_LONGEST_WORD = 200  # characters of one name or path an error line repeats whole


def shortened(message: str) -> str:
    """`message` with every word (a name, a path) longer than `_LONGEST_WORD` cut to its start
    and its length: a pasted megabyte is named, not echoed."""
    if len(message) <= _LONGEST_WORD:
        return message

    def cut(word: str) -> str:
        if len(word) <= _LONGEST_WORD:
            return word
        end = word[-1] if word[-1] in ":,;" else ""  # "NAME:" keeps its colon
        return f"{word[:60]}... ({len(word) - len(end):,} characters){end}"

    return " ".join(cut(w) for w in message.split(" "))


def entry() -> None:
    """The `octopipe` command (and `python -m octopipe`): `main`, then exit with its code. A
    command that loaded torch leaves without the interpreter's teardown, its output flushed
    (every file it wrote is closed by then): tearing torch's modules down took 2.6-3.7 s after
    the last line (BENCHMARKS.md, "Start-up of a 2-rank run"), as the ranks already skip it."""
    code = main()
    if "torch" in sys.modules:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):  # a reader gone (`| head`) changes nothing
                stream.flush()
        os._exit(code)
    sys.exit(code)


def _one_line_warnings(command: str, default):
    """OctoPipe's warnings as one line each (`octopipe run: warning: ...`), once per job: under
    torchrun only global rank 0 prints them. Other warnings keep Python's format."""

    def show(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, OctoPipeWarning):
            return default(message, category, filename, lineno, file, line)
        if os.environ.get("RANK", "0") == "0":
            print(f"octopipe {command}: warning: {message}", file=sys.stderr)

    return show


if __name__ == "__main__":
    entry()
