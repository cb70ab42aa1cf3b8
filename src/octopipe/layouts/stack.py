"""How the training stack runs a layout: the kernel and communication choices that make real
runs faster or slower than the plain count, each a named setting with a meaning.

    stack = Stack(attention="unfused", dropout=0.1, grad_dtype="fp16")   # Megatron-LM 2021
    settings = layer_settings(layout, stack, seq_len=2048, cp_across_nodes=False)

`Stack` holds what is the same for every layout of a job (the framework's choices);
`layer_settings` combines it with one layout's degrees into the cost model's `Settings`.
docs/COSTMODEL.md gives each setting's source and which stack defaults to what.
"""

from __future__ import annotations

from dataclasses import dataclass

from octopipe.costmodel.precision import FP8_SCALINGS, PRECISIONS
from octopipe.costmodel.settings import ATTENTION_KERNELS, Settings
from octopipe.errors import InputError

GRAD_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
P2P_KINDS = ("overlapped", "blocking")


@dataclass(frozen=True)
class Stack:
    """The training framework's choices, shared by every layout of a job."""

    attention: str = "flash"
    """The attention kernel: "flash" (fused) or "unfused" (the score matrix in memory)."""
    sequence_parallel: bool = True
    """Megatron-LM's sequence parallelism with TP > 1 (Megatron-Core pairs them)."""
    tp_comm_overlap: bool = False
    """TP collectives overlapped with the neighbouring GEMMs (Megatron-Core's default: off)."""
    dropout: float = 0.0
    """Dropout probability (GPT-2 and Megatron-LM 2021's GPT: 0.1; Llama-style: 0)."""
    grad_dtype: str = "fp32"
    """What gradients accumulate and are reduced in: "fp32" (Megatron-Core's main gradients,
    torchtitan's FSDP reduce dtype) or "bf16"/"fp16" (2 bytes; Megatron-LM 2021's fp16 runs
    reduced fp16 gradients and copied them to FP32 main gradients only for the update)."""
    grad_bucket_bytes: int | None = None
    """Data-parallel reductions in buckets of this many bytes, started as the backward fills
    them (PyTorch DDP: 25 MB; Megatron-Core's --overlap-grad-reduce); None: each stage's
    gradients reduced at once after its last backward (OctoPipe's executor)."""
    reduce_at_end: bool = False
    """Every reduction of a device waits for its last action of the step (Megatron-LM's
    local DDP, and Megatron-Core without --overlap-grad-reduce)."""
    p2p: str = "overlapped"
    """Pipeline transfers "overlapped" with compute (OctoPipe's executor, Megatron-Core's
    --overlap-p2p-comm) or "blocking": the sender waits for its send (Megatron-LM 2021,
    DeepSpeed's pipeline engine)."""
    scatter_gather: bool = True
    """Each TP rank sends its 1/t of the boundary tensor to the next stage (Megatron-LM's
    scatter/gather of pipeline tensors); implied by sequence parallelism."""
    optimizer_bytes: int = 12
    """Optimizer state per parameter: mixed-precision Adam's FP32 master copy and moments."""
    precision: str = "bf16"
    """The blocks' GEMMs in "bf16", "fp8" (Transformer Engine on Hopper and later) or "mxfp8"
    (Blackwell's block-scaled FP8); docs/COSTMODEL.md, "Precision"."""
    fp8_scaling: str = "delayed"
    """FP8's per-tensor scaling: "delayed" (amax history) or "current" (an amax pass first)."""
    moe_capacity_factor: float = 0.0
    """MoE routing: 0 dropless; > 0 each expert's input padded to this factor of its share."""
    moe_host_sync: bool = False
    """Each MoE layer syncs the host for its token counts (Megatron-Core's token dispatchers):
    its forward and input-gradient phases each pay the preset's `moe_layer_host_seconds`."""
    moe_a2a_overlap: bool = False
    """MoE all-to-alls hidden behind another microbatch's compute (Megatron-Core's
    `--overlap-moe-expert-parallel-comm`): only what a phase's compute cannot cover is exposed."""
    zero3_held: bool = False
    """ZeRO-3 gathers a stage's weights once a step and holds them across its microbatches
    even without PP (OctoPipe's executor: FSDP2 with `reshard_after_forward=False`); False:
    only under PP, gathering per microbatch without it (FSDP2's and torchtitan's default)."""
    tp_keeps_gathered: bool = False
    """Under sequence parallelism a column-parallel linear keeps its all-gathered input (torch's
    tensor parallelism: OctoPipe's executor, torchtitan); False: its shard, gathered again in the
    backward (Megatron-Core)."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KERNELS:
            raise InputError("--attention", f"expected one of {', '.join(ATTENTION_KERNELS)}")
        if self.grad_dtype not in GRAD_DTYPE_BYTES:
            raise InputError("--grad-dtype", f"expected one of {', '.join(GRAD_DTYPE_BYTES)}")
        if not 0.0 <= self.dropout < 1.0:
            raise InputError("--dropout", f"must lie in [0, 1), got {self.dropout}")
        if self.grad_bucket_bytes is not None and self.grad_bucket_bytes < 1:
            raise InputError("--grad-bucket-mb", "must be positive")
        if self.p2p not in P2P_KINDS:
            raise InputError("--p2p", f"expected one of {', '.join(P2P_KINDS)}")
        if self.precision not in PRECISIONS:
            raise InputError("--precision", f"expected one of {', '.join(PRECISIONS)}")
        if self.moe_capacity_factor < 0:
            raise InputError("--moe-capacity-factor", "must not be negative")
        if self.fp8_scaling not in FP8_SCALINGS:
            raise InputError("--fp8-scaling", f"expected one of {', '.join(FP8_SCALINGS)}")

    @property
    def grad_bytes(self) -> int:
        return GRAD_DTYPE_BYTES[self.grad_dtype]


def layer_settings(
    *,
    tp: int,
    cp: int,
    microbatch_size: int,
    recompute: str,
    stack: Stack,
    seq_len: int,
    cp_across_nodes: bool = False,
    ep: int = 1,
    ep_across_nodes: bool = False,
    ep_node_ranks: int = 1,
    etp: int = 0,
) -> Settings:
    """The cost model's settings for one layout's layers under `stack`."""
    return Settings(
        seq_len=seq_len,
        micro_batch_size=microbatch_size,
        tensor_parallel=tp,
        sequence_parallel=stack.sequence_parallel and tp > 1,
        tp_keeps_gathered=stack.tp_keeps_gathered,
        split_boundary=stack.scatter_gather and tp > 1,
        context_parallel=cp,
        cp_across_nodes=cp_across_nodes,
        expert_parallel=ep,
        expert_tensor_parallel=etp,
        moe_capacity_factor=stack.moe_capacity_factor,
        moe_host_sync=stack.moe_host_sync,
        ep_across_nodes=ep_across_nodes,
        ep_node_ranks=ep_node_ranks,
        moe_a2a_overlap=stack.moe_a2a_overlap,
        recompute=recompute,
        attention=stack.attention,
        dropout=stack.dropout,
        tp_comm_overlap=stack.tp_comm_overlap,
        grad_bytes=stack.grad_bytes,
        optimizer_bytes=stack.optimizer_bytes,
        precision=stack.precision,
        fp8_scaling=stack.fp8_scaling,
    )
