"""The units the cost model counts and the roofline that turns them into seconds: a kernel
(phase, FLOPs, bytes, GEMM shape, precision), tile and wave quantization, a phase's time parts.

Pure arithmetic: nothing here knows about model families or layers (see `work.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from octopipe.costmodel.hardware import Hardware

F, I, W = "f", "i", "w"  # forward, backward for inputs, backward for weights
PHASES = (F, I, W)
MATMUL, GROUPED, ATTENTION, MEMORY = "matmul", "grouped_matmul", "attention", "memory"
TP_COMM = "tp_comm"
CP_NVLINK, CP_NETWORK = "cp_nvlink", "cp_network"  # ring attention's exchange, by its link
CP_COMM = (CP_NVLINK, CP_NETWORK)
EP_NVLINK, EP_NETWORK = "ep_nvlink", "ep_network"  # MoE all-to-alls, by their link
EP_COMM = (EP_NVLINK, EP_NETWORK)
HOST = "host"  # a fixed host-side stall of the phase (`Hardware.moe_layer_host_seconds`)

# FlashAttention's backward runs five matmuls to the forward's two (it recomputes the scores):
# 2.5x the forward's FLOPs, all of it input-gradient work (attention has no weights).
FLASH_BACKWARD_FACTOR = 2.5
# The output tile a tensor-core GEMM kernel computes per thread block, in elements. NVIDIA's
# "Matrix Multiplication Background" guide (Deep Learning Performance docs) explains tile and
# wave quantization with 128 x 128 and 256 x 128 tiles; 128 x 128 is the size cuBLAS picks for
# most transformer shapes on A100 and H100 alike.
GEMM_TILE = 128
# `Hardware.attention_efficiency` is the fraction fused attention reaches at this many queries
# a sequence (the H200's measured causal SDPA at 4,096 tokens); `attention_half_length` bends
# it with the length. Never above an isolated large GEMM's measured 0.79 (the H200's 8192^3
# BF16 GEMM): attention's matmuls run no faster than a big GEMM's.
ATTENTION_REFERENCE_LENGTH = 4096
ATTENTION_CEILING = 0.79


@dataclass(frozen=True)
class Gemm:
    """The shape a matmul runs as: `batch` independent [m x k] @ [k x n] products."""

    m: float
    n: float
    k: float
    batch: float = 1


@dataclass(frozen=True)
class Kernel:
    """One piece of work in one phase: FLOPs and HBM bytes (for a collective: bytes on the
    wire per rank). `gemm`: the matmul's shape, for tile and wave quantization. `fp8`: the
    GEMM runs on the FP8 tensor cores (`precision.py`)."""

    phase: str
    unit: str
    flops: float
    bytes: float
    gemm: Gemm | None = None
    fp8: bool = False
    q_len: float | None = None
    """Fused attention: the queries a sequence has in the kernel (`attention_efficiency`'s
    length dependence)."""


def gemm_utilization(gemm: Gemm, hw: Hardware) -> float:
    """The fraction of a large GEMM's rate this shape reaches: output tiles padded to the tile
    size (tile quantization), and the last wave of tiles over the SMs only partly full (wave
    quantization). 1 for large, tile-aligned shapes."""
    tiles_m = math.ceil(gemm.m / GEMM_TILE)
    tiles_n = math.ceil(gemm.n / GEMM_TILE)
    tile = gemm.m * gemm.n / (tiles_m * tiles_n * GEMM_TILE**2)
    tiles = gemm.batch * tiles_m * tiles_n
    waves = math.ceil(tiles / hw.num_sms)
    return tile * tiles / (waves * hw.num_sms)


def attention_efficiency(hw: Hardware, q_len: float | None) -> float:
    """Fused attention's fraction of peak at `q_len` queries a sequence: the preset's figure
    at the reference length, scaled by L / (L + L_half) against its value there (short
    sequences leave the kernel's tiles and waves part empty, and pay the causal diagonal and
    the softmax rescaling over fewer keys); L_half 0: no dependence."""
    half = hw.attention_half_length
    if not half or not q_len:
        return hw.attention_efficiency
    ref = ATTENTION_REFERENCE_LENGTH
    scaled = hw.attention_efficiency * (q_len / (q_len + half)) * ((ref + half) / ref)
    return min(scaled, ATTENTION_CEILING)


def kernel_time(kernel: Kernel, hw: Hardware) -> float:
    """Roofline: the slower of compute and memory traffic; collectives by their link."""
    if kernel.unit == HOST:
        return hw.moe_layer_host_seconds
    if kernel.unit in (TP_COMM, CP_NVLINK):
        return kernel.bytes / hw.tp_bandwidth
    if kernel.unit == CP_NETWORK:
        return kernel.bytes / hw.link_bandwidth
    if kernel.unit == EP_NVLINK:
        return kernel.bytes / (hw.tp_bandwidth * hw.all_to_all_efficiency)
    if kernel.unit == EP_NETWORK:
        return kernel.bytes / (hw.link_bandwidth * hw.all_to_all_efficiency)
    memory = kernel.bytes / (hw.memory_bandwidth * hw.memory_efficiency)
    if kernel.unit == MEMORY:
        return memory
    efficiency = {
        MATMUL: hw.matmul_efficiency,
        GROUPED: hw.grouped_matmul_efficiency,
        ATTENTION: attention_efficiency(hw, kernel.q_len),
    }[kernel.unit]
    peak = hw.peak_flops
    if kernel.fp8:
        # FP8 GEMMs at their own rate; grouped ones lose to the grouping what BF16 ones do.
        efficiency *= hw.fp8_matmul_efficiency / hw.matmul_efficiency
        peak = hw.fp8_peak_flops
    if kernel.gemm is not None:
        efficiency *= gemm_utilization(kernel.gemm, hw)
    return max(kernel.flops / (peak * efficiency), memory)


def mean_attended_keys(seq_len: int, window: int | None, causal: bool = True) -> float:
    """Keys one query attends to on average: causal over `seq_len`, within a sliding window."""
    if not causal:
        return float(seq_len)
    w = seq_len if window is None else min(window, seq_len)
    # Query i sees min(i + 1, w) keys: sum = w * s - w * (w - 1) / 2.
    return (w * seq_len - w * (w - 1) / 2) / seq_len


@dataclass(frozen=True)
class TimeParts:
    """Seconds by where they go: compute kernels, the forward recomputation redoes, and the
    tensor-, context- and expert-parallel communication left exposed after overlap. A phase's
    time (`LayerWork.phase`), or a layer's over its F, I and W (`build.LayerEstimate.parts`)."""

    compute: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0
    dp_comm: float = 0.0
    """ZeRO-2/3's gathers and reduce-scatters a microbatch's phases leave exposed (set by the
    layout's costs, not by a layer alone)."""

    def _values(self) -> tuple[float, ...]:
        # The fields by hand: dataclasses.astuple deep-copies, and this runs for every layer
        # of every layout the cluster search estimates.
        return (
            self.compute,
            self.recompute,
            self.tp_comm,
            self.cp_comm,
            self.ep_comm,
            self.dp_comm,
        )

    @property
    def total(self) -> float:
        return sum(self._values())

    def __add__(self, other: TimeParts) -> TimeParts:
        return TimeParts(*(a + b for a, b in zip(self._values(), other._values())))

    def scaled(self, factor: float) -> TimeParts:
        return TimeParts(*(a * factor for a in self._values()))
