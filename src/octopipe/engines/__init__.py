"""One home per engine a plan is for (`--runner`), each answering the same four verbs
(`base.Engine`: refuse, price, write, launch):

- `octopipe.py`: OctoPipe's own executor (`octopipe run`);
- `torchtitan/`: torchtitan 0.3 (`octopipe_torchtitan.py`) and 0.2 (`torchtitan.toml`);
- `megatron/`: Megatron-LM (`megatron_args.sh`).

`answer.py` is what they are handed. This module is the one place an engine is looked up by
its name: everything else asks the engine object. Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path

from octopipe.engines.answer import Answer, Exports, planned_shape
from octopipe.engines.base import Engine, Refusal
from octopipe.engines.megatron import MegatronEngine
from octopipe.engines.octopipe import OctoPipeEngine
from octopipe.engines.torchtitan import TorchtitanEngine
from octopipe.errors import InputError

_ENGINES: dict[str, Engine] = {
    e.name: e for e in (OctoPipeEngine(), TorchtitanEngine(), MegatronEngine())
}
ENGINES = tuple(_ENGINES)
DEFAULT_ENGINE = "octopipe"
# Which export flag is whose (`accepts`): an answer takes another engine's only where its own
# engine accepts that one.
EXPORT_FLAGS = {
    "torchtitan": "torchtitan",
    "torchtitan_config": "torchtitan",
    "torchtitan_assets": "torchtitan",
    "torchtitan_data": "torchtitan",
    "megatron": "megatron",
}


def get_engine(name: str | None = None) -> Engine:
    """The engine `--runner` names (None: OctoPipe's own)."""
    name = DEFAULT_ENGINE if name is None else name
    if name not in _ENGINES:
        raise InputError("--runner", f"expected one of {', '.join(ENGINES)}, got {name!r}")
    return _ENGINES[name]


def check_exports(engine: Engine, given: dict[str, object]) -> None:
    """An export for another engine than the answer's is refused in one line: the plan was
    searched for `engine` and would reach the other as something it was not priced as.
    `given`: the export flags' values by name (`EXPORT_FLAGS`)."""
    for flag, value in given.items():
        other = _ENGINES[EXPORT_FLAGS[flag]]
        if value and other.name != engine.name and other.name not in engine.accepts:
            raise InputError(
                f"--{flag.replace('_', '-')}",
                f"is for {other.title}, but --runner {engine.name} plans for {engine.title}; "
                f"drop one (or plan with --runner {other.name})",
            )


def exporting(engine: Engine, exports: Exports) -> list[Engine]:
    """The engines an answer for `engine` writes for: its own, its companions, and Megatron-LM
    where `--megatron` asks for it."""
    names = [engine.name, *engine.companions]
    if exports.megatron and "megatron" not in names:
        names.append("megatron")
    return [_ENGINES[n] for n in names]


def write_exports(engine: Engine, answer: Answer, out: Path) -> tuple[list[str], list[str]]:
    """Every export of `answer` into `out` (beside its plan.json and schedule.csv): the files
    written and the lines that say how to launch them, engine by engine."""
    files: list[str] = []
    lines: list[str] = []
    for each in exporting(engine, answer.exports):
        files += each.write(answer, out)
        lines += each.launch(answer, out)
    return files, lines


__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "Answer",
    "Engine",
    "Exports",
    "Refusal",
    "check_exports",
    "exporting",
    "get_engine",
    "planned_shape",
    "write_exports",
]
