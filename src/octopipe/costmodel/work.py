"""The units the cost model counts: kernels (FLOPs and bytes per phase), saved activations and
parameters of one layer, and the roofline that turns a kernel into seconds.

Pure arithmetic: nothing here knows about model families (see `layercost.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from octopipe.costmodel.hardware import Hardware

F, I, W = "f", "i", "w"  # forward, backward for inputs, backward for weights
MATMUL, GROUPED, ATTENTION, MEMORY = "matmul", "grouped_matmul", "attention", "memory"
TP_COMM = "tp_comm"

# FlashAttention's backward runs five matmuls to the forward's two (it recomputes the scores):
# 2.5x the forward's FLOPs, all of it input-gradient work (attention has no weights).
ATTENTION_BACKWARD_FACTOR = 2.5


@dataclass(frozen=True)
class Kernel:
    """One piece of work in one phase: FLOPs and HBM bytes (or, for TP_COMM, bytes on the bus)."""

    phase: str
    unit: str
    flops: float
    bytes: float


def kernel_time(kernel: Kernel, hw: Hardware) -> float:
    """Roofline: the slower of compute and memory traffic; collectives by bus bandwidth."""
    if kernel.unit == TP_COMM:
        return kernel.bytes / hw.tp_bandwidth
    memory = kernel.bytes / (hw.memory_bandwidth * hw.memory_efficiency)
    if kernel.unit == MEMORY:
        return memory
    efficiency = {
        MATMUL: hw.matmul_efficiency,
        GROUPED: hw.grouped_matmul_efficiency,
        ATTENTION: hw.attention_efficiency,
    }[kernel.unit]
    return max(kernel.flops / (hw.peak_flops * efficiency), memory)


def mean_attended_keys(seq_len: int, window: int | None, causal: bool = True) -> float:
    """Keys one query attends to on average: causal over `seq_len`, within a sliding window."""
    if not causal:
        return float(seq_len)
    w = seq_len if window is None else min(window, seq_len)
    # Query i sees min(i + 1, w) keys: sum = w * s - w * (w - 1) / 2.
    return (w * seq_len - w * (w - 1) / 2) / seq_len


@dataclass
class LayerWork:
    """What one layer costs one tensor-parallel rank for one microbatch, before timing.

    Built by appending kernels; `act_bytes` is what the layer keeps from F to its backward,
    `wact_bytes` the inputs of its linear layers (what W still needs after I).
    """

    tp: int
    sequence_parallel: bool
    dtype_bytes: int
    kernels: list[Kernel] = field(default_factory=list)
    params: int = 0
    act_bytes: float = 0.0
    wact_bytes: float = 0.0

    def _shard_replicated(self, nbytes: float) -> float:
        """Activations TP replicates are stored split under sequence parallelism."""
        return nbytes / self.tp if self.sequence_parallel else nbytes

    def linear(
        self,
        tokens: float,
        k: int,
        n: int,
        *,
        bias: bool = False,
        experts: int = 1,
        save_input: bool = True,
        replicated_input: bool = True,
        input_grad: bool = True,
    ) -> None:
        """tokens x [k -> n] with this rank's k and n. `experts` > 1: a grouped GEMM over that
        many weight matrices (tokens is the total routed). F, I and W each do 2*tokens*k*n FLOPs.
        `save_input=False` when another projection already saved the same input;
        `input_grad=False` when the input needs no gradient (pixels)."""
        a = self.dtype_bytes
        flops = 2.0 * tokens * k * n
        weight = experts * k * n * a
        unit = GROUPED if experts > 1 else MATMUL
        self.kernels.append(Kernel(F, unit, flops, tokens * k * a + weight + tokens * n * a))
        if input_grad:
            self.kernels.append(Kernel(I, unit, flops, tokens * n * a + weight + tokens * k * a))
        self.kernels.append(Kernel(W, unit, flops, tokens * (k + n) * a + 2 * weight))
        self.params += experts * (k * n + (n if bias else 0))
        if save_input:
            saved = tokens * k * a
            saved = self._shard_replicated(saved) if replicated_input else saved
            self.act_bytes += saved
            self.wact_bytes += saved

    def attention(
        self,
        q_tokens: float,
        kv_tokens: float,
        keys_per_query: float,
        heads: int,
        kv_heads: int,
        qk_dim: int,
        v_dim: int,
    ) -> None:
        """Fused attention core for this rank's heads; saves q, k, v and the log-sum-exp
        (its output is saved as the next projection's input)."""
        a = self.dtype_bytes
        flops = 2.0 * q_tokens * keys_per_query * heads * (qk_dim + v_dim)
        q_bytes = q_tokens * heads * qk_dim * a
        kv_bytes = kv_tokens * kv_heads * (qk_dim + v_dim) * a
        out_bytes = q_tokens * heads * v_dim * a
        io = q_bytes + kv_bytes + out_bytes
        self.kernels.append(Kernel(F, ATTENTION, flops, io))
        self.kernels.append(Kernel(I, ATTENTION, ATTENTION_BACKWARD_FACTOR * flops, 2 * io))
        self.act_bytes += q_bytes + kv_bytes + q_tokens * heads * 4  # log-sum-exp in FP32

    def elementwise(
        self, f_bytes: float, i_bytes: float, saved_bytes: float = 0.0, w_bytes: float = 0.0
    ) -> None:
        """A memory-bound kernel (activation function, rope, residual add, gather), with the
        bytes its F, I and W phases move and what it saves for the backward."""
        for phase, nbytes in ((F, f_bytes), (I, i_bytes), (W, w_bytes)):
            if nbytes:
                self.kernels.append(Kernel(phase, MEMORY, 0.0, nbytes))
        self.act_bytes += saved_bytes

    def scan(self, flops: float, nbytes: float) -> None:
        """A selective-scan (SSD) kernel: small batched matmuls, timed like fused attention;
        its backward is about twice the forward and is all input-gradient work."""
        self.kernels.append(Kernel(F, ATTENTION, flops, nbytes))
        self.kernels.append(Kernel(I, ATTENTION, 2 * flops, 2 * nbytes))

    def norm(self, tokens: float, width: int, *, replicated: bool = True) -> None:
        """RMSNorm/LayerNorm: reads and writes the tensor, saves its input; the weight's
        gradient is reduced in the same backward kernel."""
        nbytes = tokens * width * self.dtype_bytes
        saved = self._shard_replicated(nbytes) if replicated else nbytes
        self.elementwise(2 * nbytes, 3 * nbytes, saved)
        self.params += width

    def residual(self, tokens: float, width: int) -> None:
        nbytes = tokens * width * self.dtype_bytes
        self.elementwise(3 * nbytes, 0.0)

    def tp_all_reduce(self, tokens: float, width: int, *, backward: bool = True) -> None:
        """Megatron's all-reduce of a row-parallel output in F (and of a column-parallel input
        gradient in I): ring traffic 2 (t - 1) / t of the tensor."""
        if self.tp == 1:
            return
        traffic = 2 * (self.tp - 1) / self.tp * tokens * width * self.dtype_bytes
        self.kernels.append(Kernel(F, TP_COMM, 0.0, traffic))
        if backward:
            self.kernels.append(Kernel(I, TP_COMM, 0.0, traffic))

    def without_input_gradient(self) -> None:
        """The layer's input needs no gradient (token ids, pixels): the backward through it
        only serves the weight gradients, so all of it is W work."""
        self.kernels[:] = [
            Kernel(W, k.unit, k.flops, k.bytes) if k.phase == I else k for k in self.kernels
        ]

    def phase_time(self, phase: str, hw: Hardware) -> float:
        return sum(kernel_time(k, hw) for k in self.kernels if k.phase == phase)

    def phase_flops(self, phase: str) -> float:
        return sum(k.flops for k in self.kernels if k.phase == phase)
