"""Small real torch models of heterogeneous families, for running and profiling.

`build_model(name_or_config, seed)` builds an `ArchModel` from an architecture config;
`bundled_models()` names the configs small enough to train on a CPU.
"""

from octopipe.models.base import Activation, PipelineModel
from octopipe.models.build import ArchModel, build_model, bundled_models

__all__ = ["Activation", "ArchModel", "PipelineModel", "build_model", "bundled_models"]
