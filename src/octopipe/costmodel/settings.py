"""Training settings the analytic cost model depends on: shapes of one microbatch, tensor
parallelism, recomputation and the bytes each parameter costs."""

from __future__ import annotations

from dataclasses import dataclass

from octopipe.errors import InputError


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
    recompute: bool = False
    """Full activation recomputation of every block: keep only its input, redo F before I."""
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
        for name in ("seq_len", "micro_batch_size", "tensor_parallel", "activation_bytes"):
            if getattr(self, name) < 1:
                raise InputError(
                    "settings", f"must be at least 1 (got {getattr(self, name)})", name
                )
        for name in ("weight_bytes", "grad_bytes", "optimizer_bytes"):
            if getattr(self, name) < 0:
                raise InputError(
                    "settings", f"must not be negative (got {getattr(self, name)})", name
                )

    @property
    def tokens(self) -> int:
        """Text tokens in one microbatch."""
        return self.seq_len * self.micro_batch_size

    @property
    def bytes_per_param(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes
