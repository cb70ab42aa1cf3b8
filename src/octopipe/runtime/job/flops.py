"""The FLOPs a training step does and the rate the hardware could do them at: what a run's
MFU divides. Model FLOPs are the cost model's (`costmodel.build.model_flops`, docs/COSTMODEL.md
"FLOPs, TFLOP/s and MFU"): every matmul and the attention core, no recomputation. They are known
for the models the cost model knows (bundled names, architecture configs, `hf:` configs of its
families); a `module:factory` model has none, and its runs report no MFU.
"""

from __future__ import annotations

from pathlib import Path

import torch

from octopipe.errors import InputError
from octopipe.runtime.model.recipe import HF_PREFIX, ModelSpec

# Dense BF16 peaks of the cost model's presets, by the name CUDA gives the GPU.
_GPU_PRESETS = (("H200", "h200"), ("H800", "h800"), ("H100", "h100"), ("A100", "a100"))


def step_model_flops(model: ModelSpec, seq_len: int, micro_batch_size: int, microbatches: int):
    """Model FLOPs of one step of `microbatches` microbatches (over every replica), or None
    where the cost model does not know the model."""
    from octopipe.costmodel.build import model_flops
    from octopipe.costmodel.hf_config import load_architecture
    from octopipe.costmodel.settings import Settings

    if callable(model):
        return None
    name = model.removeprefix(HF_PREFIX)
    if model.startswith(HF_PREFIX) and Path(name).is_dir():
        name = str(Path(name) / "config.json")
    elif ":" in model and not model.startswith(HF_PREFIX):
        return None  # module:factory
    try:
        arch = load_architecture(name)
    except InputError:  # a family the cost model does not price
        return None
    settings = Settings(seq_len=seq_len, micro_batch_size=micro_batch_size)
    return model_flops(arch, settings) * microbatches


def peak_flops(device: torch.device, given: float | None = None) -> float | None:
    """One rank's dense peak FLOP/s: `given`, else the preset of a GPU the cost model knows by
    its name, else None (a CPU, another GPU)."""
    if given is not None:
        return given
    if device.type != "cuda":
        return None
    from octopipe.costmodel.hardware import PRESETS

    name = torch.cuda.get_device_name(device).upper()
    preset = next((p for key, p in _GPU_PRESETS if key in name), None)
    return None if preset is None else PRESETS[preset].peak_flops
