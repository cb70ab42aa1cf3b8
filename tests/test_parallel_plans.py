"""The rank layout, tensor-parallel plans and the refusals before start, without processes.

Rank numbering is the plan format's (docs/FORMATS.md): TP fastest, then PP, then DP. A plan
that cannot apply to its model, or a combination not built, is refused in one line naming the
flag before any rank starts.
"""

from __future__ import annotations

import pytest
from executor_helpers import layer_count, one_f_one_b, run_config
from model_zoo import titan_style, tp_titan_style, write_hf_config

from octopipe.errors import InputError
from octopipe.plan import JobShape, Place
from octopipe.runtime.job.run_config import Job
from octopipe.runtime.launch.launcher import validate_jobs
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.parallel.tensor_parallel import check_plan, matches, resolve


def test_ranks_number_tp_fastest_then_pp_then_dp():
    layout = JobShape(tp=2, pp=3, dp=2)
    assert layout.world_size == 12 and layout.stage_ranks == 4
    assert layout.rank(replica=1, device=2, tp_rank=1) == 1 + 2 * (2 + 3 * 1)
    places = [layout.place(r) for r in range(layout.world_size)]
    assert places[:3] == [Place(0, 0, 0), Place(0, 0, 1), Place(0, 1, 0)]
    assert [layout.rank(p.replica, p.device, p.tp_rank) for p in places] == list(range(12))
    assert layout.place(12) is None  # past the job
    # Without TP it is the earlier rule: replica x P + device.
    assert JobShape(1, 3, 2).rank(1, 2) == 1 * 3 + 2


def test_plan_patterns_match_name_by_name():
    assert matches("layers.*.mixer.wq", "layers.3.mixer.wq")
    assert not matches("layers.*.mixer.wq", "layers.3.mixer.wq.bias")
    assert not matches("layers.*", "layers.3.mixer")
    styles = resolve({"layers.*.a": "A", "norm": "N"}, ["layers.0.a", "layers.1.a", "norm", "x"])
    assert styles == {"layers.0.a": "A", "layers.1.a": "A", "norm": "N"}
    with pytest.raises(ValueError, match="names 'layers.0.a' twice"):
        resolve({"layers.*.a": 1, "layers.0.*": 2}, ["layers.0.a"])


def test_the_bundled_and_hf_plans_cover_their_models(tmp_path):
    llama = load_recipe("tiny-llama")
    plan = llama.tp_plan(2)
    check_plan(plan, llama.meta_model)  # every pattern names a module
    assert {
        "tok_embeddings.embed",
        "layers.0.mixer.wq",
        "layers.3.ffn.w_down",
        "output.proj",
    } <= set(plan)
    qwen3 = write_hf_config(tmp_path / "qwen3", "llama", model_type="qwen3", head_dim=8)
    hf = load_recipe(f"hf:{qwen3}")
    hf_plan = hf.tp_plan(2)
    check_plan(hf_plan, hf.meta_model)
    assert "model.layers.0.self_attn.q_norm" in hf_plan  # per-head norms on the rank's heads
    moe = load_recipe(f"hf:{write_hf_config(tmp_path / 'moe', 'qwen2_moe')}")
    assert type(moe.tp_plan(2)["model.layers.0.mlp"]).__name__ == "PrepareModuleInputOutput"


def test_plans_that_cannot_apply_are_refused_in_one_line():
    with pytest.raises(InputError, match="--tp: .*4 attention heads and 2 key/value heads"):
        load_recipe("tiny-llama").tp_plan(4)
    with pytest.raises(InputError, match="--tp: layers.0.mixer .* no tensor-parallel plan yet"):
        load_recipe("tiny-hybrid").tp_plan(2)
    titan = load_recipe(tp_titan_style)
    with pytest.raises(InputError, match="--tp: the tensor-parallel plan's 'layers.*.w3' names"):
        check_plan({**titan.tp_plan(2), "layers.*.w3": None}, titan.meta_model)


@pytest.mark.parametrize(
    ("model", "options", "world", "message"),
    [
        (titan_style, {"tp": 2}, 4, "--tp: titan_style has no tensor-parallel plan"),
        ("tiny-llama", {"tp": 2, "seq_len": 9}, 4, "--seq-len: 9 tokens do not split into 2"),
        ("tiny-llama", {"tp": 2, "dp": 2}, 6, "--tp: 2 replicas of 2 ranks per device do not"),
        ("tiny-llama", {"dp": 2, "zero": 3, "overlap_steps": True}, 4, "--zero: not supported"),
    ],
)
def test_settings_not_built_are_refused_before_any_rank_starts(model, options, world, message):
    seq_len = options.pop("seq_len", 8)
    plan = one_f_one_b(2, 2, layer_count(model))
    config = run_config(model, 2, seq_len=seq_len, **options)
    with pytest.raises(InputError, match=message):
        validate_jobs([Job(plan, config)], world)
