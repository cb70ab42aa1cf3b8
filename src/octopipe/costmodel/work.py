"""What one layer costs one tensor-parallel rank for one microbatch, before timing: its kernels
(FLOPs and bytes per phase), saved activations and parameters (`LayerWork`).

Pure arithmetic: nothing here knows about model families (see `layercost.py`); the roofline
is `kernels.py`.

A phase's time is its compute kernels' roofline times plus the communication they do not
hide: tensor-parallel collectives are exposed unless the settings overlap them with the
phase's GEMMs, and ring attention's K/V exchange always runs behind the attention blocks
(docs/COSTMODEL.md, "Communication").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from octopipe.costmodel.hardware import Hardware
from octopipe.costmodel.kernels import (
    ATTENTION,
    CP_COMM,
    CP_NETWORK,
    CP_NVLINK,
    EP_COMM,
    EP_NETWORK,
    EP_NVLINK,
    FLASH_BACKWARD_FACTOR,
    GROUPED,
    HOST,
    MATMUL,
    MEMORY,
    PHASES,
    TP_COMM,
    F,
    Gemm,
    I,
    Kernel,
    TimeParts,
    W,
    gemm_utilization,
    kernel_time,
    mean_attended_keys,
)
from octopipe.costmodel.precision import FP8_BYTES, cast_bytes, quantized, saved_input_bytes

NORM_STAT_BYTES = 4  # what a norm keeps per row besides its input: 1/rms (LayerNorm: and the mean)

__all__ = [
    "F",
    "FLASH_BACKWARD_FACTOR",
    "I",
    "PHASES",
    "W",
    "Gemm",
    "Kernel",
    "LayerWork",
    "TimeParts",
    "gemm_utilization",
    "kernel_time",
    "mean_attended_keys",
]


@dataclass
class LayerWork:
    """What one layer costs one tensor-parallel rank for one microbatch, before timing.

    Built by appending kernels; `act_bytes` is what the layer keeps from F to its backward,
    `wact_bytes` the inputs of its linear layers (what W still needs after I).
    `tp_overlap`: tensor-parallel collectives run behind the phase's GEMMs; `ep_overlap`: the
    MoE all-to-alls behind the phase's compute (`Settings.moe_a2a_overlap`).
    """

    tp: int
    sequence_parallel: bool
    dtype_bytes: int
    tp_overlap: bool = False
    precision: str = "bf16"
    """"bf16", or "fp8"/"mxfp8": the blocks' linear layers on the FP8 tensor cores
    (`precision.py`)."""
    fp8_scaling: str = "delayed"
    """FP8's per-tensor scaling: "delayed" (amax history) or "current" (amax pass first)."""
    ep_overlap: bool = False
    keeps_gathered: bool = False
    """A column-parallel linear keeps its all-gathered input under sequence parallelism
    (torch's tensor parallelism), not its shard (`Settings.tp_keeps_gathered`)."""
    weight_copies: bool = False
    """Each linear's BF16 weight copy is kept per microbatch (`Settings.weight_copies`)."""
    kernels: list[Kernel] = field(default_factory=list)
    params: int = 0
    expert_params: int = 0  # of which MoE experts' (held by one expert-parallel rank)
    fp8_params: int = 0  # of which run as FP8 GEMMs (and have FP8 copies)
    act_bytes: float = 0.0
    wact_bytes: float = 0.0
    wgrad_bytes: float = 0.0  # the output gradients W needs, from I on
    core_forward: list[Kernel] = field(default_factory=list)
    """The attention core's forward kernels: what selective recomputation redoes."""
    core_saved_bytes: float = 0.0
    """What the attention core saves beyond its inputs q, k, v (the score matrices, or flash's
    log-sum-exp): what selective recomputation does not keep."""
    core_flops: float = 0.0
    """FLOPs the attention core's kernels do (all phases), as the kernel runs them."""
    attention_model_flops: float = 0.0
    """The attention core's forward FLOPs by the model-FLOPs convention (every key of the
    sequence or window, masked or not: `model_flops`)."""
    _in_core: bool = False

    @contextmanager
    def core(self) -> Iterator[None]:
        """Kernels appended inside belong to the attention core (`core_forward`)."""
        first = len(self.kernels)
        self._in_core = True
        try:
            yield
        finally:
            self._in_core = False
        inside = self.kernels[first:]
        self.core_forward.extend(k for k in inside if k.phase == F)
        self.core_flops += sum(k.flops for k in inside)

    def count_attention(self, forward_flops: float) -> None:
        """The attention core's forward FLOPs by the model-FLOPs convention."""
        self.attention_model_flops += forward_flops

    def _core_saves(self, nbytes: float) -> None:
        if self._in_core:
            self.core_saved_bytes += nbytes

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
        quantizable: bool = True,
        fused_cast: bool = False,
    ) -> None:
        """tokens x [k -> n] with this rank's k and n. `experts` > 1: a grouped GEMM over that
        many weight matrices (tokens is the total routed). F, I and W each do 2*tokens*k*n FLOPs
        (Y = XW: [tokens x n]; dX = dY W^T: [tokens x k]; dW = X^T dY: [k x n]).
        `save_input=False` when another projection already saved (and, under FP8, cast) the
        same input; `input_grad=False` when the input needs no gradient (pixels);
        `quantizable=False` for what stays BF16 under FP8 (head, router, gates);
        `fused_cast`: under FP8 the producer of the input writes it in FP8 already (Transformer
        Engine's LayerNormLinear and LayerNormMLP fuse the norm, and the MLP's activation, with
        the cast), so the forward pays no cast of its own."""
        a = self.dtype_bytes
        fp8 = quantizable and quantized(self.precision)
        op = FP8_BYTES if fp8 else a  # bytes of a GEMM operand (the outputs stay BF16)
        flops = 2.0 * tokens * k * n
        weight = experts * k * n * op
        unit = GROUPED if experts > 1 else MATMUL
        rows = tokens / experts
        y = Gemm(rows, n, k, experts)
        self.kernels.append(
            Kernel(F, unit, flops, tokens * k * op + weight + tokens * n * a, y, fp8)
        )
        if input_grad:
            dx = Gemm(rows, k, n, experts)
            self.kernels.append(
                Kernel(I, unit, flops, tokens * n * op + weight + tokens * k * a, dx, fp8)
            )
        dw = Gemm(k, n, rows, experts)
        self.kernels.append(
            Kernel(W, unit, flops, tokens * (k + n) * op + 2 * experts * k * n * a, dw, fp8)
            if fp8
            else Kernel(W, unit, flops, tokens * (k + n) * a + 2 * weight, dw)
        )
        params = experts * (k * n + (n if bias else 0))
        self.params += params
        if experts > 1:
            self.expert_params += params
        if fp8:
            self.fp8_params += experts * k * n
            cast_in = cast_bytes(tokens * k, a, self.precision, self.fp8_scaling)
            cast_grad = cast_bytes(tokens * n, a, self.precision, self.fp8_scaling)
            if save_input and not fused_cast:  # projections sharing an input share its cast
                self.elementwise(cast_in, 0.0)
            self.elementwise(0.0, cast_grad if input_grad else 0.0)
            if not input_grad:
                self.elementwise(0.0, 0.0, w_bytes=cast_grad)
        self.wgrad_bytes += tokens * n * a  # W multiplies the input by this gradient
        if self.weight_copies:  # autocast's copy, kept for I's product with the weight
            self.act_bytes += experts * k * n * a
        if save_input:
            saved = saved_input_bytes(tokens * k, self.precision) if fp8 else tokens * k * a
            if replicated_input and not self.keeps_gathered:
                saved = self._shard_replicated(saved)
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
        q_len: float | None = None,
    ) -> None:
        """Fused (flash) attention core for this rank's heads; saves q, k, v and the
        log-sum-exp (its output is saved as the next projection's input). `q_len`: the
        queries of one sequence (the kernel's rate depends on it: `kernels.py`)."""
        a = self.dtype_bytes
        flops = 2.0 * q_tokens * keys_per_query * heads * (qk_dim + v_dim)
        q_bytes = q_tokens * heads * qk_dim * a
        kv_bytes = kv_tokens * kv_heads * (qk_dim + v_dim) * a
        out_bytes = q_tokens * heads * v_dim * a
        io = q_bytes + kv_bytes + out_bytes
        self.kernels.append(Kernel(F, ATTENTION, flops, io, q_len=q_len))
        backward = FLASH_BACKWARD_FACTOR * flops
        self.kernels.append(Kernel(I, ATTENTION, backward, 2 * io, q_len=q_len))
        lse = q_tokens * heads * 4  # the log-sum-exp, in FP32
        self.act_bytes += q_bytes + kv_bytes + lse
        self._core_saves(lse)

    def unfused_attention(
        self,
        sequences: float,
        q_len: float,
        kv_len: float,
        heads: int,
        kv_heads: int,
        qk_dim: int,
        v_dim: int,
        dropout: bool,
    ) -> None:
        """Attention with the score matrix in memory, as Megatron-LM 2021 and eager PyTorch run
        it: a batched GEMM Q K^T writing every score (the masked ones too), a fused scale, mask
        and softmax (read, write), dropout on the probabilities (read, write, a 1-byte mask),
        and a batched GEMM with V. The backward: two GEMMs per forward GEMM, the dropout's and
        the softmax's backward over the matrix. Saved (Korthikanti et al. 2022, sec. 4.1): q,
        k, v, the softmax output, and with dropout its mask and output."""
        a = self.dtype_bytes
        batch = sequences * heads
        scores = batch * q_len * kv_len  # elements of the score matrix
        q_bytes = sequences * q_len * heads * qk_dim * a
        k_bytes = sequences * kv_len * kv_heads * qk_dim * a
        v_bytes = sequences * kv_len * kv_heads * v_dim * a
        out_bytes = sequences * q_len * heads * v_dim * a
        qk_flops = 2.0 * scores * qk_dim
        av_flops = 2.0 * scores * v_dim
        matrix = scores * a
        qk = Gemm(q_len, kv_len, qk_dim, batch)
        av = Gemm(q_len, v_dim, kv_len, batch)
        self.kernels.append(Kernel(F, MATMUL, qk_flops, q_bytes + k_bytes + matrix, qk))
        self.elementwise(2 * matrix, 3 * matrix)  # softmax: F reads, writes; I reads two, writes
        if dropout:  # F reads, writes, writes the mask; I reads the mask and the gradient, writes
            self.elementwise(2 * matrix + scores, 2 * matrix + scores)
        self.kernels.append(Kernel(F, MATMUL, av_flops, matrix + v_bytes + out_bytes, av))
        # dP = dO V^T and dV = P^T dO; dQ = dS K and dK = dS^T Q.
        backward = (
            (av_flops, Gemm(q_len, kv_len, v_dim, batch), out_bytes + v_bytes + matrix),
            (av_flops, Gemm(kv_len, v_dim, q_len, batch), matrix + out_bytes + v_bytes),
            (qk_flops, Gemm(q_len, qk_dim, kv_len, batch), matrix + k_bytes + q_bytes),
            (qk_flops, Gemm(kv_len, qk_dim, q_len, batch), matrix + q_bytes + k_bytes),
        )
        for flops, shape, nbytes in backward:
            self.kernels.append(Kernel(I, MATMUL, flops, nbytes, shape))
        matrices = matrix + (scores + matrix if dropout else 0.0)  # and the mask, the dropped
        self.act_bytes += q_bytes + k_bytes + v_bytes + matrices
        self._core_saves(matrices)

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

    def norm(self, tokens: float, width: int, *, replicated: bool = True, bias: bool = False):
        """RMSNorm/LayerNorm: reads and writes the tensor, saves its input and each row's
        1/rms (float32; LayerNorm also its mean); the weight's gradient is reduced in the same
        backward kernel. LayerNorm adds a bias."""
        nbytes = tokens * width * self.dtype_bytes
        stats = tokens * NORM_STAT_BYTES * (2 if bias else 1)
        saved = self._shard_replicated(nbytes + stats) if replicated else nbytes + stats
        self.elementwise(2 * nbytes, 3 * nbytes, saved)
        self.params += width * (2 if bias else 1)

    def residual(self, tokens: float, width: int, dropout: bool = False) -> None:
        """The residual add (read two, write one), fused with the dropout of the branch's output
        when there is one (it writes and saves a 1-byte mask, and its backward applies it)."""
        nbytes = tokens * width * self.dtype_bytes
        if not dropout:
            self.elementwise(3 * nbytes, 0.0)
            return
        mask = self._shard_replicated(tokens * width)
        self.elementwise(3 * nbytes + mask, 2 * nbytes + mask, saved_bytes=mask)

    def tp_all_reduce(self, tokens: float, width: int, *, backward: bool = True) -> None:
        """Megatron's all-reduce of a row-parallel output in F (and of a column-parallel input
        gradient in I): ring traffic 2 (t - 1) / t of the tensor. Under sequence parallelism
        it is a reduce-scatter and an all-gather around the parallel region, (t - 1) / t each:
        the same traffic."""
        if self.tp == 1:
            return
        traffic = 2 * (self.tp - 1) / self.tp * tokens * width * self.dtype_bytes
        self.kernels.append(Kernel(F, TP_COMM, 0.0, traffic))
        if backward:
            self.kernels.append(Kernel(I, TP_COMM, 0.0, traffic))

    def cp_exchange(self, phase: str, nbytes: float, across_nodes: bool) -> None:
        """Ring attention's point-to-point K/V (and, backward, dK/dV) exchange of one layer:
        `nbytes` sent (and as many received) per rank, over NVLink or the network."""
        if nbytes:
            unit = CP_NETWORK if across_nodes else CP_NVLINK
            self.kernels.append(Kernel(phase, unit, 0.0, nbytes))

    def ep_all_to_all(self, phase: str, nbytes: float, across_nodes: bool) -> None:
        """An MoE layer's all-to-alls of one phase: `nbytes` sent (and as many received) per
        rank, over NVLink or the network."""
        if nbytes:
            unit = EP_NETWORK if across_nodes else EP_NVLINK
            self.kernels.append(Kernel(phase, unit, 0.0, nbytes))

    def host_stall(self) -> None:
        """A fixed host-side stall in F and in I (an MoE layer's token-count sync and the
        launch-bound routing kernels after it: `Hardware.moe_layer_host_seconds`)."""
        for phase in (F, I):
            self.kernels.append(Kernel(phase, HOST, 0.0, 0.0))

    def without_input_gradient(self) -> None:
        """The layer's input needs no gradient (token ids, pixels): the backward through it
        only serves the weight gradients, so all of it is W work."""
        self.kernels[:] = [replace(k, phase=W) if k.phase == I else k for k in self.kernels]

    def phase(self, phase: str, hw: Hardware) -> TimeParts:
        """The phase's seconds: compute, and the communication its kernels leave exposed."""
        compute = gemms = attention = tp = cp = ep = 0.0
        for k in self.kernels:
            if k.phase != phase:
                continue
            t = kernel_time(k, hw)
            if k.unit == TP_COMM:
                tp += t
            elif k.unit in CP_COMM:
                cp += t
            elif k.unit in EP_COMM:
                ep += t
            else:
                compute += t
                gemms += t if k.unit in (MATMUL, GROUPED) else 0.0
                attention += t if k.unit == ATTENTION else 0.0
        if self.tp_overlap:
            tp = max(0.0, tp - gemms)
        if self.ep_overlap:
            ep = max(0.0, ep - compute)
        return TimeParts(compute, 0.0, tp, max(0.0, cp - attention), ep)

    def phase_time(self, phase: str, hw: Hardware) -> float:
        return self.phase(phase, hw).total

    def phase_flops(self, phase: str) -> float:
        return sum(k.flops for k in self.kernels if k.phase == phase)

    def model_flops(self) -> tuple[float, float]:
        """Forward and backward FLOPs by the model-FLOPs convention (docs/COSTMODEL.md):
        every matmul as the kernels count it, the attention core as `4 q k d` per head
        forward over every key of the sequence (or window) and twice that backward, whatever
        kernel runs it; no recomputation."""
        core_forward = sum(k.flops for k in self.core_forward)
        core_backward = self.core_flops - core_forward
        forward = self.phase_flops(F) - core_forward + self.attention_model_flops
        backward = (
            self.phase_flops(I)
            + self.phase_flops(W)
            - core_backward
            + 2 * self.attention_model_flops
        )
        return forward, backward
