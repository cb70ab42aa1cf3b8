"""The schedule notation: action kinds, actions, composite entries, and timed events.

An action is `{stage}{kind}{microbatch}` as `torch.distributed.pipelining` writes it (`0F3`,
`2I0`). torch's DualPipeV also writes composite entries, `(0F7;7B3)OVERLAP_F_B`: one schedule
entry holding several actions that a runtime may overlap; here an entry is its parts in order.
`Kind` is the one encoding of a kind: a letter (it compares equal to the string) with a `code`
that indexes per-kind tables (F 0, I 1, W 2, B 3). This module knows no costs and no plans.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple


class Kind(StrEnum):
    """What an action computes; `code` indexes per-kind tables."""

    F = "F", 0  # forward
    I = "I", 1  # backward for the input
    W = "W", 2  # backward for the weights
    B = "B", 3  # full backward: I and W in one action

    def __new__(cls, letter: str, code: int):
        member = str.__new__(cls, letter)
        member._value_ = letter
        member.code = code
        return member

    code: int


F, I, W, B = Kind.F, Kind.I, Kind.W, Kind.B  # the notation's letters
KINDS = tuple(Kind)  # in code order: KINDS[k.code] is k
# The codes as plain ints, for inner loops that index per-kind tables.
F_CODE, I_CODE, W_CODE, B_CODE = (k.code for k in (Kind.F, Kind.I, Kind.W, Kind.B))
KIND_NAMES = {
    Kind.F: "forward",
    Kind.B: "backward",
    Kind.I: "backward (input)",
    Kind.W: "backward (weight)",
}
NUM_KINDS = len(KINDS)
_ACTION = re.compile(r"^(\d+)([FBIW])(\d+)$", re.ASCII)  # ASCII: "٣F0" is no action
OVERLAP_F_B = "OVERLAP_F_B"
_COMPOSITE = re.compile(r"^\((.*)\)([A-Z_]+)$")


class Action(NamedTuple):
    """One compute action in `torch.distributed.pipelining` notation: `{stage}{kind}{mb}`."""

    stage: int
    kind: Kind
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    @staticmethod
    def parse(text: str) -> Action:
        m = _ACTION.match(text.strip())
        if not m:
            raise ValueError(
                f"bad action {text!r}, expected e.g. '0F3' (stage, F|B|I|W, microbatch)"
            )
        return Action(int(m.group(1)), Kind(m.group(2)), int(m.group(3)))


def parse_entry(text: str) -> tuple[Action, ...]:
    """The actions of one schedule entry: a plain action, or torch's composite
    `(a;b)OVERLAP_F_B` as its parts in order."""
    text = text.strip()
    m = _COMPOSITE.match(text)
    if m is None:
        return (Action.parse(text),)
    if m.group(2) != OVERLAP_F_B:
        raise ValueError(f"unknown composite {m.group(2)!r} in {text!r}, expected {OVERLAP_F_B}")
    parts = tuple(Action.parse(p) for p in m.group(1).split(";") if p.strip())
    if len(parts) < 2:
        raise ValueError(f"composite {text!r} needs at least two actions")
    return parts


def format_entry(parts: tuple[Action, ...]) -> str:
    """The inverse of `parse_entry`."""
    if len(parts) == 1:
        return str(parts[0])
    return f"({';'.join(str(a) for a in parts)}){OVERLAP_F_B}"


@dataclass(frozen=True)
class Event:
    """One action as simulated (or measured): device, action, start and end seconds."""

    device: int
    action: Action
    start: float
    end: float
