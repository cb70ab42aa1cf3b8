"""The model's shape as Megatron-LM's arguments, and the parameters those arguments build.

    model_arguments(arch)            # ["--hidden-size", "4096", ...]; InputError: no such model
    megatron_parameters(values)      # parameters of the model Megatron-LM builds from them

`model_arguments` writes what OctoPipe read from the config (docs/FORMATS.md, `megatron_args.sh`):
widths, heads and query groups, norm, activation, biases, positions, vocabulary; experts, top-k,
expert and shared-expert widths, router and which layers are MoE; MLA's ranks; Mamba's heads and
the hybrid pattern (Nemotron-H runs `pretrain_mamba.py`). A family Megatron-LM's pretraining
scripts build no layer for (Gemma's norms after attention and MLP and its soft-capping,
Llama-3.2-Vision's tower, gpt-oss's attention sinks and alternating windows) is one InputError.

`megatron_parameters` counts from Megatron-Core's attribute names (`hidden_size`,
`num_query_groups`, `moe_ffn_hidden_size`, ...), as its modules hold them, so it reads
`megatron_values(args)` here and Megatron-LM's own parsed arguments in
`benchmarks/megatron_check.py`; a test holds it to OctoPipe's count of every accepted config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from octopipe.costmodel.arch import DEEPSEEK, GEMMA, GPT, HYBRID, VLM, Architecture
from octopipe.errors import InputError

# Megatron-LM's names of the activations OctoPipe reads from configs.
_PLAIN_ACTIVATIONS = {
    "gelu": [],
    "gelu_new": [],
    "gelu_pytorch_tanh": [],
    "relu2": ["--squared-relu"],
}
_GATED_ACTIVATIONS = {"silu": ["--swiglu"]}

# Flags whose Megatron-Core attribute is not the flag's own name.
_DESTS = {
    "norm-epsilon": "layernorm_epsilon",
    "disable-bias-linear": "add_bias_linear",
    "fp8-format": "fp8",
}
_STORE_FALSE = {"disable-bias-linear"}


def model_refusal(arch: Architecture) -> str | None:
    """Why Megatron-LM's pretraining scripts cannot build `arch`, or None where they can."""
    if arch.family == GEMMA:
        return (
            "Megatron-LM's pretrain_gpt.py builds no Gemma layer (norms after attention and "
            "MLP, logit soft-capping, scaled embeddings)"
        )
    if arch.family == VLM:
        return "Megatron-LM's pretrain_gpt.py trains text models, not Llama-3.2-Vision's tower"
    if arch.moe is not None and arch.moe.expert_bias:
        return "gpt-oss's attention sinks and expert biases are not written for Megatron-LM yet"
    if len(set(arch.layer_windows)) > 1:
        return "Megatron-LM's --window-size is one window for every layer, not alternating ones"
    if arch.mamba is not None and arch.mamba.conv_kernel != 4:
        return f"Megatron-Core's Mamba convolution is 4 wide, not {arch.mamba.conv_kernel}"
    if arch.family != GPT and arch.hidden_act not in {**_PLAIN_ACTIVATIONS, **_GATED_ACTIVATIONS}:
        return f"no Megatron-LM activation for {arch.hidden_act!r}"
    return None


def model_script(arch: Architecture) -> str:
    """The pretraining script that builds `arch`."""
    return "pretrain_mamba.py" if arch.family == HYBRID else "pretrain_gpt.py"


def model_arguments(arch: Architecture) -> list[str]:
    """The model's shape as Megatron-LM's arguments; an InputError where it builds no such
    model (`model_refusal`)."""
    why = model_refusal(arch)
    if why is not None:
        raise InputError("--model", why)
    att = arch.attention
    args = [  # --num-layers is the layout's (args.py)
        *("--hidden-size", str(arch.hidden_size)),
        *("--ffn-hidden-size", str(arch.intermediate_size)),
        *("--num-attention-heads", str(att.num_heads)),
    ]
    if arch.latent_attention is None:
        args += ["--kv-channels", str(att.head_dim)]
        if att.num_kv_heads != att.num_heads:
            args += ["--group-query-attention", "--num-query-groups", str(att.num_kv_heads)]
    else:
        args += _latent_attention(arch)
    args += ["--normalization", "LayerNorm" if arch.norm_bias else "RMSNorm"]
    args += ["--norm-epsilon", repr(arch.norm_eps)]
    if arch.gated_mlp:
        args += _GATED_ACTIVATIONS[arch.hidden_act]
    else:
        args += _PLAIN_ACTIVATIONS.get(arch.hidden_act, [])  # GELU: Megatron-LM's default
    if not arch.mlp_bias:
        args.append("--disable-bias-linear")
    if att.bias and not arch.mlp_bias:
        args.append("--add-qkv-bias")
    if att.qk_norm:
        args.append("--qk-layernorm")
    args += _positions(arch)
    if not arch.tie_word_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    # The config's vocabulary unpadded: Megatron-LM pads it to this multiple (of TP).
    args += ["--vocab-size", str(arch.vocab_size), "--make-vocab-size-divisible-by", "1"]
    if arch.moe is not None:
        args += _experts(arch)
    if arch.family == HYBRID:
        args += _mamba(arch)
    return args


