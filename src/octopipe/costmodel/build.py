"""Assemble a `Profile` from an architecture, a hardware preset and settings.

Times are each layer's kernels through the roofline of `work.kernel_time`; memory figures are
the saved activations and parameter bytes `layercost` counts. Also the model-level totals tests
and reports use: parameter count and training FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from octopipe.costmodel import arch as A
from octopipe.costmodel.arch import Architecture, LayerSpec, layer_specs
from octopipe.costmodel.hardware import Hardware
from octopipe.costmodel.layercost import boundary_bytes, layer_work
from octopipe.costmodel.precision import check_precision, weight_cache_bytes
from octopipe.costmodel.settings import Settings
from octopipe.costmodel.work import F, I, LayerWork, TimeParts, W
from octopipe.profile import Device, LayerCost, Link, Profile, Recomputation, Recomputed

# Blocks that full recomputation checkpoints: everything between two residual-stream boundaries.
RECOMPUTED_KINDS = frozenset(
    {
        A.DECODER,
        A.MOE,
        A.MAMBA,
        A.ATTENTION,
        A.MLP,
        A.MOE_MLP,
        A.CROSS_ATTENTION,
        A.VISION_BLOCK,
    }
)


@dataclass(frozen=True)
class LayerEstimate:
    """One layer's analytic cost for one microbatch on one tensor-parallel rank."""

    spec: LayerSpec
    f: float
    b: float
    w: float
    flops: tuple[float, float, float]
    """Forward, input-gradient and weight-gradient FLOPs the kernels do (no recomputation)."""
    params: int
    act_bytes: int
    wact_bytes: int
    wgrad_bytes: int
    param_bytes: int
    grad_bytes: int
    """What data parallelism reduces: this TP rank's parameters x gradient bytes."""
    out_bytes: int
    parts: TimeParts = TimeParts()
    model_flops: float = 0.0
    """Forward and backward FLOPs by the model-FLOPs convention (`LayerWork.model_flops`)."""
    recompute_flops: float = 0.0
    """Model-convention FLOPs of what recomputation redoes (hardware FLOPs = model + these)."""
    expert_params: int = 0
    """Of `params`, the MoE experts' (sharded over the expert-parallel ranks only)."""
    fp8_params: int = 0
    """Of `params`, those of FP8 linears: their FP8 copies are in `param_bytes`, and are cast
    once a step (`precision.weight_cast_bytes`)."""
    alternatives: dict[str, Recomputed] | None = None
    """Without recomputation in the settings: the layer's `b`, `act_bytes` and `wact_bytes`
    were its stage to recompute it, per kind it offers (a profile's `recompute` key)."""


def estimate_layers(arch: Architecture, hw: Hardware, settings: Settings) -> list[LayerEstimate]:
    check_precision(settings.precision, hw)
    specs = layer_specs(arch)
    out: list[LayerEstimate] = []
    alike: dict[tuple, LayerEstimate] = {}  # layers that cost the same are estimated once
    for i, spec in enumerate(specs):
        # A layer's work depends on its kind, mixer, FFN and window (a vision block's also on
        # its index); its name only names it. Its boundary bytes are part of the key.
        index = spec.index if spec.kind in (A.VISION_EMBED, A.VISION_BLOCK) else None
        key = (spec.kind, spec.mixer, spec.ffn, spec.window, index)
        key += (boundary_bytes(arch, specs, i, settings),)
        if key in alike:
            out.append(replace(alike[key], spec=spec))
            continue
        estimate = _estimate(arch, specs, i, layer_work(arch, spec, settings), hw, settings)
        alike[key] = estimate
        out.append(estimate)
    return out


def _estimate(
    arch: Architecture,
    specs: list[LayerSpec],
    index: int,
    work: LayerWork,
    hw: Hardware,
    s: Settings,
) -> LayerEstimate:
    spec = specs[index]
    phases = [work.phase(phase, hw) for phase in (F, I, W)]
    f, b, w = (p.total for p in phases)
    forward_flops, backward_flops = work.model_flops()
    parts = sum(phases, TimeParts())
    act, wact = work.act_bytes, work.wact_bytes
    redone, redone_flops = 0.0, 0.0
    choices = _recompute_choices(arch, spec, work, hw, s, f, forward_flops)
    if s.recompute in choices:
        redone, act, redone_flops = choices[s.recompute]
        if s.recompute == "full":
            # The recomputed linear inputs live from I to W: the profile's base entry cannot
            # show memory that rises at I, so they are counted as transient (docs/COSTMODEL.md).
            wact = act
    alternatives = None
    if s.recompute == "none":  # what a stage recomputing this layer would cost (per kind)
        alternatives = {
            kind: Recomputed(b=b + extra, act_bytes=int(held), wact_bytes=int(wact))
            for kind, (extra, held, _) in choices.items()
        }
        if "selective" in alternatives:  # W's inputs are not recomputed: held from F as before
            sel = alternatives["selective"]
            alternatives["selective"] = sel.model_copy(
                update={"wact_bytes": min(sel.wact_bytes, sel.act_bytes)}
            )
    b += redone
    return LayerEstimate(
        spec=spec,
        f=f,
        b=b,
        w=w,
        flops=(work.phase_flops(F), work.phase_flops(I), work.phase_flops(W)),
        params=work.params,
        act_bytes=int(act),
        wact_bytes=int(min(wact, act)),
        wgrad_bytes=int(work.wgrad_bytes),
        param_bytes=math.ceil(
            work.params * s.bytes_per_param + work.fp8_params * weight_cache_bytes(s.precision)
        ),
        grad_bytes=work.params * s.grad_bytes,
        out_bytes=boundary_bytes(arch, specs, index, s),
        parts=replace(parts, recompute=redone),
        model_flops=forward_flops + backward_flops,
        recompute_flops=redone_flops,
        expert_params=work.expert_params,
        fp8_params=work.fp8_params,
        alternatives=alternatives or None,
    )


