"""The tensor-parallel plans of the model families OctoPipe knows: FQN -> torch parallel style.

Megatron's split, as torchtitan writes it for Llama: attention heads and MLP widths column-wise
then row-wise, the vocabulary of the embedding and the head row-/column-wise, the norms on the
rank's share of the sequence (sequence parallelism), so that between layers every rank holds
1/T of the sequence (`tensor_parallel`'s conventions). Mixture-of-experts blocks run on the
gathered sequence: the router is replicated, so every rank routes every token alike; experts
held as linear layers (ours) and shared experts are split by width like an MLP; Hugging Face's
fused 3-D expert weights (Mixtral, Qwen-MoE) stay replicated. Under expert parallelism
(`experts`) a MoE block runs on the rank's own tokens instead: routed experts divided over the
EP group, the router replicated, the shared expert split by width (`moe_on_own_tokens`).

- `bundled_plan`: our own models (`octopipe.models`): GQA attention with its options (biases,
  per-head q/k norms, Gemma's post-norms and soft-caps), gated and plain MLPs, MoE blocks.
  Mamba mixers, latent attention (MLA), vision and cross-attention layers have no plan yet.
- `hf_plan`: Hugging Face causal LMs of the Llama structure (Llama, Qwen2/3, Mistral, and
  Qwen2-MoE, Qwen3-MoE, Mixtral: routed experts replicated, shared experts split).
(A model's own `tp_plan`, docs/FORMATS.md, is read by `runtime.model.recipe`.)

A plan that cannot apply (heads not divisible by the degree, a layer with no plan) is refused
in one line before any rank starts.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
)

from octopipe.errors import InputError

Plan = dict[str, ParallelStyle]  # FQN pattern -> style, as `tensor_parallel.apply_tp` takes
PlanOf = Callable[[int], Plan]  # the TP degree -> the plan (raises InputError to refuse it)


# --- the styles every family uses ---------------------------------------------------------------


def vocab_embedding() -> ParallelStyle:
    """Rows of the table split; token ids in whole, the output's sequence split."""
    return RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))


def vocab_head() -> ParallelStyle:
    """Logits split over the vocabulary, left a DTensor for the parallel loss."""
    return ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)


def sequence_norm(dim: int = 1) -> ParallelStyle:
    """A norm on the rank's share of dimension `dim` (the sequence; the heads for q/k norms)."""
    return SequenceParallel(sequence_dim=dim, use_local_output=True)


def gather_sequence() -> ParallelStyle:
    """A block's input gathered over the sequence (its column-wise linears share it)."""
    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))


def scatter_sequence() -> ParallelStyle:
    """A row-wise linear whose partial sums are reduce-scattered over the sequence."""
    return RowwiseParallel(output_layouts=Shard(1))


def gathered_block() -> ParallelStyle:
    """A block that runs on the whole sequence as plain tensors: gathered in, the rank's share
    kept out (what it computes inside is replicated unless its own entries split it)."""
    return PrepareModuleInputOutput(
        input_layouts=(Shard(1),),
        desired_input_layouts=(Replicate(),),
        use_local_input=True,
        output_layouts=(Replicate(),),
        desired_output_layouts=(Shard(1),),
        use_local_output=True,
    )


def moe_block(
    prefix: str, experts: str | None, shared: str | None, ups: tuple[str, ...], down: str
) -> Plan:
    """A mixture of experts on the gathered sequence: the router replicated (every rank routes
    every token alike), each expert's MLP (and the shared expert's) split by width, its output
    all-reduced, one collective per expert called (a grouped reduction is not built)."""
    plan: Plan = {prefix: gathered_block()}
    for mlp in (m for m in (experts, shared) if m is not None):
        plan.update({f"{prefix}.{mlp}.{up}": ColwiseParallel() for up in ups})
        plan[f"{prefix}.{mlp}.{down}"] = RowwiseParallel()
    return plan


def moe_on_own_tokens(prefix: str, shared: str | None, ups: tuple[str, ...], down: str) -> Plan:
    """A mixture of experts under expert parallelism: on the rank's own share of the sequence
    (its tokens are its to route; `parallel.experts` sends them to their experts' ranks), the
    router replicated with its gradient summed over the group. Only the shared expert is split
    by width, on the tokens gathered for it (flattened: dimension 0) and scattered back."""
    if shared is None:
        return {}
    at = f"{prefix}.{shared}"
    return {
        at: PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),)),
        **{f"{at}.{up}": ColwiseParallel() for up in ups},
        f"{at}.{down}": RowwiseParallel(output_layouts=Shard(0)),
    }


def split_mlp(prefix: str, ups: tuple[str, ...], down: str) -> Plan:
    return {
        prefix: gather_sequence(),
        **{f"{prefix}.{up}": ColwiseParallel() for up in ups},
        f"{prefix}.{down}": scatter_sequence(),
    }


def check_heads(what: str, heads: int, kv_heads: int, tp: int) -> None:
    if heads % tp or kv_heads % tp:
        raise InputError(
            "--tp",
            f"{what} has {heads} attention heads and {kv_heads} key/value heads; "
            f"tensor parallelism splits both, so {tp} must divide them",
        )


# --- our bundled models -------------------------------------------------------------------------


