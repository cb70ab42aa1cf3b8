"""The kind of device a profile's costs are for, and the kind a run ran on, named alike so the
two compare: a hardware preset's name (`a100`, `h100`, `h800`, `h200`) for a GPU the cost
model knows, CUDA's own name (lower case) for another GPU, `cpu` for processes on CPUs.

A profile names its devices (`devices[i].name`: the preset of `profile-arch`, where `profile`
measured), a plan records their one kind (`profile.device`), and `run` says in one line when
it runs on another kind, where the plan's predicted step time is another machine's. No torch
here unless a GPU is asked about.
"""

from __future__ import annotations

CPU = "cpu"
# The presets of costmodel/hardware.py by the name CUDA gives the GPU, most specific first.
_GPU_PRESETS = (("H200", "h200"), ("H800", "h800"), ("H100", "h100"), ("A100", "a100"))


def gpu_kind(cuda_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; a GPU without a preset keeps its own name."""
    upper = cuda_name.upper()
    return next((preset for key, preset in _GPU_PRESETS if key in upper), cuda_name.lower())


def local_kind(device_type: str) -> str:
    """The kind of this process's device of torch type `device_type` ("cpu" or "cuda")."""
    if device_type != "cuda":
        return CPU
    import torch

    return gpu_kind(torch.cuda.get_device_name(torch.cuda.current_device()))


def other_device_note(plan, plan_file: str, ran_on: str) -> str | None:
    """One line when the plan was priced for another kind of device than `ran_on`, else None
    (also when the plan does not say what it was priced for)."""
    priced = (plan.profile or {}).get("device")
    if priced is None or priced == ran_on:
        return None
    name = (plan.profile or {}).get("name")
    of = f" (profile {name})" if name else ""
    return (
        f"{plan_file} was priced for {priced}{of}; this ran on {ran_on}: its predicted step time "
        f"is another machine's (a plan for this one: octopipe profile ... -o P.json, then "
        f"octopipe plan --profile P.json)"
    )
