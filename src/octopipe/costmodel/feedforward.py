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
    fused_casts: bool = False,
) -> None:
    """Column-parallel up (and gate), activation, row-parallel down; gated = SwiGLU/GeGLU.
    `fused_casts`: a block's dense MLP after its norm, whose FP8 casts Transformer Engine's
    LayerNormMLP fuses into the norm and the activation (not experts, nor shared experts)."""
    a = work.dtype_bytes
    w = split(width, tp)
    work.linear(
        tokens, h, (2 if gated else 1) * w, bias=bias, experts=experts, fused_cast=fused_casts
    )
    # The activation reads gate and up (or up) and writes its product; both inputs are saved.
    inputs = (2 if gated else 1) * tokens * w * a
    work.elementwise(inputs + tokens * w * a, 2 * inputs + tokens * w * a, saved_bytes=inputs)
    work.linear(
        tokens, w, h, bias=bias, experts=experts, replicated_input=False, fused_cast=fused_casts
    )


def moe(work: LayerWork, arch: Architecture, s: Settings) -> None:
    """Router, dispatch of tokens*top_k copies, grouped expert GEMMs, combine, shared experts.

    Without expert parallelism and with expert TP equal to TP (Megatron's classic expert-TP)
    every TP rank routes the gathered tokens and runs every expert on 1/TP of its width. Else
    the MoE layers fold their own grid over the stage's TP x CP x DP ranks (Megatron-Core's MoE
    parallel folding): groups of ETP x EP consecutive ranks, ETP splitting each expert's width,
    EP the experts. A rank routes its sequence-parallel share of the tokens, sends the copies
    bound for other EP ranks' experts by an all-to-all and gets as many back (dispatch), the
    ETP group all-gathers what it received, each runs its E / EP experts on 1/ETP of their
    width, and the results go back by a reduce-scatter and a second all-to-all (combine); the
    backward runs both again. The exchanges are exposed. A capacity factor pads every expert's
    input to capacity (`--moe-pad-expert-input-to-capacity`); dropless routing (the default)
    sends what the router chose, balanced over the experts on average."""
    moe, tp, t, h, a = arch.moe, s.tensor_parallel, s.tokens, arch.hidden_size, s.activation_bytes
    assert moe is not None
    ep, etp = s.expert_parallel, s.expert_tp
    if moe.num_experts % ep:
        raise InputError(
            "settings",
            f"expert-parallel degree {ep} does not divide {moe.num_experts} experts",
            "expert_parallel",
        )
    if s.moe_host_sync:  # the dispatcher's token-count sync and launch-bound routing kernels
        work.host_stall()
    work.linear(t, h, moe.num_experts, save_input=False, quantizable=False)  # shares the input
    work.elementwise(
        t * moe.num_experts * 8, t * moe.num_experts * 8, saved_bytes=t * moe.num_experts * 4
    )  # softmax/top-k in FP32
    folded = not (ep == 1 and etp == tp)
    own = t * moe.top_k / (tp if folded else 1)  # the token copies this rank routes
    padded = s.moe_capacity_factor or 1.0
    work.elementwise(2 * own * h * a, 2 * own * h * a)  # permute tokens to experts
    expert_tokens = own * padded
    if folded:  # dispatch and combine: the others' part, the network's when it crosses nodes
        peers = ep - s.ep_node_ranks if s.ep_across_nodes else ep - 1
        moved = 2 * own * padded * h * a * peers / ep
        gathered = 2 * (etp - 1) * own * padded * h * a  # ETP: all-gather, reduce-scatter
        for phase in (F, I):
            work.ep_all_to_all(phase, moved, s.ep_across_nodes)
            work.ep_all_to_all(phase, gathered, across_nodes=False)
        expert_tokens *= etp
    experts = moe.num_experts // ep
    gated = arch.gated_mlp
    width = moe.expert_intermediate_size
    mlp(work, expert_tokens, h, width, gated, etp, bias=moe.expert_bias, experts=experts)
    work.elementwise(2 * own * h * a, 2 * own * h * a)  # weighted un-permute
    if moe.shared_intermediate_size:
        mlp(work, t, h, moe.shared_intermediate_size, arch.gated_mlp, tp)
        if moe.shared_expert_gate:
            work.linear(t, h, 1, save_input=False, quantizable=False)
            work.elementwise(3 * t * h * a, 3 * t * h * a)
    work.tp_all_reduce(t, h)
