"""Training precision: which GEMMs run in FP8, what the casts cost, what FP8 keeps in memory.

`--precision bf16` (the default) runs everything in BF16. `fp8` is Transformer Engine's FP8
recipe on Hopper as Megatron-Core and NeMo run it (`--fp8-format hybrid`: E4M3 forward, E5M2
gradients); `mxfp8` Blackwell's block-scaled FP8 (MXFP8: one power-of-two scale per 32
elements). Under either, the linear layers of the blocks (attention projections, MLA's
projections, dense and expert MLPs, Mamba's projections) run their three GEMMs (forward,
input gradient, weight gradient) on the FP8 tensor cores; the attention core, norms,
activations, rope, the embedding, the router, the output head and the optimizer (FP32 master
weights and moments) stay as they were (Megatron-Core's output layer is not a Transformer
Engine module; torchtitan's float8 leaves `output` out by default).

What an FP8 linear adds, per microbatch, beside its GEMMs (docs/COSTMODEL.md, "Precision"):

- **casts**: the input X is quantized in F (read BF16, write FP8 and, where the wgrad GEMM
  needs X^T, a transposed copy: Transformer Engine's fused cast-transpose), the output
  gradient dY in I (the same). Current (per-tensor, just-in-time) scaling reads the BF16 tensor
  once more for its amax first; delayed scaling takes the amax from the history kept by the
  previous casts (one pass). MXFP8 computes each 32-block's scale inside the cast (one pass)
  and writes row- and column-wise copies with one scale byte per 32 elements.
- **saved activations**: the linear keeps its FP8 input (what wgrad needs) instead of BF16:
  1 byte per element (MXFP8: its column-wise copy and scales).
- **weights**: FP8 copies of each quantized weight (Hopper: the weight and its transpose;
  MXFP8: row- and column-wise with scales) beside the BF16 working weight, cast once per step
  after the optimizer (Transformer Engine casts on the first microbatch and keeps the cache).
"""

from __future__ import annotations

from octopipe.costmodel.hardware import Hardware
from octopipe.errors import InputError

PRECISIONS = ("bf16", "fp8", "mxfp8")
FP8_SCALINGS = ("delayed", "current")
FP8_BYTES = 1
MX_BLOCK = 32  # OCP Microscaling spec v1.0: one E8M0 scale byte per 32 elements


def quantized(precision: str) -> bool:
    return precision != "bf16"


def cast_bytes(elements: float, dtype_bytes: int, precision: str, scaling: str) -> float:
    """HBM bytes of quantizing one BF16 tensor of `elements` for an FP8 GEMM and its
    transposed use: read it (twice under current scaling: amax, then cast), write two FP8
    copies (MXFP8: plus a scale per block of each)."""
    reads = 2 if precision == "fp8" and scaling == "current" else 1
    writes = 2 * elements * FP8_BYTES
    if precision == "mxfp8":
        writes += 2 * elements / MX_BLOCK
    return reads * elements * dtype_bytes + writes


def saved_input_bytes(elements: float, precision: str) -> float:
    """What an FP8 linear keeps of its input for the weight gradient."""
    scales = elements / MX_BLOCK if precision == "mxfp8" else 0.0
    return elements * FP8_BYTES + scales


def weight_cache_bytes(precision: str) -> float:
    """Bytes per quantized parameter of the FP8 weight copies held beside the BF16 weight."""
    if precision == "bf16":
        return 0.0
    scales = 2 / MX_BLOCK if precision == "mxfp8" else 0.0
    return 2 * FP8_BYTES + scales


def weight_cast_bytes(params: float, weight_bytes: int, precision: str) -> float:
    """HBM bytes of casting the updated weights to their FP8 copies once a step."""
    if precision == "bf16":
        return 0.0
    return params * (weight_bytes + weight_cache_bytes(precision))


def check_precision(precision: str, hw: Hardware, flag: str = "--precision") -> None:
    """Refuse, in one line, a precision the GPU has no tensor cores for."""
    if precision not in PRECISIONS:
        raise InputError(flag, f"expected one of {', '.join(PRECISIONS)} (got {precision!r})")
    if precision == "fp8" and not hw.fp8_peak_flops:
        raise InputError(flag, f"{hw.name} has no FP8 tensor cores (Hopper and later do)")
    if precision == "mxfp8" and not hw.block_scaled_fp8:
        raise InputError(
            flag, f"{hw.name} has no block-scaled (MXFP8) tensor cores (Blackwell has; try fp8)"
        )
