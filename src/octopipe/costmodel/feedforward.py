"""The feed-forward blocks' work on one tensor-parallel rank: a dense (gated or plain) MLP and
a mixture of experts with its router, dispatch, grouped expert GEMMs and all-to-alls. Pure
functions appending to a `LayerWork`."""

from __future__ import annotations

from octopipe.costmodel.arch import Architecture
from octopipe.costmodel.settings import Settings
from octopipe.costmodel.shards import split
from octopipe.costmodel.work import F, I, LayerWork
from octopipe.errors import InputError


def mlp(
    work: LayerWork,
    tokens: float,
    h: int,
    width: int,
    gated: bool,
    tp: int,
    *,
    bias: bool = False,
    experts: int = 1,
) -> None:
    """Column-parallel up (and gate), activation, row-parallel down; gated = SwiGLU/GeGLU."""
    a = work.dtype_bytes
    w = split(width, tp)
    work.linear(tokens, h, (2 if gated else 1) * w, bias=bias, experts=experts)
    # The activation reads gate and up (or up) and writes its product; both inputs are saved.
    inputs = (2 if gated else 1) * tokens * w * a
    work.elementwise(inputs + tokens * w * a, 2 * inputs + tokens * w * a, saved_bytes=inputs)
    work.linear(tokens, w, h, bias=bias, experts=experts, replicated_input=False)


def moe(work: LayerWork, arch: Architecture, s: Settings) -> None:
    """Router, dispatch of tokens*top_k copies, grouped expert GEMMs, combine, shared experts.
    Without expert parallelism tensor parallelism splits each expert's width (Megatron's
    expert-TP). With EP degree e the experts are spread over e ranks, each whole (expert TP
    1, Megatron-Core's choice with EP): a rank routes its sequence-parallel share of the
    tokens, sends the copies bound for other ranks' experts by an all-to-all and gets as many
    back (dispatch), runs its E / e experts on what it receives, and returns the results by a
    second all-to-all (combine); the backward runs both again. The all-to-alls are exposed."""
    moe, tp, t, h, a = arch.moe, s.tensor_parallel, s.tokens, arch.hidden_size, s.activation_bytes
    assert moe is not None
    ep = s.expert_parallel
    if moe.num_experts % ep:
        raise InputError(
            "settings",
            f"expert-parallel degree {ep} does not divide {moe.num_experts} experts",
            "expert_parallel",
        )
    work.linear(t, h, moe.num_experts, save_input=False, quantizable=False)  # shares the input
    work.elementwise(
        t * moe.num_experts * 8, t * moe.num_experts * 8, saved_bytes=t * moe.num_experts * 4
    )  # softmax/top-k in FP32
    routed = t * moe.top_k
    if ep > 1:
        routed /= tp  # each TP rank routes its sequence-parallel share
    work.elementwise(2 * routed * h * a, 2 * routed * h * a)  # permute tokens to experts
    if ep == 1:
        experts, width_split = moe.num_experts, tp
    else:
        moved = 2 * routed * h * a * (ep - 1) / ep  # dispatch and combine: the other ranks' part
        work.ep_all_to_all(F, moved, s.ep_across_nodes)
        work.ep_all_to_all(I, moved, s.ep_across_nodes)
        experts, width_split = moe.num_experts // ep, 1
    gated = arch.gated_mlp
    mlp(work, routed, h, moe.expert_intermediate_size, gated, width_split, experts=experts)
    work.elementwise(2 * routed * h * a, 2 * routed * h * a)  # weighted un-permute
    if moe.shared_intermediate_size:
        mlp(work, t, h, moe.shared_intermediate_size, arch.gated_mlp, tp)
        if moe.shared_expert_gate:
            work.linear(t, h, 1, save_input=False, quantizable=False)
            work.elementwise(3 * t * h * a, 3 * t * h * a)
    work.tp_all_reduce(t, h)
