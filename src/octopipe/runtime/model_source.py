"""Turn the `--model` argument into a PipelineModel: a bundled model's name, an architecture
config.json, or `module:factory`.

The factory form lets tests and users run their own PipelineModel subclass: `factory(seed)`
must return the model, with weights that depend only on the seed (every rank builds the same).
A bundled model can be built with only some layers (`layers`), as a pipeline rank wants; a
factory always builds the whole model and the worker frees the layers it does not hold.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path

from octopipe.errors import InputError
from octopipe.models import build_model, bundled_models
from octopipe.models.base import PipelineModel


def build_pipeline_model(
    spec: str,
    seed: int,
    layers: Iterable[int] | None = None,
    *,
    seq_len: int | None = None,
    micro_batch_size: int | None = None,
) -> PipelineModel:
    """The model `spec` names; with `layers`, a bundled model builds only those layer indices.
    `seq_len` and `micro_batch_size` size a bundled model's data (None: the model's default),
    so a run can match the sizes its profile was measured at."""
    sizes = {
        k: v
        for k, v in (("seq_len", seq_len), ("micro_batch_size", micro_batch_size))
        if v is not None
    }
    if ":" in spec:
        if sizes:
            raise InputError("--model", "sizes apply to bundled models, not to module:factory")
        model = _from_factory(spec, seed)
    else:
        model = _bundled(spec, seed, layers, sizes)
    if not isinstance(model, PipelineModel):
        raise InputError("--model", f"{spec!r} built a {type(model).__name__}, not a PipelineModel")
    return model


def _from_factory(spec: str, seed: int) -> PipelineModel:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InputError("--model", f"cannot load factory {spec!r}: {exc}") from None
    if not callable(factory):
        raise InputError("--model", f"{spec!r} is not callable: expected a factory(seed)")
    return factory(seed)


def _bundled(
    name: str, seed: int, layers: Iterable[int] | None, sizes: dict[str, int]
) -> PipelineModel:
    known = bundled_models()
    if name not in known and not Path(name).is_file():
        raise InputError(
            "--model",
            f"unknown model {name!r}; bundled: {', '.join(sorted(known))} (or a config.json)",
        )
    return build_model(name, seed, layers=None if layers is None else list(layers), **sizes)
