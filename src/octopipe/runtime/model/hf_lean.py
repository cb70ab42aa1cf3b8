"""`transformers`' eager norms and gated MLPs, run as `octopipe.models.lean` runs ours: keeping
for the backward what fused kernels keep, as the cost model prices (docs/COSTMODEL.md).

Eager, a Llama-style RMSNorm keeps its FP32 copy of the input, the 1/rms and the normalized
output; a gated MLP keeps act(gate) besides gate and up. `make_lean(model)` gives each such
module a forward on `lean`'s functions (the same math: the norm in FP32, the weight applied as
Gemma's `1 + weight` where the module does so), and starts the residual stream in the autocast
dtype at the token embedding. Modules it does not know keep their own forward.
"""

from __future__ import annotations

from types import MethodType

from torch import nn

from octopipe.models.lean import gated, in_compute_dtype, rms_norm


def make_lean(model: nn.Module) -> None:
    """Swap the forwards of `model`'s RMSNorms and gated MLPs."""
    for module in model.modules():
        forward = _lean_forward(module)
        if forward is not None:
            module.forward = MethodType(forward, module)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if isinstance(embeddings, nn.Module):
        embeddings.register_forward_hook(_in_compute_dtype)


def _lean_forward(module: nn.Module):
    name = type(module).__name__
    if name.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), nn.Parameter):
        if not hasattr(module, "variance_epsilon") and not hasattr(module, "eps"):
            return None
        return _gemma_norm if name.startswith("Gemma") else _norm
    if all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return _gated_mlp
    return None


def _epsilon(module: nn.Module) -> float:
    eps = getattr(module, "variance_epsilon", None)  # Llama's name; Gemma's is `eps`
    return module.eps if eps is None else eps


def _norm(self, hidden_states):
    return rms_norm(hidden_states, self.weight, _epsilon(self))


def _gemma_norm(self, hidden_states):
    return rms_norm(hidden_states, self.weight, _epsilon(self), offset=1.0)


def _gated_mlp(self, x):
    return self.down_proj(gated(self.gate_proj(x), self.up_proj(x), self.act_fn))


def _in_compute_dtype(_module, _inputs, output):
    return in_compute_dtype(output)