def bundled_plan(model: nn.Module, tp: int, expert_parallel: bool = False) -> Plan:
    """The plan of an `octopipe.models.ArchModel`, layer by layer."""
    from octopipe.models.layers import FinalNorm, OutputHead, TextLayer, TokenEmbedding

    plan: Plan = {}
    for fqn in model.pipeline_layers:
        layer = model.get_submodule(fqn)
        if isinstance(layer, TokenEmbedding):
            plan[f"{fqn}.embed"] = vocab_embedding()
        elif isinstance(layer, FinalNorm):
            plan[f"{fqn}.norm"] = sequence_norm()
        elif isinstance(layer, OutputHead):
            plan[f"{fqn}.proj"] = vocab_head()
        elif isinstance(layer, TextLayer):
            plan.update(_text_layer(fqn, layer, tp, expert_parallel))
        else:
            raise _no_plan(fqn, layer)
    return plan


def _text_layer(fqn: str, layer: nn.Module, tp: int, expert_parallel: bool) -> Plan:
    from octopipe.models.attention import RMSNorm, SelfAttention
    from octopipe.models.feedforward import MLP, GatedMLP, MoE

    plan: Plan = {}
    for norm in ("mixer_norm", "ffn_norm", "mixer_post_norm", "ffn_post_norm"):
        if isinstance(getattr(layer, norm), RMSNorm):
            plan[f"{fqn}.{norm}"] = sequence_norm()
    mixer, ffn = layer.mixer, layer.ffn
    if mixer is not None:
        if not isinstance(mixer, SelfAttention):
            raise _no_plan(f"{fqn}.mixer", mixer)
        check_heads(fqn, mixer.n_heads, mixer.n_kv_heads, tp)
        at = f"{fqn}.mixer"
        plan[at] = gather_sequence()
        plan.update({f"{at}.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")})
        plan[f"{at}.wo"] = scatter_sequence()
        for norm in ("q_norm", "k_norm"):  # per head: on the rank's heads, dimension 1
            if isinstance(getattr(mixer, norm), RMSNorm):
                plan[f"{at}.{norm}"] = sequence_norm(dim=1)
    if isinstance(ffn, GatedMLP):
        plan.update(split_mlp(f"{fqn}.ffn", ("w_gate", "w_up"), "w_down"))
    elif isinstance(ffn, MLP):
        plan.update(split_mlp(f"{fqn}.ffn", ("fc1",), "fc2"))
    elif isinstance(ffn, MoE) and expert_parallel:
        shared = "shared" if ffn.shared else None
        plan.update(moe_on_own_tokens(f"{fqn}.ffn", shared, ("w_gate", "w_up"), "w_down"))
    elif isinstance(ffn, MoE):
        plan.update(
            moe_block(
                f"{fqn}.ffn",
                "experts.*",
                "shared" if ffn.shared else None,
                ("w_gate", "w_up"),
                "w_down",
            )
        )
    elif ffn is not None:
        raise _no_plan(f"{fqn}.ffn", ffn)
    return plan


def _no_plan(fqn: str, module: nn.Module) -> InputError:
    return InputError(
        "--tp",
        f"{fqn} ({type(module).__name__}) has no tensor-parallel plan yet; run it with --tp 1",
    )


# --- Hugging Face causal LMs --------------------------------------------------------------------


def hf_plan(model: nn.Module, tp: int, expert_parallel: bool = False) -> Plan:
    """The plan of a transformers causal LM of the Llama structure, decoder layer by layer."""
    config = model.config
    heads = config.num_attention_heads
    check_heads(type(model).__name__, heads, getattr(config, "num_key_value_heads", heads), tp)
    plan: Plan = {
        "model.embed_tokens": vocab_embedding(),
        "model.norm": sequence_norm(),
        "lm_head": vocab_head(),
    }
    for index, layer in model.model.layers.named_children():
        at = f"model.layers.{index}"
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not _has(attn, "q_proj", "k_proj", "v_proj", "o_proj") or mlp is None:
            raise _no_plan(at, layer)
        plan[f"{at}.input_layernorm"] = sequence_norm()
        plan[f"{at}.post_attention_layernorm"] = sequence_norm()
        # Decoder layers hand the attention its hidden states by keyword.
        plan[f"{at}.self_attn"] = PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
        )
        plan.update(
            {f"{at}.self_attn.{w}": ColwiseParallel() for w in ("q_proj", "k_proj", "v_proj")}
        )
        plan[f"{at}.self_attn.o_proj"] = scatter_sequence()
        if _has(attn, "q_norm", "k_norm"):  # Qwen3: per head, on [batch, seq, heads, head_dim]
            plan[f"{at}.self_attn.q_norm"] = sequence_norm(dim=2)
            plan[f"{at}.self_attn.k_norm"] = sequence_norm(dim=2)
        if hasattr(mlp, "experts"):  # fused 3-D expert weights: replicated, not split
            shared = (
                "shared_expert" if _has(getattr(mlp, "shared_expert", None), "down_proj") else None
            )
            ups = ("gate_proj", "up_proj")
            if expert_parallel:
                plan.update(moe_on_own_tokens(f"{at}.mlp", shared, ups, "down_proj"))
            else:
                plan.update(moe_block(f"{at}.mlp", None, shared, ups, "down_proj"))
        elif _has(mlp, "gate_proj", "up_proj", "down_proj"):
            plan.update(split_mlp(f"{at}.mlp", ("gate_proj", "up_proj"), "down_proj"))
        else:
            raise _no_plan(f"{at}.mlp", mlp)
    return plan


def _has(module: nn.Module | None, *names: str) -> bool:
    return module is not None and all(hasattr(module, n) for n in names)


# --- a user's own -------------------------------------------------------------------------------
