"""Small real torch models of heterogeneous families, for running and profiling.

`ArchModel(arch)` is the model of an architecture config; `bundled_models()` names the configs
small enough to train on a CPU. The torch modules only: this package imports nothing of the
executor (`octopipe.runtime.model.bundled.build_model` builds a whole, initialized model).
"""

from octopipe.models.base import Activation, PipelineModel
from octopipe.models.build import ArchModel, bundled_models

__all__ = ["Activation", "ArchModel", "PipelineModel", "bundled_models"]
