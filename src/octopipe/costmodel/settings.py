"""Training settings the analytic cost model depends on: shapes of one microbatch, tensor and
context parallelism, the attention kernel, recomputation, dropout and the bytes each parameter
costs. Every field is a choice a real training stack makes (docs/COSTMODEL.md says which stack
defaults to what); none is a correction factor."""

from __future__ import annotations

from dataclasses import dataclass

from octopipe.costmodel.precision import FP8_SCALINGS, PRECISIONS
from octopipe.errors import InputError

RECOMPUTE_KINDS = ("none", "selective", "full")
ATTENTION_KERNELS = ("flash", "unfused")


@dataclass(frozen=True)
class Settings:
    """How one microbatch is run on one pipeline device (a tensor-parallel group)."""

    seq_len: int = 4096
    """Text tokens per sample."""
    micro_batch_size: int = 1
    """Samples per microbatch (a VLM sample carries one image)."""
    tensor_parallel: int = 1
    """Megatron tensor-parallel degree: heads, MLP width, experts and vocabulary are split."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: activations TP replicates are stored and sent split."""
    tp_keeps_gathered: bool = False
    """Under sequence parallelism, a column-parallel linear keeps its all-gathered input for the
    backward, as torch's tensor parallelism does (`octopipe run`, torchtitan); Megatron-Core
    keeps the shard and gathers it again in the backward (False)."""
    weight_copies: bool = False
    """Each microbatch's backward keeps its own BF16 copy of every linear weight, as autocast
    over FP32 weights does (`octopipe run --bf16`): the copies count as that microbatch's
    activations. False: the weights are BF16 themselves (Megatron-Core, FSDP2's mixed
    precision)."""
    split_boundary: bool = False
    """Each TP rank sends only its 1/t of the tensor crossing a stage boundary (Megatron-LM's
    scatter/gather; sequence parallelism implies it)."""
    context_parallel: int = 1
    """Context parallelism: each rank holds seq_len / cp tokens of every sequence; attention
    runs as ring attention, exchanging K/V chunks with the other ranks."""
    cp_across_nodes: bool = False
    """The context-parallel ranks of a group sit on different nodes, so ring attention's
    exchange runs over the network, not NVLink (the layout knows; `cluster.py`)."""
    expert_parallel: int = 1
    """Expert parallelism: the MoE layers' experts spread over this many data-parallel ranks,
    tokens exchanged by all-to-alls (`feedforward.moe`)."""
    expert_tensor_parallel: int = 0
    """Expert TP of the MoE layers (Megatron-Core's MoE parallel folding): each expert's width
    split this many ways. 0: the TP degree without expert parallelism, 1 with it."""
    moe_capacity_factor: float = 0.0
    """MoE routing: 0 dropless (the tokens the router chose, balanced on average); > 0 every
    expert's input padded to this factor of its balanced share (Megatron-Core's capacity
    factor with `--moe-pad-expert-input-to-capacity`)."""
    moe_host_sync: bool = False
    """Each MoE layer syncs the host for its per-expert token counts and launches its routing
    kernels after it (Megatron-Core's token dispatchers): the layer's F and I each pay the
    hardware's `moe_layer_host_seconds`."""
    ep_across_nodes: bool = False
    """The expert-parallel ranks of a group sit on different nodes (all-to-alls over the NICs)."""
    ep_node_ranks: int = 1
    """Of an EP group across nodes, its ranks on one node (the fewest): an EP rank sends the
    copies bound for them over NVLink, beside the network's share, (EP - this) / EP, which
    takes longer (NVLink outruns a NIC by more than EP / this on every preset)."""
    moe_a2a_overlap: bool = False
    """The MoE all-to-alls of one microbatch hidden behind another's compute (Megatron-Core's
    `--overlap-moe-expert-parallel-comm`, which runs a forward and a backward of two
    microbatches as one interleaved step): a phase's exposed all-to-all is what its compute
    cannot cover."""
    recompute: str = "none"
    """Activation recomputation: "none"; "selective" (Korthikanti et al. 2022: the attention
    core only, redone in the backward); "full" (every block keeps only its input and redoes its
    forward before its backward). A bool is read as full (True) or none (False)."""
    attention: str = "flash"
    """The attention kernel: "flash" (fused, no score matrix in memory) or "unfused" (the
    scores written, softmaxed and read back, as Megatron-LM 2021 and eager PyTorch do)."""
    dropout: float = 0.0
    """Dropout probability of the attention probabilities and of every residual branch (GPT-2
    and Megatron-LM's GPT default 0.1; Llama-style training uses none): with any, the masks
    are written, saved and applied."""
    tp_comm_overlap: bool = False
    """Tensor-parallel collectives overlapped with the neighbouring GEMMs (Megatron-Core's
    `--tp-comm-overlap`, off by default): only what the phase's GEMMs cannot hide is exposed."""
    precision: str = "bf16"
    """"bf16"; "fp8" (Transformer Engine's FP8 on Hopper and later) or "mxfp8" (Blackwell's
    block-scaled FP8): the blocks' linear layers run as FP8 GEMMs (`precision.py`)."""
    fp8_scaling: str = "delayed"
    """FP8's per-tensor scaling: "delayed" (amax history, Transformer Engine's former default)
    or "current" (an amax pass before each cast). MXFP8 scales per block inside the cast."""
    activation_bytes: int = 2
    """Bytes per activation element (BF16)."""
    weight_bytes: int = 2
    """Bytes per parameter of the working weights (BF16)."""
    grad_bytes: int = 2
    """Bytes per parameter of the gradients (BF16; 4 for FP32 gradient accumulation)."""
    optimizer_bytes: int = 12
    """Bytes per parameter of optimizer state. Mixed-precision Adam: FP32 master weights,
    first and second moments, 4 + 4 + 4 (ZeRO paper, sec. 3.1: 2 + 2 + 12 = 16 bytes/param)."""

    def __post_init__(self) -> None:
        if isinstance(self.recompute, bool):
            object.__setattr__(self, "recompute", "full" if self.recompute else "none")
        for name in (
            "seq_len",
            "micro_batch_size",
            "tensor_parallel",
            "context_parallel",
            "expert_parallel",
            "activation_bytes",
        ):
            if getattr(self, name) < 1:
                raise InputError(
                    "settings", f"must be at least 1 (got {getattr(self, name)})", name
                )
        for name in ("weight_bytes", "grad_bytes", "optimizer_bytes"):
            if getattr(self, name) < 0:
                raise InputError(
                    "settings", f"must not be negative (got {getattr(self, name)})", name
                )
        for name, allowed in (
            ("recompute", RECOMPUTE_KINDS),
            ("attention", ATTENTION_KERNELS),
            ("precision", PRECISIONS),
            ("fp8_scaling", FP8_SCALINGS),
        ):
            if getattr(self, name) not in allowed:
                raise InputError(
                    "settings",
                    f"expected one of {', '.join(allowed)} (got {getattr(self, name)!r})",
                    name,
                )
        if self.expert_tensor_parallel < 0 or self.moe_capacity_factor < 0:
            raise InputError("settings", "must not be negative", "expert_tensor_parallel")
        if not 0.0 <= self.dropout < 1.0:
            raise InputError("settings", f"must lie in [0, 1) (got {self.dropout})", "dropout")
        if self.seq_len % self.context_parallel:
            raise InputError(
                "settings",
                f"context-parallel degree {self.context_parallel} does not divide the "
                f"sequence length {self.seq_len}",
                "context_parallel",
            )

    @property
    def expert_tp(self) -> int:
        """Expert TP: as given, or the TP degree without EP and 1 with it."""
        if self.expert_tensor_parallel:
            return self.expert_tensor_parallel
        return self.tensor_parallel if self.expert_parallel == 1 else 1

    @property
    def tokens(self) -> int:
        """Text tokens of one microbatch on one context-parallel rank."""
        return self.seq_len * self.micro_batch_size // self.context_parallel

    @property
    def local_seq_len(self) -> int:
        """Tokens of one sequence this rank holds (all of it without context parallelism)."""
        return self.seq_len // self.context_parallel

    @property
    def bytes_per_param(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes
