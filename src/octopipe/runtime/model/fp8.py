"""FP8 training as the cost model prices it (docs/COSTMODEL.md, "Precision"): the linear layers
of the blocks run their three GEMMs in FP8 (E4M3 forward, E5M2 gradients) through torchao's
float8 training, with per-tensor scales computed at each cast (the model's current scaling);
the router, the embedding, the head and everything outside the blocks stay as they were.

    convert_to_fp8(stage)        # in place, before recomputation and the step's wrappers
    fp8_support(device)          # None where the device has FP8 GEMMs, else why not

torchao is an optional extra (`pip install 'octopipe[fp8]'`). On a CPU torch runs the FP8 GEMMs
emulated (`torch._scaled_mm` without tensor cores): right, not fast, which is what tests need.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from octopipe.errors import InputError

# Linears inside a block that stay in BF16: routers and gates that scale an expert's output
# (OctoPipe's `router`/`shared_gate`, transformers' `gate`/`shared_expert_gate`).
_KEPT = frozenset(("router", "gate", "shared_gate", "shared_expert_gate"))
_ALIGN = 16  # FP8 GEMMs need both dimensions a multiple of 16


def require_torchao() -> None:
    """An FP8 plan needs torchao: one line saying how to install it, where it is missing."""
    from importlib.util import find_spec

    if find_spec("torchao") is None:
        raise InputError(
            "plan.json",
            "profile.precision: the plan was priced in FP8, which octopipe run trains through "
            "torchao: pip install 'octopipe[fp8]'",
        )


def fp8_support(device: torch.device) -> str | None:
    """Why `device` has no FP8 tensor cores (Ada and Hopper and later: compute capability
    8.9), or None where it has them."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            name = torch.cuda.get_device_name(device)
            return f"{name} (compute capability {major}.{minor}) has no FP8 GEMMs (8.9 and later)"
        return None
    return f"{device.type} has no FP8 tensor cores: the FP8 GEMMs run emulated (right, not fast)"


def _converted(fqn: str, module: nn.Module) -> bool:
    if not isinstance(module, nn.Linear):
        return False
    parts = fqn.split(".")
    in_block = "layers" in parts and parts[-1] not in _KEPT
    return in_block and module.in_features % _ALIGN == 0 and module.out_features % _ALIGN == 0


def convert_to_fp8(stage: nn.Module) -> int:
    """Swap the blocks' linears of `stage` for torchao's float8 training linears (tensorwise
    scales computed at each cast), in place; the number swapped."""
    require_torchao()
    with torchao_quietly():
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    swapped = sum(_converted(fqn, m) for fqn, m in stage.named_modules())
    convert_to_float8_training(
        stage,
        config=Float8LinearConfig(),  # tensorwise, dynamic: the cost model's current scaling
        module_filter_fn=lambda m, fqn: _converted(fqn, m),
    )
    return swapped


@contextmanager
def torchao_quietly() -> Iterator[None]:
    """Importing torchao (here, or transformers' quantizers where it is installed) without its
    warnings, which concern no run: which CUDA kernels it did not load (all, on a CPU-only
    machine), and torch's that the enums it registers need no registering."""
    loggers = ("torchao", "torch.utils._pytree")
    levels = {name: logging.getLogger(name).level for name in loggers}
    for name in loggers:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
