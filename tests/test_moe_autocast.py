"""`octopipe run --bf16` forwards under CPU autocast: the bundled MoE blocks' experts answer in
BF16 to FP32 tokens, and their weighted sum is taken in the tokens' dtype (it was a dtype error
in `index_add`): the router and the experts get finite gradients."""

from __future__ import annotations

import pytest
import torch

from octopipe.runtime.model.bundled import build_model


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-deepseek"])
def test_moe_models_train_under_bf16_autocast(name):
    model = build_model(name, seed=0)
    ids = torch.randint(0, 100, (2, 16))
    with torch.autocast("cpu", torch.bfloat16):
        out = model(ids)
    logits = out[0] if isinstance(out, tuple) else out
    logits.float().logsumexp(-1).mean().backward()
    router = next(p for n, p in model.named_parameters() if n.endswith("router.weight"))
    assert router.grad is not None and torch.isfinite(router.grad).all()
    expert = next(p for n, p in model.named_parameters() if ".experts." in n)
    assert expert.grad is not None and expert.grad.abs().sum() > 0
