"""Expert parallelism: the routed experts of each MoE layer divided over an EP group, tokens
sent to their experts' ranks by all-to-all and their results brought back the same way.

The shape is Megatron-Core's token dispatcher: `TokenDispatcher` is one object over the group
the mesh hands it, with the verbs of its job: permute (the rank's (token, slot) pairs grouped
by expert), dispatch (an all-to-all of the counts, then of the tokens), the local experts (each
on the tokens it got, from every rank), combine (the reverse all-to-all) and unpermute (each
result weighted by its router weight and added to its token). Dropless: every routed token is
computed. The same layer runs at EP 1 (no group: the rank's own experts are all of them).

gloo runs `all_to_all_single` with uneven splits on CPU (torch 2.13), so the dispatch is that
collective, wrapped in an autograd function whose backward is the reverse all-to-all.

`apply_ep(part, experts)` makes a stage's MoE layers use it, on the meta device, before
allocation:
- our bundled `MoE` (experts as a `ModuleList`): the other ranks' experts are removed (the
  others keep their FQNs, `experts.<e>`), so a rank allocates only its own;
- transformers' fused 3-D expert weights (`gate_up_proj` [E, 2I, h], `down_proj` [E, h, I]:
  Qwen2-MoE, Qwen3-MoE, Mixtral): each becomes a DTensor cut by expert index (`Shard(0)`) over
  the EP group, and the experts module runs through the dispatcher on its local slices.
Either way a checkpoint keeps every expert under its FQN, whole, and resumes at any EP.
Routers stay whole; the EP group's ranks route their own tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from octopipe.errors import InputError

# Set on a module whose parameters are routed experts divided over the EP group.
EXPERTS_MARK = "_octopipe_expert_parallel"
# Set on a module replicated over the TP group that sees each rank's own tokens under EP (a
# router, a shared expert's gate): its gradients are summed over the TP group.
TP_SUMMED_MARK = "_octopipe_tp_summed"

RunExpert = Callable[[int, torch.Tensor], torch.Tensor]  # (global expert index, tokens) -> out


@dataclass(frozen=True)
class ExpertGroup:
    """This rank's EP group: `size` ranks, this one the `rank`-th, holding experts
    `[rank * E / size, (rank + 1) * E / size)` of each MoE layer."""

    size: int
    rank: int
    group: dist.ProcessGroup | None  # None at EP 1
    mesh: DeviceMesh | None = None  # the group as a 1-D mesh (fused expert weights' DTensors)

    def local_experts(self, num_experts: int) -> range:
        per = num_experts // self.size
        return range(self.rank * per, (self.rank + 1) * per)


class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` with uneven splits; its backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):  # type: ignore[override]
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class TokenDispatcher:
    """Routed experts of one MoE layer over an EP group: `(tokens, chosen, weights)` (the
    rank's tokens [N, h], their top-k experts [N, k] and router weights [N, k]) -> the
    weighted sum of their experts' outputs [N, h], as the layer's own loop computes it."""

    def __init__(self, experts: ExpertGroup, num_experts: int, run_expert: RunExpert) -> None:
        self.ep, self.num_experts, self.run_expert = experts, num_experts, run_expert
        self.local = experts.local_experts(num_experts)

    def __call__(
        self, tokens: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        token_of, order, permuted, counts = self.permute(tokens, chosen)
        received, sent, got, per_source = self.dispatch(permuted, counts)
        results = self.run_local(received, per_source)
        returned = self.combine(results, sent, got)
        return self.unpermute(tokens, returned, token_of, weights.reshape(-1)[order])

    def permute(self, tokens: torch.Tensor, chosen: torch.Tensor):
        """The (token, slot) pairs in expert order: which token each is, the order, the
        tokens so ordered, and how many go to each expert."""
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        token_of = order // chosen.shape[-1]
        counts = torch.bincount(flat, minlength=self.num_experts)
        return token_of, order, tokens[token_of], counts

    def dispatch(self, permuted: torch.Tensor, counts: torch.Tensor):
        """Send each rank the tokens of its experts; what came back, from each source rank
        its tokens per local expert ([sources, local experts] counts)."""
        size, per = self.ep.size, len(self.local)
        if self.ep.group is None:
            return permuted, [len(permuted)], [len(permuted)], counts.view(1, per)
        per_source = torch.empty_like(counts)
        dist.all_to_all_single(per_source, counts, group=self.ep.group)
        per_source = per_source.view(size, per)
        sent = counts.view(size, per).sum(1).tolist()
        got = per_source.sum(1).tolist()
        return _AllToAll.apply(permuted, got, sent, self.ep.group), sent, got, per_source

    def run_local(self, received: torch.Tensor, per_source: torch.Tensor) -> torch.Tensor:
        """Each local expert on every token sent to it (from all sources at once); the
        results in the order the tokens arrived."""
        sources, per = per_source.shape
        expert_of_row = torch.arange(per).repeat(sources).repeat_interleave(per_source.flatten())
        regroup = expert_of_row.argsort(stable=True)
        sizes = per_source.sum(0).tolist()
        outputs = [
            self.run_expert(self.local[j], chunk) if len(chunk) else chunk
            for j, chunk in enumerate(received[regroup].split(sizes))
        ]
        results = torch.cat(outputs) if outputs else received
        return results[regroup.argsort()]

    def combine(self, results: torch.Tensor, sent: list[int], got: list[int]) -> torch.Tensor:
        """The results back to the ranks their tokens came from."""
        if self.ep.group is None:
            return results
        return _AllToAll.apply(results, sent, got, self.ep.group)

    @staticmethod
    def unpermute(tokens, returned, token_of, weights) -> torch.Tensor:
        """Each result times its router weight, added to its token."""
        # under autocast the experts answer in BF16 to FP32 tokens: summed in the tokens' dtype
        back = (returned * weights[:, None]).to(tokens.dtype)
        return torch.zeros_like(tokens).index_add(0, token_of, back)


def apply_ep(part: nn.Module, experts: ExpertGroup) -> None:
    """Divide the routed experts of every MoE layer of a (pruned, meta) model over the EP
    group; refuse, in one line, an expert count the degree does not divide. The layers'
    routers (and Qwen's shared-expert gates) are marked: under TP each rank routes its own
    share of the sequence, so their gradients are summed over the TP group."""
    from octopipe.models.feedforward import MoE

    for fqn, block in part.named_modules():
        inner = getattr(block, "experts", None)
        if isinstance(block, MoE):
            _bundled(fqn, block, experts)
        elif isinstance(inner, nn.Module) and _is_fused(inner):
            _fused(f"{fqn}.experts", inner, experts)
        else:
            continue
        for name in ROUTERS:
            router = getattr(block, name, None)
            if isinstance(router, nn.Module):
                setattr(router, TP_SUMMED_MARK, True)


ROUTERS = ("router", "gate", "shared_gate", "shared_expert_gate")  # by family


def _check_count(fqn: str, experts: int, ep: int) -> None:
    if experts % ep:
        raise InputError("--ep", f"{fqn} has {experts} experts; {ep} must divide them")


def _bundled(fqn: str, moe: nn.Module, experts: ExpertGroup) -> None:
    count = len(moe.experts)
    _check_count(fqn, count, experts.size)
    mine = experts.local_experts(count)
    for e in range(count):
        if e not in mine:
            del moe.experts._modules[str(e)]  # the others keep their keys, hence FQNs
    table = moe.experts._modules
    moe.route_experts = TokenDispatcher(experts, count, lambda e, x: table[str(e)](x))
    setattr(moe.experts, EXPERTS_MARK, True)


def _is_fused(module: nn.Module) -> bool:
    up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return isinstance(up, nn.Parameter) and isinstance(down, nn.Parameter) and up.dim() == 3


def _fused(fqn: str, module: nn.Module, experts: ExpertGroup) -> None:
    count = module.gate_up_proj.shape[0]
    _check_count(fqn, count, experts.size)
    if experts.size > 1:
        assert experts.mesh is not None, "an EP group of more than one rank has a mesh"
        for name in ("gate_up_proj", "down_proj"):
            p = getattr(module, name)
            cut = distribute_tensor(p.detach(), experts.mesh, [Shard(0)], src_data_rank=None)
            setattr(module, name, nn.Parameter(cut, p.requires_grad))
    first = experts.local_experts(count).start
    act = module.act_fn

    def run_expert(e: int, x: torch.Tensor) -> torch.Tensor:
        gate_up, down = _local(module.gate_up_proj)[e - first], _local(module.down_proj)[e - first]
        gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
        return F.linear(act(gate) * up, down)

    dispatcher = TokenDispatcher(experts, count, run_expert)
    module.forward = lambda hidden, index, weights: dispatcher(hidden, index, weights)
    setattr(module, EXPERTS_MARK, True)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def expert_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The routed experts' parameters of a module that `apply_ep` divided."""
    return [p for m in module.modules() if getattr(m, EXPERTS_MARK, False) for p in m.parameters()]


def tp_summed_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters replicated over the TP group whose gradients each rank computed on its own
    tokens (routers under EP): summed over the group after the stage's last backward."""
    return [
        p for m in module.modules() if getattr(m, TP_SUMMED_MARK, False) for p in m.parameters()
    ]
