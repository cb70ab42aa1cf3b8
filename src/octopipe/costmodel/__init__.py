"""Analytic cost model: architecture configs -> flat layer lists -> per-layer costs -> Profile.

`hf_config` reads configs (a config.json, or a shipped one by name); `arch` holds their shapes
and names the layers; `hardware` holds device presets; `layercost` (with `attention`,
`feedforward`, `vision` and `shards`) the pure per-layer arithmetic; `build` assembles an
`octopipe.profile.Profile`; `accuracy` compares the model with measurements on real hardware.

Only the architecture layer is imported here: `octopipe.models` and the GPU measuring script
(`benchmarks/calibrate_gpu.py`) run on machines that hold torch but not OctoPipe's other
dependencies (pydantic, rich).
"""

from octopipe.costmodel.arch import Architecture, LayerSpec, layer_specs
from octopipe.costmodel.hf_config import load_architecture, shipped_models

__all__ = ["Architecture", "LayerSpec", "layer_specs", "load_architecture", "shipped_models"]
