"""Accelerator presets for the analytic cost model: peak rates, achieved efficiencies, links.

Each figure names its source. Peak FLOP/s are dense BF16 tensor-core rates (NVIDIA datasheets
quote 2x with 2:4 sparsity; we halve those). Efficiencies are what large kernels typically
achieve, not peaks; they are the knobs to calibrate against measurements (see docs/COSTMODEL.md).
Override any field with `dataclasses.replace` or `hardware_preset(name, **overrides)`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from octopipe.errors import InputError

MIB = 2**20


@dataclass(frozen=True)
class Hardware:
    """One accelerator and the links it uses in a pipeline."""

    name: str
    peak_flops: float
    """Dense BF16 tensor-core FLOP/s."""
    memory_bandwidth: float
    """HBM bytes/s."""
    memory_bytes: float
    """Capacity a plan must fit."""
    matmul_efficiency: float = 0.7
    """Fraction of peak_flops large GEMMs achieve."""
    grouped_matmul_efficiency: float = 0.5
    """Fraction of peak_flops MoE grouped GEMMs (many experts, few rows each) achieve."""
    attention_efficiency: float = 0.5
    """Fraction of peak_flops fused (flash) attention achieves, forward and backward, at 4,096
    queries a sequence (`kernels.attention_efficiency`)."""
    attention_half_length: float = 0.0
    """Queries a sequence at which fused attention's rate is half its long-sequence rate (0:
    no length dependence): its efficiency scales as L / (L + this), against 4,096."""
    memory_efficiency: float = 0.8
    """Fraction of memory_bandwidth that streaming (memory-bound) kernels achieve."""
    link_bandwidth: float = 50e9
    """Inter-stage point-to-point bytes/s (pipeline stages usually sit on different nodes)."""
    link_latency: float = 1e-5
    """Seconds per inter-stage transfer."""
    tp_bandwidth: float = 400e9
    """All-reduce bus bytes/s among the tensor-parallel group (NVLink within a node)."""
    num_sms: int = 132
    """Streaming multiprocessors: a GEMM's tiles run in waves of this many (`kernels.py`)."""
    fp8_peak_flops: float = 0.0
    """Dense FP8 tensor-core FLOP/s; 0: no FP8 tensor cores (A100)."""
    fp8_matmul_efficiency: float = 0.6
    """Fraction of fp8_peak_flops GEMMs achieve (FP8 GEMMs reach a smaller fraction of their
    doubled peak than BF16 ones of theirs: operand loads and epilogues do not double)."""
    block_scaled_fp8: bool = False
    """Tensor cores that take MXFP8's per-block scales (Blackwell)."""
    nvlink_domain: int = 8
    """GPUs one NVLink domain joins (a DGX/HGX node: 8; GB200 NVL72: 72): the default
    `--gpus-per-node` of `octopipe estimate`."""
    all_to_all_efficiency: float = 0.9
    """Fraction of its link's bandwidth (tp_bandwidth in an NVLink domain, link_bandwidth
    across) an MoE layer's all-to-all achieves. DeepEP's README (H800, DeepSeek-V3's
    pre-training shapes): dispatch and combine at 153-158 of NVLink's ~160 GB/s inside a node,
    43-47 of the NIC's ~50 GB/s across nodes: 0.86-0.96, taken as 0.9 (not fitted)."""
    moe_layer_host_seconds: float = 0.0
    """Seconds an MoE layer adds to each of its forward and input-gradient phases beyond its
    kernels' roofline where the stack syncs the host (`Settings.moe_host_sync`):
    Megatron-Core's token dispatcher copies the per-expert token counts to the host (a
    device-to-host sync that drains the GPU's queue), and the router, permutation and dispatch
    kernels after it run at the host's launch rate, not the GPU's."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in ("name", "num_sms", "block_scaled_fp8", "nvlink_domain"):
                continue
            value = getattr(self, f.name)
            if f.name in (
                "link_latency",
                "fp8_peak_flops",
                "moe_layer_host_seconds",
                "attention_half_length",
            ):
                if not value >= 0:
                    raise InputError(
                        f"hardware {self.name}", f"must not be negative (got {value})", f.name
                    )
            elif not value > 0:
                raise InputError(f"hardware {self.name}", f"must be positive (got {value})", f.name)
        for name in ("num_sms", "nvlink_domain"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise InputError(
                    f"hardware {self.name}", f"must be a positive integer (got {value})", name
                )
        efficiencies = (
            "matmul",
            "grouped_matmul",
            "attention",
            "memory",
            "fp8_matmul",
            "all_to_all",
        )
        for name in (f"{kind}_efficiency" for kind in efficiencies):
            if getattr(self, name) > 1:
                raise InputError(f"hardware {self.name}", "an efficiency is at most 1", name)


# Megatron-Core's MoE layers on their hosts (x86 DGX and Grace alike): the host stall of each
# MoE layer's forward and input-gradient phases, fitted to Megatron-Bridge 25.11's MoE runs on
# H100, B200 and GB200 (`benchmarks/bench_fidelity.py --record`, BENCHMARKS.md; each GPU's runs
# held out in turn gave 3.0-4.5 ms): a property of the software stack and host, not the GPU,
# paid only where the stack syncs (`--moe-host-sync`; OctoPipe's own MoE layers do not).
MOE_LAYER_HOST_SECONDS = 3.5e-3

# Inter-node links: DGX A100 has one 200 Gb/s HDR InfiniBand NIC per GPU (25 GB/s); DGX H100/H200
# and DeepSeek's H800 nodes one 400 Gb/s NDR NIC per GPU (50 GB/s) (NVIDIA DGX datasheets;
# DeepSeek-V3 technical report, sec. 3.2.1). Latency ~10 us: a few us of InfiniBand plus NCCL's
# per-message overhead. TP all-reduce bandwidths are typical nccl-tests bus bandwidths on one node.
PRESETS: dict[str, Hardware] = {
    "a100": Hardware(
        name="a100",
        peak_flops=312e12,  # A100 SXM4 datasheet: BF16 312 TFLOPS dense
        memory_bandwidth=2.039e12,  # A100 80GB SXM datasheet: HBM2e 2,039 GB/s
        memory_bytes=81920 * MIB,  # nvidia-smi total of an A100-SXM4-80GB
        # The two achieved fractions below are fitted to Narayanan et al. 2021's Table 1 (A100
        # runs of Megatron-LM) by `benchmarks/bench_fidelity.py --fit a100`, each row held out
        # in turn (BENCHMARKS.md): GEMMs as transformer layers run them (below an isolated
        # 8192^3 GEMM, as on the H200 below: 0.67 in layers, 0.79 alone), and streaming
        # kernels (softmax, dropout with its random masks, LayerNorm, GELU).
        matmul_efficiency=0.68,
        memory_efficiency=0.70,
        attention_efficiency=0.55,  # FlashAttention-2 paper: 50-73% of peak forward on A100
        link_bandwidth=25e9,  # 200 Gb/s HDR InfiniBand per GPU
        tp_bandwidth=230e9,  # NVLink3 (600 GB/s aggregate): ~230 GB/s all-reduce bus bandwidth
        num_sms=108,  # A100 whitepaper: 108 SMs on the SXM4 part
        moe_layer_host_seconds=MOE_LAYER_HOST_SECONDS,
    ),
    "h100": Hardware(
        name="h100",
        peak_flops=989e12,  # H100 SXM5 datasheet: BF16 1,979 TFLOPS with sparsity -> 989 dense
        memory_bandwidth=3.35e12,  # H100 SXM5 datasheet: HBM3 3.35 TB/s
        memory_bytes=81559 * MIB,  # nvidia-smi total of an H100 80GB HBM3
        matmul_efficiency=0.67,  # as measured on an H200 (same tensor cores), see "h200"
        attention_efficiency=0.45,  # as measured on an H200, see "h200"
        # The three below are fitted to the H100 record (benchmarks/data/h100_record.csv) by
        # `benchmarks/bench_fidelity.py --record`, each source held out in turn (BENCHMARKS.md):
        # FP8 GEMMs in layers at 0.5 of the FP8 peak, streaming kernels at 0.75 of HBM's
        # bandwidth (below the H200's device copy, 0.88: norms, rope and casts in layers), and
        # fused attention at half its long-sequence rate at 8,192 queries a sequence (so 0.45
        # at 4,096, 0.675 at 8,192, 0.27 at 2,048; FlashAttention-3's paper, Shah et al. 2024,
        # likewise shows its H100 rate rising with the sequence length).
        fp8_matmul_efficiency=0.5,
        memory_efficiency=0.75,
        attention_half_length=8192,
        link_bandwidth=50e9,  # 400 Gb/s NDR InfiniBand per GPU
        tp_bandwidth=450e9,  # NVLink4 (900 GB/s aggregate): ~450 GB/s all-reduce bus bandwidth
        num_sms=132,  # H100 SXM5 datasheet: 132 SMs
        moe_layer_host_seconds=MOE_LAYER_HOST_SECONDS,
        fp8_peak_flops=1979e12,  # H100 SXM5 datasheet: FP8 3,958 with sparsity -> 1,979 dense
    ),
    "h800": Hardware(
        name="h800",
        peak_flops=989e12,  # H800 SXM: same tensor cores and clocks as H100 SXM
        memory_bandwidth=3.35e12,  # H800 SXM: HBM3 3.35 TB/s
        memory_bytes=81559 * MIB,  # 80 GB HBM3, as H100
        matmul_efficiency=0.67,  # as H100
        attention_efficiency=0.45,
        fp8_matmul_efficiency=0.5,  # as H100
        memory_efficiency=0.75,  # as H100
        attention_half_length=8192,  # as H100
        link_bandwidth=50e9,  # DeepSeek-V3 report: 400 Gb/s InfiniBand (50 GB/s) per GPU
        tp_bandwidth=160e9,  # DeepSeek-V3 report: NVLink (export-limited 400 GB/s) ~160 GB/s
        num_sms=132,  # as H100 SXM
        moe_layer_host_seconds=MOE_LAYER_HOST_SECONDS,
        fp8_peak_flops=1979e12,  # H800 SXM: same tensor cores as H100 SXM
    ),
    "h200": Hardware(
        name="h200",
        peak_flops=989e12,  # H200 SXM datasheet: BF16 1,979 TFLOPS with sparsity -> 989 dense
        memory_bandwidth=4.8e12,  # H200 SXM datasheet: HBM3e 4.8 TB/s
        memory_bytes=143771 * MIB,  # nvidia-smi total of an H200 (141 GB marketed)
        # Calibrated with benchmarks/calibrate_gpu.py (its earlier, fixture-based version; the
        # run is measurements/h200.json) on one H200 (torch 2.11, eager): an
        # 8192^3 BF16 GEMM ran at 0.79 of peak; LLaMA-3 8B/70B blocks' F and W fit 0.67.
        # torch._grouped_mm over 64 experts x 384 rows (2048 -> 2816): 0.51, where a dense
        # GEMM of the same FLOPs ran at 0.74. The other presets assume the same 0.5.
        # Causal GQA SDPA at 4096 tokens: 0.50 forward, 0.43 backward. Device copy: 0.88.
        matmul_efficiency=0.67,
        attention_efficiency=0.45,
        memory_efficiency=0.85,
        fp8_matmul_efficiency=0.5,  # as H100 (fitted there)
        # No attention_half_length: the attention figure above is measured (eager SDPA), and
        # the H100's length dependence was fitted on Transformer Engine's fused attention.
        link_bandwidth=50e9,  # 400 Gb/s NDR InfiniBand per GPU (DGX H200)
        tp_bandwidth=450e9,  # NVLink4, as H100
        num_sms=132,  # the H100's GH100 die
        moe_layer_host_seconds=MOE_LAYER_HOST_SECONDS,
        fp8_peak_flops=1979e12,  # H200 SXM datasheet: FP8 3,958 with sparsity -> 1,979 dense
    ),
    # Blackwell. Peaks from NVIDIA's HGX B200 / DGX B200 and GB200 NVL72 datasheets, which quote
    # FP8 and BF16 with 2:4 sparsity (halved here). The achieved fractions are the Hopper
    # presets' (not yet fitted to a Blackwell run: the record holds H100s).
    "b200": Hardware(
        name="b200",
        peak_flops=2.25e15,  # HGX B200: BF16 4.5 PFLOPS per GPU with sparsity -> 2.25 dense
        memory_bandwidth=8e12,  # B200: HBM3e 8 TB/s
        memory_bytes=180e9,  # DGX B200: 1,440 GB of HBM3e over 8 GPUs
        matmul_efficiency=0.67,  # as H100 (assumed)
        attention_efficiency=0.45,  # as H100 (assumed)
        memory_efficiency=0.75,  # as H100 (assumed)
        attention_half_length=8192,  # as H100 (assumed)
        fp8_peak_flops=4.5e15,  # HGX B200: FP8 9 PFLOPS per GPU with sparsity -> 4.5 dense
        fp8_matmul_efficiency=0.5,  # as H100 (assumed)
        block_scaled_fp8=True,  # Blackwell's tensor cores take MXFP8's block scales
        link_bandwidth=50e9,  # DGX B200: ConnectX-7 400 Gb/s per GPU
        tp_bandwidth=900e9,  # NVLink 5: 1.8 TB/s per GPU, twice NVLink 4 (whose 900 -> 450)
        num_sms=148,  # B200: 148 SMs (two dies of 74)
        moe_layer_host_seconds=MOE_LAYER_HOST_SECONDS,
    ),
    "gb200": Hardware(
        name="gb200",
        peak_flops=2.5e15,  # GB200 NVL72: BF16 360 PFLOPS over 72 GPUs with sparsity -> 2.5
        memory_bandwidth=8e12,  # GB200 NVL72: 576 TB/s over 72 GPUs
        memory_bytes=186e9,  # GB200 NVL72: 13.4 TB of HBM3e over 72 GPUs
        matmul_efficiency=0.67,  # as H100 (assumed)
        attention_efficiency=0.45,  # as H100 (assumed)
        memory_efficiency=0.75,  # as H100 (assumed)
        attention_half_length=8192,  # as H100 (assumed)
        fp8_peak_flops=5e15,  # GB200 NVL72: FP8 720 PFLOPS over 72 GPUs with sparsity -> 5
        fp8_matmul_efficiency=0.5,  # as H100 (assumed)
        block_scaled_fp8=True,
        link_bandwidth=50e9,  # GB200 NVL72 compute trays: ConnectX-7 400 Gb/s per GPU
        tp_bandwidth=900e9,  # NVLink 5 within the rack's 72-GPU NVLink domain, as B200
        num_sms=148,  # as B200
        moe_layer_host_seconds=MOE_LAYER_HOST_SECONDS,
        nvlink_domain=72,  # GB200 NVL72: one NVLink domain of 72 GPUs
    ),
}


def hardware_preset(name: str, **overrides: float | None) -> Hardware:
    """A preset by name, with any field replaced (None values are ignored)."""
    preset = PRESETS.get(name.lower())
    if preset is None:
        known = ", ".join(sorted(PRESETS))
        raise InputError(name, f"unknown hardware (known: {known})")
    changes = {key: value for key, value in overrides.items() if value is not None}
    return replace(preset, **changes) if changes else preset
