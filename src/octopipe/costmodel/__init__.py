"""Analytic cost model: architecture configs -> flat layer lists -> per-layer costs -> Profile.

`arch` reads configs and names the layers; `hardware` holds device presets; `layercost` holds the
pure per-layer arithmetic; `build` assembles a `octopipe.profile.Profile`.
"""

from octopipe.costmodel.arch import (
    Architecture,
    LayerSpec,
    layer_specs,
    load_architecture,
    shipped_models,
)

__all__ = ["Architecture", "LayerSpec", "layer_specs", "load_architecture", "shipped_models"]
