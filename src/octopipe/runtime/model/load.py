"""The recipe a `--model` value names: a bundled name or config.json, `hf:PATH`,
`module:factory` (the user's own code, imported as Python imports it), or a factory from Python.

The one place that dispatches on the spelling; each source's recipe lives beside it
(`bundled`, `hf`, `recipe.from_module`).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable

from torch import nn

from octopipe.errors import InputError
from octopipe.runtime.model.bundled import bundled_recipe
from octopipe.runtime.model.recipe import HF_PREFIX, ModelRecipe, ModelSpec, from_module


def load_recipe(spec: ModelSpec) -> ModelRecipe:
    """The recipe of a `--model` value: a bundled name or config.json, `hf:PATH`,
    `module:factory`, or (from Python) the factory itself."""
    if callable(spec):
        return from_module(getattr(spec, "__name__", "model"), spec)
    if spec.startswith(HF_PREFIX):
        from octopipe.runtime.model.hf import hf_recipe

        return hf_recipe(spec[len(HF_PREFIX) :])
    if ":" in spec:
        return from_module(spec, _factory(spec))
    return bundled_recipe(spec)


_FACTORY_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)


def _factory(spec: str) -> Callable[[], nn.Module]:
    """The function `module:factory` names (the user's own code, imported as Python imports
    it), which must be callable with no arguments."""
    if not _FACTORY_SPEC.fullmatch(spec):
        raise InputError("--model", f"{spec!r} is not module:factory (e.g. mymodel:transformer)")
    module_name, _, attr = spec.partition(":")
    _import_from_here()
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InputError("--model", f"cannot load factory {spec!r}: {exc}") from None
    if not callable(factory):
        raise InputError("--model", f"{spec!r} is not callable: expected a factory()")
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise InputError("--model", f"{spec!r} needs arguments: expected a factory()") from None
    except ValueError:  # no signature to read (some builtins): calling it will tell
        pass
    return factory


def _import_from_here() -> None:
    """`module:factory` names the user's module in the folder they work in, as `python -m`
    finds it; the `octopipe` command's own folder is not that one. Spawned ranks inherit the
    search path."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
