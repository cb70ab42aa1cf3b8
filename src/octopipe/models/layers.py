"""Pipeline layers: one module per `LayerSpec`, built from the architecture's shapes.

Every layer takes the activation streams as positional tensors and returns them as a tuple:
text models carry `(hidden,)`. The vision-language model carries `(token_ids, vision_states)`
through the vision tower, plus the features it collects from intermediate layers once there
are any, then `(token_ids, image_features)` after the projector and `(hidden, image_features)`
through the text stack, until the last cross-attention layer drops the image features. Token
ids are integers and carry no gradient.
"""

from __future__ import annotations

import torch
from torch import nn

from octopipe.costmodel.arch import GEMMA, Architecture, LayerSpec
from octopipe.models.attention import CrossAttention, LatentAttention, RMSNorm, SelfAttention
from octopipe.models.feedforward import MLP, GatedMLP, MoE
from octopipe.models.lean import in_compute_dtype
from octopipe.models.mamba import Mamba2Mixer
from octopipe.models.vision import PatchEmbed, ViTBlock

Streams = tuple[torch.Tensor, ...]


class TokenEmbedding(nn.Module):
    def __init__(self, arch: Architecture):
        super().__init__()
        self.embed = nn.Embedding(arch.vocab_size + arch.extra_vocab, arch.hidden_size)
        self.scale = arch.embed_scale

    def forward(self, tokens: torch.Tensor, *context: torch.Tensor) -> Streams:
        # The residual stream in the compute dtype (BF16 under autocast), as `lean` says why.
        return (in_compute_dtype(self.embed(tokens) * self.scale), *context)


class TextLayer(nn.Module):
    """`layers.i`: a pre-norm residual token mixer and/or feed-forward (hybrids have one).
    Gemma also normalizes each branch's output before the residual add."""

    def __init__(self, arch: Architecture, spec: LayerSpec):
        super().__init__()
        dim, eps = arch.hidden_size, arch.norm_eps
        self.mixer = token_mixer(arch, spec)
        self.ffn = feed_forward(arch, spec)
        has_mixer, has_ffn = self.mixer is not None, self.ffn is not None
        self.mixer_norm = RMSNorm(dim, eps) if has_mixer else None
        self.ffn_norm = RMSNorm(dim, eps) if has_ffn else None
        post_norms = arch.family == GEMMA
        self.mixer_post_norm = RMSNorm(dim, eps) if has_mixer and post_norms else nn.Identity()
        self.ffn_post_norm = RMSNorm(dim, eps) if has_ffn and post_norms else nn.Identity()

    def forward(self, h: torch.Tensor, *context: torch.Tensor) -> Streams:
        if self.mixer is not None:
            h = h + self.mixer_post_norm(self.mixer(self.mixer_norm(h)))
        if self.ffn is not None:
            h = h + self.ffn_post_norm(self.ffn(self.ffn_norm(h)))
        return (h, *context)


class CrossAttentionLayer(nn.Module):
    """A text layer that attends to the image features, both sublayers behind tanh gates."""

    def __init__(self, arch: Architecture, spec: LayerSpec):
        super().__init__()
        dim, eps, att = arch.hidden_size, arch.norm_eps, arch.attention
        self.attn_norm = RMSNorm(dim, eps)
        self.attn = CrossAttention(dim, att.num_heads, att.num_kv_heads, att.head_dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)
        self.ffn = feed_forward(arch, spec)
        # Mllama opens its gates from 0; a fresh model here starts half open so that the image
        # path gets gradients from the first step.
        self.attn_gate = nn.Parameter(torch.empty(1))
        self.ffn_gate = nn.Parameter(torch.empty(1))
        # After the last cross-attention layer nothing reads the image features: stop sending.
        self.passes_image_on = spec.index != max(arch.cross_attention_layers)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.attn_gate, 0.5)
        nn.init.constant_(self.ffn_gate, 0.5)

    def forward(self, h: torch.Tensor, image: torch.Tensor) -> Streams:
        h = h + torch.tanh(self.attn_gate) * self.attn(self.attn_norm(h), image)
        h = h + torch.tanh(self.ffn_gate) * self.ffn(self.ffn_norm(h))
        return (h, image) if self.passes_image_on else (h,)


class FinalNorm(nn.Module):
    """`norm`: the last normalization."""

    def __init__(self, arch: Architecture):
        super().__init__()
        self.norm = RMSNorm(arch.hidden_size, arch.norm_eps)

    def forward(self, h: torch.Tensor) -> Streams:
        return (self.norm(h),)


class OutputHead(nn.Module):
    """`output`: hidden states to vocabulary logits (Gemma-2 soft-caps them).

    Tied embeddings are not shared here: the head and the embedding usually sit on different
    pipeline stages, so the head keeps its own weight.
    """

    def __init__(self, arch: Architecture):
        super().__init__()
        self.proj = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        self.softcap = arch.final_logit_softcap

    def forward(self, h: torch.Tensor) -> Streams:
        logits = self.proj(h)
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return (logits,)


