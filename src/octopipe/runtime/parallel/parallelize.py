"""How a rank shards the stages it builds: attention over the CP group, experts over the EP
group, tensor parallelism, then FSDP2 (torchtitan's order).

`parallelizer` returns the function `recipe.stage` applies to each pruned stage on the meta
device, before any weight is allocated; None when the job needs neither.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from octopipe.runtime.parallel.context import apply_cp
from octopipe.runtime.parallel.experts import apply_ep
from octopipe.runtime.parallel.fsdp import apply_fsdp
from octopipe.runtime.parallel.mesh import JobMesh
from octopipe.runtime.parallel.tensor_parallel import TensorParallelPlan, apply_tp


def parallelizer(
    mesh: JobMesh, tp_plan: TensorParallelPlan | None, zero: int
) -> Callable[[nn.Module], None] | None:
    """Apply `tp_plan` to a stage's model (`stage.part`, whose FQNs are the whole model's) over
    the mesh's TP dimension (when TP > 1), then, with `zero == 3`, make the stage module
    itself, whose forward runs the stage, an FSDP2 unit over the DP dimension."""
    tensor_parallel = mesh.layout.tp > 1
    if not tensor_parallel and zero != 3 and mesh.experts is None and mesh.context is None:
        return None
    assert tp_plan is not None or not tensor_parallel, "refused before start: no TP plan"

    def shard(stage: nn.Module) -> None:
        if mesh.context is not None:
            apply_cp(stage.part, mesh.context)
        if mesh.experts is not None:  # first: the TP plan leaves routed experts alone
            apply_ep(stage.part, mesh.experts)
        if tensor_parallel:
            assert mesh.mesh is not None, "a rank past the job builds no stage"
            apply_tp(stage.part, mesh.tp_mesh, tp_plan)
        if zero == 3:
            assert mesh.mesh is not None, "a rank past the job builds no stage"
            apply_fsdp(stage, mesh.dp_mesh)

    return shard
