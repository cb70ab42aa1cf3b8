"""`octopipe models`: the bundled real torch models, with what each one is."""

from __future__ import annotations

import argparse

NAME = "models"
HELP = "List the bundled real torch models (usable with `octopipe profile` and `octopipe run`)."

# What each family stands for in a pipeline: why a plan for it differs from a uniform stack.
FAMILY_NOTES = {
    "dense": "dense decoder (Llama, Qwen2, Mistral)",
    "gemma": "dense decoder: sliding + global attention, large vocabulary (Gemma-2/3)",
    "moe": "mixture-of-experts decoder (Qwen-MoE, Mixtral)",
    "deepseek": "MoE decoder with latent attention and shared experts (DeepSeek-V2/V3)",
    "hybrid": "Mamba-2 / attention / MLP layers from a pattern (Nemotron-H)",
    "vlm": "vision tower + projector + text stack with cross-attention (Llama-3.2-Vision)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from octopipe.costmodel.arch import layer_specs
    from octopipe.costmodel.hf_config import load_architecture
    from octopipe.models import bundled_models
    from octopipe.models.build import parameter_count

    names = bundled_models()
    width = max(map(len, names))
    for name in names:  # the name first on each line, so scripts can take the first word
        arch = load_architecture(name)
        size = f"{len(layer_specs(arch))} layers, {parameter_count(arch) / 1e6:.2f} M parameters"
        print(f"{name:<{width}}  {size:<28}  {FAMILY_NOTES.get(arch.family, arch.family)}")
    return 0