def _latent_attention(arch: Architecture) -> list[str]:
    mla = arch.latent_attention
    assert mla is not None
    args = ["--multi-latent-attention"]
    if mla.q_lora_rank is not None:
        args += ["--q-lora-rank", str(mla.q_lora_rank)]
    return args + [
        *("--kv-lora-rank", str(mla.kv_lora_rank)),
        *("--qk-head-dim", str(mla.qk_nope_head_dim)),
        *("--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim)),
        *("--v-head-dim", str(mla.v_head_dim)),
    ]


def _positions(arch: Architecture) -> list[str]:
    if arch.learned_positions:
        return [
            *("--position-embedding-type", "learned_absolute"),
            *("--max-position-embeddings", str(arch.learned_positions)),
        ]
    args = [
        *("--position-embedding-type", "rope"),
        *("--rotary-base", str(int(arch.rope_theta))),
        *("--max-position-embeddings", str(arch.max_position_embeddings)),
    ]
    window = arch.layer_windows[0] if arch.layer_windows else None
    if window is not None:  # one window for every layer (model_refusal): (left, right)
        args += ["--window-size", f"({window - 1},0)"]
    return args


def _experts(arch: Architecture) -> list[str]:
    moe = arch.moe
    assert moe is not None
    args = [
        *("--num-experts", str(moe.num_experts)),
        *("--moe-router-topk", str(moe.top_k)),
        *("--moe-ffn-hidden-size", str(moe.expert_intermediate_size)),
        "--moe-grouped-gemm",
        *("--moe-token-dispatcher-type", "alltoall"),
    ]
    if moe.shared_intermediate_size:
        args += ["--moe-shared-expert-intermediate-size", str(moe.shared_intermediate_size)]
        if moe.shared_expert_gate:
            args.append("--moe-shared-expert-gate")
    if arch.family == DEEPSEEK and arch.model_type != "deepseek_v2":
        # DeepSeek-V3's router: sigmoid scores, an aux-loss-free expert bias (a buffer)
        args += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"]
    if arch.family != HYBRID and arch.moe_layers and not all(arch.moe_layers):
        pattern = ",".join("1" if m else "0" for m in arch.moe_layers)
        args += ["--moe-layer-freq", f"[{pattern}]"]
    return args


def _mamba(arch: Architecture) -> list[str]:
    mamba, pattern = arch.mamba, arch.hybrid_pattern
    assert mamba is not None and pattern is not None
    return [
        *("--hybrid-layer-pattern", pattern),
        *("--mamba-num-heads", str(mamba.num_heads)),
        *("--mamba-head-dim", str(mamba.head_dim)),
        *("--mamba-state-dim", str(mamba.state_size)),
        *("--mamba-num-groups", str(mamba.n_groups)),
    ]


# --- what those arguments build ------------------------------------------------------------------


def megatron_values(args: list[str]) -> dict[str, Any]:
    """The arguments as Megatron-LM's parser reads them, by Megatron-Core attribute name: a
    flag with a value, a switch True (`--disable-bias-linear`: `add_bias_linear` False)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        flag = args[i].removeprefix("--")
        dest = _DESTS.get(flag, flag.replace("-", "_"))
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[dest] = args[i + 1]
            i += 2
        else:
            out[dest] = flag not in _STORE_FALSE
            i += 1
    return out


def megatron_parameters(values: Mapping[str, Any]) -> int:
    """Parameters of the model Megatron-Core builds from `values` (attribute names as its
    parser's, strings or parsed), its vocabulary unpadded; counted module by module as its GPT
    and Mamba layers hold them (a fused norm inside the linear after it counted as the norm)."""
    v = _Values(values)
    h = v.int("hidden_size")
    norm = 2 * h if v.str("normalization", "LayerNorm") == "LayerNorm" else h
    vocab = v.int("vocab_size")
    total = vocab * h + norm  # embedding, final norm
    if v.flag("untie_embeddings_and_output_weights"):  # else the head is the embedding
        total += vocab * h
    if v.str("position_embedding_type", "learned_absolute") == "learned_absolute":
        total += v.int("max_position_embeddings") * h
    pattern = v.str("hybrid_layer_pattern", "")
    if pattern:
        return total + sum(_hybrid_layer(v, c, norm) for c in pattern)
    layers = v.int("num_layers")
    moe = _moe_layers(v, layers)
    for i in range(layers):
        total += norm + _attention(v) + norm
        total += _moe(v) if moe[i] else _mlp(v, v.int("ffn_hidden_size"))
    return total


class _Values:
    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values

    def int(self, key: str, default: int | None = None) -> int:
        value = self.values.get(key)
        return default if value is None else int(value)  # type: ignore[return-value]

    def str(self, key: str, default: str) -> str:
        value = self.values.get(key)
        return default if value is None else str(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.values.get(key)
        return default if value is None else bool(value)

    @property
    def bias(self) -> bool:
        return self.flag("add_bias_linear", True)

    @property
    def gated(self) -> bool:
        return self.flag("swiglu")


def _attention(v: _Values) -> int:
    h, heads = v.int("hidden_size"), v.int("num_attention_heads")
    if v.flag("multi_latent_attention"):
        q_rank, kv_rank = v.int("q_lora_rank"), v.int("kv_lora_rank", 32)
        nope, rope, vd = (
            v.int("qk_head_dim", 128),
            v.int("qk_pos_emb_head_dim", 64),
            v.int("v_head_dim", 128),
        )
        q = (
            h * heads * (nope + rope)
            if q_rank is None
            else h * q_rank + q_rank + q_rank * heads * (nope + rope)
        )
        kv = h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + vd)
        return q + kv + heads * vd * h
    ch = v.int("kv_channels", h // heads)
    groups = v.int("num_query_groups", heads) if v.flag("group_query_attention") else heads
    qkv = (heads + 2 * groups) * ch
    total = h * qkv + heads * ch * h
    if v.bias or v.flag("add_qkv_bias"):
        total += qkv
    if v.bias:
        total += h
    if v.flag("qk_layernorm"):
        total += 2 * ch * (2 if v.str("normalization", "LayerNorm") == "LayerNorm" else 1)
    return total


def _mlp(v: _Values, width: int) -> int:
    h = v.int("hidden_size")
    up = (2 if v.gated else 1) * width
    return h * up + width * h + ((up + h) if v.bias else 0)


def _moe(v: _Values) -> int:
    h, experts = v.int("hidden_size"), v.int("num_experts")
    total = h * experts + experts * _mlp(v, v.int("moe_ffn_hidden_size", v.int("ffn_hidden_size")))
    shared = v.int("moe_shared_expert_intermediate_size", 0)
    if shared:
        total += _mlp(v, shared) + (h if v.flag("moe_shared_expert_gate") else 0)
    return total


def _moe_layers(v: _Values, layers: int) -> list[bool]:
    if not v.int("num_experts", 0):
        return [False] * layers
    freq = v.values.get("moe_layer_freq", 1)
    if isinstance(freq, str) and "[" in freq:
        freq = [int(x) for x in freq.strip("[]").split(",")]
    if isinstance(freq, list):
        return [bool(x) for x in freq]
    return [i % int(freq) == 0 for i in range(layers)]


def _hybrid_layer(v: _Values, char: str, norm: int) -> int:
    """One layer of Megatron-Core's hybrid stack, its own norm included: Mamba, attention,
    MLP or MoE."""
    if char == "*":
        return norm + _attention(v)
    if char == "-":
        return norm + _mlp(v, v.int("ffn_hidden_size"))
    if char == "E":
        return norm + _moe(v)
    h = v.int("hidden_size")
    heads, head_dim = v.int("mamba_num_heads"), v.int("mamba_head_dim", 64)
    state, groups = v.int("mamba_state_dim", 128), v.int("mamba_num_groups", 8)
    inner, conv = heads * head_dim, heads * head_dim + 2 * groups * state
    in_proj = h * (2 * inner + 2 * groups * state + heads)
    return norm + in_proj + conv * 4 + conv + 3 * heads + inner + inner * h