class VisionEmbedLayer(nn.Module):
    """`vision.patch_embed`: (token ids, pixels) -> (token ids, patch states)."""

    def __init__(self, arch: Architecture):
        super().__init__()
        v = _vision(arch)
        self.patch_embed = PatchEmbed(
            v.image_size, v.patch_size, v.num_channels, v.hidden_size, v.max_num_tiles
        )

    def forward(self, tokens: torch.Tensor, pixels: torch.Tensor) -> Streams:
        return (tokens, self.patch_embed(pixels))


class VisionLayer(nn.Module):
    """`vision.layers.j`: one ViT block over the patch states; token ids pass through. The
    outputs of Mllama's intermediate layers are appended to a collected-features stream."""

    def __init__(self, arch: Architecture, spec: LayerSpec):
        super().__init__()
        v = _vision(arch)
        is_global = spec.index >= v.num_layers - v.num_global_layers
        self.block = ViTBlock(
            v.hidden_size, v.num_heads, v.intermediate_size, arch.norm_eps, gated=is_global
        )
        self.collects = spec.index in v.intermediate_layers

    def forward(
        self, tokens: torch.Tensor, states: torch.Tensor, *collected: torch.Tensor
    ) -> Streams:
        states = self.block(states)
        if self.collects:
            collected = (torch.cat([*collected, states], dim=-1),)
        return (tokens, states, *collected)


class ProjectorLayer(nn.Module):
    """`projector`: the last vision states with the collected ones (vision_output_dim wide) to
    the text width, giving the image features."""

    def __init__(self, arch: Architecture):
        super().__init__()
        v = _vision(arch)
        width = v.hidden_size * (1 + len(v.intermediate_layers))
        if width != v.output_dim:
            raise ValueError(
                f"{arch.name}: vision_output_dim is {v.output_dim}, but the last layer and "
                f"{len(v.intermediate_layers)} intermediate layers give {width} features"
            )
        self.proj = nn.Linear(width, arch.hidden_size)

    def forward(self, tokens: torch.Tensor, *states: torch.Tensor) -> Streams:
        return (tokens, self.proj(torch.cat(states, dim=-1)))


def token_mixer(arch: Architecture, spec: LayerSpec) -> nn.Module | None:
    att = arch.attention
    if spec.mixer == "gqa":
        return SelfAttention(
            arch.hidden_size,
            att.num_heads,
            att.num_kv_heads,
            att.head_dim,
            rope_theta=arch.rope_theta,
            window=spec.window,
            softcap=att.logit_softcap,
            scale=att.query_scale**-0.5 if att.query_scale else None,
            bias=att.bias,
            qk_norm=att.qk_norm,
        )
    if spec.mixer == "mla":
        mla = arch.latent_attention
        assert mla is not None, "an 'mla' layer needs latent_attention shapes"
        return LatentAttention(
            arch.hidden_size,
            mla.num_heads,
            mla.q_lora_rank,
            mla.kv_lora_rank,
            mla.qk_nope_head_dim,
            mla.qk_rope_head_dim,
            mla.v_head_dim,
            arch.rope_theta,
        )
    if spec.mixer == "mamba":
        m = arch.mamba
        assert m is not None, "a 'mamba' layer needs mamba shapes"
        return Mamba2Mixer(
            arch.hidden_size,
            m.num_heads,
            m.head_dim,
            m.state_size,
            m.n_groups,
            m.conv_kernel,
            arch.norm_eps,
        )
    if spec.mixer is None:
        return None
    raise ValueError(f"{spec.name}: no torch module for token mixer {spec.mixer!r}")


def feed_forward(arch: Architecture, spec: LayerSpec) -> nn.Module | None:
    if spec.ffn == "dense":
        if arch.gated_mlp:
            return GatedMLP(arch.hidden_size, arch.intermediate_size, arch.hidden_act)
        return MLP(arch.hidden_size, arch.intermediate_size, arch.hidden_act, bias=False)
    if spec.ffn == "moe":
        moe = arch.moe
        assert moe is not None, "a 'moe' layer needs MoE shapes"
        return MoE(
            arch.hidden_size,
            moe.expert_intermediate_size,
            moe.num_experts,
            moe.top_k,
            moe.shared_intermediate_size,
            moe.shared_expert_gate,
            arch.hidden_act,
        )
    if spec.ffn is None:
        return None
    raise ValueError(f"{spec.name}: no torch module for feed-forward {spec.ffn!r}")


def _vision(arch: Architecture):
    assert arch.vision is not None, "a vision layer needs vision shapes"
    return arch.vision


def build_layer(arch: Architecture, spec: LayerSpec) -> nn.Module:
    """The torch module for one layer spec (initialized from torch's global generator)."""
    if spec.kind in ("decoder", "moe", "mamba", "attention", "mlp"):
        return TextLayer(arch, spec)
    if spec.kind == "cross_attention":
        return CrossAttentionLayer(arch, spec)
    if spec.kind == "vision_block":
        return VisionLayer(arch, spec)
    singletons = {
        "embedding": TokenEmbedding,
        "norm": FinalNorm,
        "head": OutputHead,
        "vision_embed": VisionEmbedLayer,
        "projector": ProjectorLayer,
    }
    if spec.kind not in singletons:
        raise ValueError(f"{spec.name}: no torch module for layer kind {spec.kind!r}")
    return singletons[spec.kind](arch)
