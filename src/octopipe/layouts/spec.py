"""A layout written as a short string, as people name them: `tp8,pp16,dp24,b1,v2`.

    parse_layout("tp8,pp16,dp24,b1,v2,selective,z1") -> LayoutSpec(...)

Parts, in any order, comma-separated: `tp`, `cp`, `pp`, `dp`, `ep` followed by the degree;
`b` the microbatch size; `v` the stages per device (1: 1F1B, more: interleaved 1F1B); `z0`/`z1`
the distributed optimizer (ZeRO-1), `z3` FSDP (ZeRO-3, `plan --gpus --runner torchtitan`'s);
`none`, `selective` or `full` the recomputation; `octopipe` or `megatron` the rank order
(docs/FORMATS.md, `rank_order`). Degrees left out are 1 (`dp`: the GPUs left), `b` 1, `v` 1,
`z` 0, recomputation none, the order the job's first (its runner's own). A fault is one line
naming the flag and the part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from octopipe.costmodel.settings import RECOMPUTE_KINDS
from octopipe.errors import InputError
from octopipe.plan.shape import RANK_ORDERS, JobShape

_PART = re.compile(r"(tp|cp|pp|dp|ep|b|v|z)(\d+)")


@dataclass(frozen=True)
class LayoutSpec:
    """A layout as given, before the job fills in what it leaves out."""

    layout: JobShape
    chunks: int = 1
    dp_given: bool = True
    rank_order: str | None = None  # None: the job's first
    flag: str = "--from-layout"  # where it was given, named in its faults

    @property
    def schedule(self) -> str:
        return "i1f1b" if self.chunks > 1 else "1f1b"

    def for_gpus(self, gpus: int, global_batch: int, flag: str) -> JobShape:
        """The layout on `gpus` GPUs (DP filled in), its microbatches from the batch."""
        lay = self.layout
        group = lay.tp * lay.cp * lay.pp
        dp = lay.dp if self.dp_given else gpus // group
        if group * dp != gpus:
            raise InputError(flag, f"TP x CP x PP x DP = {group * dp} GPUs, not the {gpus} given")
        per_step = dp * lay.microbatch_size
        if global_batch % per_step:
            raise InputError(
                flag,
                f"the global batch {global_batch} does not split into DP {dp} x microbatches "
                f"of {lay.microbatch_size}",
            )
        return replace(lay, dp=dp, num_microbatches=global_batch // per_step)


def parse_layout(text: str, flag: str = "--from-layout") -> LayoutSpec:
    values: dict[str, int] = {}
    recompute, order = "none", None
    for raw in text.split(","):
        part = raw.strip().lower()
        if part in RECOMPUTE_KINDS:
            recompute = part
            continue
        if part in RANK_ORDERS:
            order = part
            continue
        match = _PART.fullmatch(part)
        if match is None:
            raise InputError(
                flag,
                f"cannot read {raw.strip()!r}: expected tpN, cpN, ppN, dpN, epN, bN, vN, "
                f"z0/z1/z3, {'/'.join(RECOMPUTE_KINDS)} or {'/'.join(RANK_ORDERS)} "
                "(e.g. tp8,pp16,dp24,b1,v2)",
            )
        key, value = match.group(1), int(match.group(2))
        if key in values:
            raise InputError(flag, f"{key} is given twice")
        if value < 1 and key != "z" or key == "z" and value not in (0, 1, 3):
            raise InputError(flag, f"{part}: out of range")
        values[key] = value
    layout = JobShape(
        tp=values.get("tp", 1),
        pp=values.get("pp", 1),
        dp=values.get("dp", 1),
        microbatch_size=values.get("b", 1),
        num_microbatches=1,
        cp=values.get("cp", 1),
        recompute=recompute,
        ep=values.get("ep", 1),
        zero=values.get("z", 0),
    )
    return LayoutSpec(layout, values.get("v", 1), "dp" in values, order, flag)