def _recompute_choices(
    arch: Architecture,
    spec: LayerSpec,
    work: LayerWork,
    hw: Hardware,
    s: Settings,
    forward: float,
    forward_flops: float,
) -> dict[str, tuple[float, float, float]]:
    """Per kind of recomputation the layer offers: (seconds its backward redoes, bytes held from
    F, model-convention FLOPs redone)."""
    out = {}
    if spec.kind in RECOMPUTED_KINDS:
        # Keep only the block's input; the backward first redoes the forward (part of I).
        out["full"] = (forward, _checkpoint_bytes(arch, spec, s), forward_flops)
    if work.core_forward:
        # Korthikanti et al. 2022: drop what the attention core saves beyond q, k and v, and
        # redo its forward just before its backward.
        core = LayerWork(work.tp, work.sequence_parallel, work.dtype_bytes, work.tp_overlap)  # BF16
        core.kernels = list(work.core_forward)
        held = work.act_bytes - work.core_saved_bytes
        out["selective"] = (core.phase_time(F, hw), held, work.attention_model_flops)
    return out


def _checkpoint_bytes(arch: Architecture, spec: LayerSpec, s: Settings) -> float:
    sp = s.tensor_parallel if s.sequence_parallel else 1
    if spec.kind == A.VISION_BLOCK:
        assert arch.vision is not None
        tokens = s.micro_batch_size * arch.vision.num_tokens
        return tokens * arch.vision.hidden_size * s.activation_bytes / sp
    return s.tokens * arch.hidden_size * s.activation_bytes / sp


def build_profile(
    arch: Architecture,
    hardware: Hardware,
    settings: Settings,
    num_devices: int | None = None,
    estimates: list[LayerEstimate] | None = None,
) -> Profile:
    """The profile of `arch` on `hardware`: one entry per layer of `layer_specs(arch)`,
    `num_devices` identical devices when given, and the hardware's inter-stage link.
    `estimates`: the layers' estimates when already made (`estimate_layers` of the same
    arguments)."""
    layers = tuple(
        LayerCost(
            name=e.spec.name,
            kind=e.spec.kind,
            f=e.f,
            b=e.b,
            w=e.w,
            act_bytes=e.act_bytes,
            wact_bytes=e.wact_bytes,
            wgrad_bytes=e.wgrad_bytes,
            param_bytes=e.param_bytes,
            grad_bytes=e.grad_bytes,
            out_bytes=e.out_bytes,
            recompute=Recomputation(**e.alternatives) if e.alternatives else None,
        )
        for e in estimates or estimate_layers(arch, hardware, settings)
    )
    devices = None
    if num_devices is not None:
        devices = tuple(
            # named: a plan records what device its costs are for, and a run on another says so
            Device(speed=1.0, memory_bytes=hardware.memory_bytes, name=hardware.name)
            for _ in range(num_devices)
        )
    return Profile(
        name=f"{arch.name}-tp{settings.tensor_parallel}-{hardware.name}",
        layers=layers,
        devices=devices,
        link=Link(bandwidth=hardware.link_bandwidth, latency=hardware.link_latency),
        microbatch_size=settings.micro_batch_size,
        seq_len=settings.seq_len,
        tensor_parallel=settings.tensor_parallel,
        precision=settings.precision,
        fp8_scaling=settings.fp8_scaling,
    )


def parameter_count(arch: Architecture) -> int:
    """Distinct parameters of the model (a tied output head shares the embedding table)."""
    settings = Settings(seq_len=1)
    total = 0
    for spec in layer_specs(arch):
        if spec.kind == A.HEAD and arch.tie_word_embeddings:
            continue
        total += layer_work(arch, spec, settings).params
    return total


def model_flops(arch: Architecture, settings: Settings) -> float:
    """FLOPs of one microbatch's forward and backward over the whole model by the model-FLOPs
    convention (docs/COSTMODEL.md): every matmul, the attention core over every key of the
    sequence (or window), no recomputation; all tensor- and context-parallel ranks together.
    What MFU divides by the step time."""
    degree = settings.tensor_parallel * settings.context_parallel
    return degree * sum(
        sum(layer_work(arch, spec, settings).model_flops()) for spec in layer_specs(arch)
    )


def training_flops(arch: Architecture, settings: Settings) -> float:
    """FLOPs of one microbatch's forward and backward over the whole model (one TP rank times
    the TP degree), without recomputation."""
    total = 0.0
    for spec in layer_specs(arch):
        work = layer_work(arch, spec, settings)
        total += sum(work.phase_flops(phase) for phase in (F, I, W))
    return total * settings.tensor_parallel
