"""Analytic cost model: architecture configs -> flat layer lists -> per-layer costs -> Profile.

`arch` reads configs and names the layers; `hardware` holds device presets; `layercost` holds the
pure per-layer arithmetic; `build` assembles a `octopipe.profile.Profile`.

Only the architecture layer is imported here: `calibrate_gpu` runs as `python -m` on GPU
machines that hold torch but not OctoPipe's other dependencies (pydantic, rich).
"""

from octopipe.costmodel.arch import (
    Architecture,
    LayerSpec,
    layer_specs,
    load_architecture,
    shipped_models,
)

__all__ = ["Architecture", "LayerSpec", "layer_specs", "load_architecture", "shipped_models"]
