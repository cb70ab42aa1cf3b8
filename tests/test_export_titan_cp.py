"""The torchtitan 0.3 export under context parallelism: the written config refuses, in one line
and before anything starts, a sequence length torchtitan's CP cannot cut for the model's
attention (FlexAttention: CP x 128 tokens; SDPA: 2 x CP; variable-length: no CP at all), where
torchtitan itself fails at the first step (found by benchmarks/titan_check.py: a CP 2 plan at
128 tokens stopped with "Q_LEN 128 is not divisible by CP mesh world size 2 * BLOCK_SIZE 128")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import octopipe.engines.torchtitan.torchtitan_module as template
from octopipe.api import baseline
from tests.test_export_titan import TITAN, export, profile, trainer_config


# Stand-ins named as torchtitan 0.3's attention modules (torchtitan.models.common.attention);
# the check goes by the class name, so that the written file needs no torchtitan to be tested.
class FlexAttention(nn.Module):
    pass


class ScaledDotProductAttention(nn.Module):
    pass


class VarlenAttention(nn.Module):
    pass


class Block(nn.Module):
    def __init__(self, attention: type[nn.Module]):
        super().__init__()
        self.attention = nn.Module()
        self.attention.inner_attention = attention()
        self.feed_forward = nn.Linear(8, 8)


class Decoder(nn.Module):
    def __init__(self, attention: type[nn.Module] = FlexAttention):
        super().__init__()
        self.tok_embeddings = nn.Embedding(16, 8)
        self.layers = nn.ModuleDict({str(i): Block(attention) for i in range(6)})
        self.norm = nn.RMSNorm(8)
        self.lm_head = nn.Linear(8, 16)


def config(cp: int, seq_len: int, attention=FlexAttention, built=None):
    def build():
        model = Decoder(attention)
        if built is not None:
            built.append(next(model.parameters()).device)
        return model

    return SimpleNamespace(
        parallelism=SimpleNamespace(context_parallel_degree=cp),
        training=SimpleNamespace(seq_len=seq_len),
        model_spec=SimpleNamespace(model=SimpleNamespace(build=build)),
    )


@pytest.mark.parametrize(
    "attention, cp, good, bad, unit",
    [
        (FlexAttention, 2, 256, 128, 256),
        (FlexAttention, 4, 1024, 768, 512),
        (ScaledDotProductAttention, 4, 96, 100, 8),
    ],
)
def test_a_sequence_cp_cannot_cut_is_refused_in_one_line(attention, cp, good, bad, unit):
    built = []
    template.check_context_parallel(config(cp, good, attention, built))
    assert built == [torch.device("meta")]  # only the structure is read
    with pytest.raises(ValueError, match=rf"multiple of {unit}, not {bad}$") as caught:
        template.check_context_parallel(config(cp, bad, attention))
    assert "\n" not in str(caught.value)
    assert f"context parallelism (CP {cp})" in str(caught.value)


def test_variable_length_attention_has_no_cp():
    with pytest.raises(ValueError, match="no CP for variable-length attention"):
        template.check_context_parallel(config(2, 256, VarlenAttention))


def test_without_cp_no_model_is_built():
    def refuse():
        raise AssertionError("built a model without CP")

    no_cp = config(1, 100)
    no_cp.model_spec.model.build = refuse
    template.check_context_parallel(no_cp)


def test_an_exported_cp_plan_at_too_short_a_sequence_is_refused_by_its_config(tmp_path):
    """The plan's CP degree and sequence length reach the check through the written file."""
    for seq_len, refused in ((128, True), (256, False)):
        prof = profile(seq_len=seq_len)
        plan = baseline(prof, "1f1b", "uniform", num_microbatches=4, num_devices=2)
        written = export(
            plan.with_shape(tp=1, dp=1, microbatch_size=1, cp=2), prof, tmp_path / str(seq_len)
        )
        assert written.PARALLELISM["module_fqns_per_model_part"][0][0] == TITAN[0]
        titan = trainer_config()
        written.apply_plan(titan)
        titan.model_spec = config(2, seq_len).model_spec
        if refused:
            with pytest.raises(ValueError, match="must be a multiple of 256, not 128"):
                written.check_context_parallel(titan)
        else:
            written.check_context_parallel(titan)
