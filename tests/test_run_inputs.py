"""What `octopipe.run` takes from Python, checked before any process starts: the data's form
(global batches of `(inputs, targets)`, a row per sequence, ids the model can look up), the
loss's form (`loss(outputs, target)`, a function the ranks can import) and the model factory's."""

from __future__ import annotations

import pytest
import torch

import octopipe as op
from octopipe.errors import InputError
from octopipe.runtime.data.batches import GivenBatches, as_global_batch

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

TOKENS = torch.randint(0, 512, (8, 17), generator=torch.Generator().manual_seed(0))
GOOD = ((TOKENS[:, :-1],), TOKENS[:, 1:])


@pytest.fixture(scope="module")
def plan():
    return op.baseline(op.profile_from_config("tiny-llama", devices=2), "1f1b", "uniform", 4)


def _run(plan, **given):
    return op.run(plan, "tiny-llama", seq_len=16, steps=2, micro_batch_size=2, **given)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (
            TOKENS,
            "step 1's batch (data[0]) is a Tensor; expected (inputs, targets), e.g. ((tokens,)",
        ),
        ([(TOKENS,)], "step 1's batch (data[0]) is a tuple; expected (inputs, targets)"),
        (
            [((TOKENS[:4, :-1],), TOKENS[:, 1:])] * 2,
            "inputs and targets of different numbers of rows: [4, 8]",
        ),
        (
            [(("text",), TOKENS)],
            "step 1's inputs (data[0][0]): expected a tensor or a tuple of tensors",
        ),
        (
            [GOOD, ((TOKENS[:, :-1],), "targets")],
            "step 2's targets (data[1][1]): expected a tensor",
        ),
        ([((TOKENS[:, :-1] + 512,), TOKENS[:, 1:])] * 2, "outside the model's vocabulary of 512"),
        ([((TOKENS[:4, :-1],), TOKENS[:4, 1:])] * 2, "holds 4 sequences, not 8 (replicas x"),
        ([GOOD], "holds 1 batches; a run of 2 steps reads 2"),
    ],
)
def test_data_of_the_wrong_form_is_one_line_before_any_rank_starts(plan, data, says):
    with pytest.raises(InputError) as refused:
        _run(plan, data=data)
    assert says in str(refused.value)


def test_one_tensor_of_inputs_is_one_forward_argument():
    batch = as_global_batch((TOKENS[:, :-1], TOKENS[:, 1:]), 0)
    assert len(batch.inputs) == 1 and batch.sequences == 8
    assert GivenBatches([batch]).global_batch(0, 8) is batch


def _no_target(outputs):
    return outputs[0].sum()


def test_a_loss_that_cannot_be_called_or_sent_is_refused(plan):
    with pytest.raises(InputError, match="_no_target cannot be called as loss"):
        _run(plan, data=[GOOD] * 2, loss=_no_target)
    with pytest.raises(InputError, match="<lambda> cannot be sent to the ranks"):
        _run(plan, data=[GOOD] * 2, loss=lambda outputs, target: outputs[0].sum())
    with pytest.raises(InputError, match="expected a function loss"):
        _run(plan, data=[GOOD] * 2, loss="cross_entropy")


def test_a_loss_given_a_tuple_it_did_not_expect_says_what_it_gets():
    from octopipe.runtime.model.recipe import explained

    def loss(outputs, target):
        return torch.nn.functional.cross_entropy(outputs, target)  # outputs is a tuple

    logits, target = torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(InputError, match=r"It gets the last stage's outputs as a tuple \(1 of"):
        explained(loss)((logits,), target)
