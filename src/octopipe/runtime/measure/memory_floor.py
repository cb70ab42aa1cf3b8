"""The least memory measuring one layer will hold, checked against what the machine has
before `octopipe profile` allocates anything.

The profiler times each layer on `BACK_TO_BACK` microbatches whose forward graphs are all alive
at once, so a layer's activations are held that many times over. What is counted here is a
floor, read from the model on the meta device (nothing is allocated, no forward is run):

- per token, the inputs and outputs of the layer's linear and embedding modules (a module
  list's members, MoE experts, count once: a token visits few of them), in the weights' dtype;
- per causal self-attention module of our own models (`octopipe.models`), the mask it builds:
  a boolean [seq, seq] and the float copy scaled dot-product attention makes of it, 5 bytes a
  pair (measured: tiny-llama at 2,048 and 4,096 tokens grows by ~21 bytes per pair over 4
  microbatches). Other models' attention may use a fused causal kernel with no mask: nothing is
  counted for them.

A floor: the real peak is higher (the loss, the attention's other buffers, the allocator), so a
refusal is certain to be right, and a run that passes may still need more.
"""

from __future__ import annotations

import os

from torch import nn

from octopipe.errors import InputError
from octopipe.runtime.measure.profiler import BACK_TO_BACK
from octopipe.runtime.model.recipe import ModelRecipe
from octopipe.units import GIB

MASK_BYTES_PER_PAIR = 5  # a bool [seq, seq] mask and its float copy inside SDPA


def activation_floor(recipe: ModelRecipe, seq_len: int, micro_batch_size: int) -> tuple[int, str]:
    """(bytes, layer name) of the layer whose measurement holds the most, at least."""
    model = recipe.meta_model
    tokens = seq_len * micro_batch_size
    worst = (0, recipe.layers[0])
    for name in recipe.layers:
        layer = model.get_submodule(name)
        held = tokens * _width_bytes(layer) + _mask_bytes(layer, seq_len)
        worst = max(worst, (BACK_TO_BACK * held, name))
    return worst


def available_memory(device: str) -> int:
    """Bytes free now: the GPU's free memory, or the kernel's MemAvailable (what can be
    allocated without swapping), falling back to the free physical pages."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_activations(
    recipe: ModelRecipe, device: str, seq_len: int, micro_batch_size: int, nproc: int
) -> None:
    """Refuse, in one line, sizes whose activations cannot fit: a sequence longer than the
    model's positions, or a layer whose measurement holds more than the memory available to
    each of the `nproc` processes (on CPU they share the machine's)."""
    positions = recipe.max_positions
    if positions is not None and seq_len > positions:
        raise InputError(
            "--seq-len",
            f"{seq_len:,} tokens are more than {recipe.name}'s {positions:,} positions "
            "(max_position_embeddings); give --seq-len of at most that",
        )
    need, layer = activation_floor(recipe, seq_len, micro_batch_size)
    free = available_memory(device) // (1 if device == "cuda" else nproc)
    if need > free:
        share = "" if device == "cuda" or nproc == 1 else f" ({nproc} processes' share)"
        raise InputError(
            "--seq-len",
            f"measuring {layer} at {seq_len:,} tokens x {micro_batch_size:,} "
            f"sample{'s' if micro_batch_size > 1 else ''} holds at "
            f"least {need / GIB:,.1f} GiB of activations ({BACK_TO_BACK} microbatches at once); "
            f"this {device} has {free / GIB:,.1f} GiB available{share}: give a shorter "
            "--seq-len or --micro-batch-size",
        )


def _width_bytes(layer: nn.Module) -> int:
    """Bytes per token of the inputs and outputs of the layer's linear and embedding modules;
    of each module list (experts), its widest member only."""
    listed = {
        id(m) for lst in layer.modules() if isinstance(lst, nn.ModuleList) for m in lst.modules()
    }
    total, widest_listed = 0, 0
    for module in layer.modules():
        if isinstance(module, nn.Linear):
            width = (module.in_features + module.out_features) * module.weight.element_size()
        elif isinstance(module, nn.Embedding):
            width = module.embedding_dim * module.weight.element_size()
        else:
            continue
        if id(module) in listed:
            widest_listed = max(widest_listed, width)
        else:
            total += width
    return total + widest_listed


def _mask_bytes(layer: nn.Module, seq_len: int) -> int:
    """The causal masks our own self-attention builds (see the module docstring)."""
    masks = sum(
        1
        for m in layer.modules()
        if type(m).__module__.startswith("octopipe.models")
        and type(m).__name__ == "SelfAttention"
        and getattr(m, "causal", False)
    )
    return masks * MASK_BYTES_PER_PAIR * seq_len * seq_len
