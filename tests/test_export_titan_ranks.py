"""torchtitan 0.3's rank order against the plan's: torchtitan's mesh is (pp, dp_replicate,
dp_shard, cp, tp), PP outermost, where a plan numbers its GPUs TP, CP, PP, DP. On several nodes
the two can put other ranks together in a node (benchmarks/titan_check.py: a `plan --gpus 4
--gpus-per-node 2` answer of PP 2 x DP 2, priced with each pipeline inside a node, ran in
torchtitan with both stages 0 on node 0 and both stages 1 on node 1); the export says so."""

from __future__ import annotations

import itertools
import json

import pytest

from octopipe.cli import main
from octopipe.engines.torchtitan.layout import node_groups_note
from octopipe.plan import JobShape


def torchtitan_rank(p: int, r: int, c: int, t: int, pp: int, dp: int, cp: int, tp: int) -> int:
    """torchtitan's rank at mesh coordinate (pp p, dp r, cp c, tp t): its world mesh unflattened
    in that order, row-major (torch's DeviceMesh), dp being dp_replicate x dp_shard."""
    return ((p * dp + r) * cp + c) * tp + t


def crossings(tp: int, cp: int, pp: int, dp: int, per_node: int, rank) -> tuple[int, int]:
    """Pipeline hops between nodes and the most nodes a DP group spans, counted from `rank`."""
    hops, spans = 0, 0
    for t, c in itertools.product(range(tp), range(cp)):
        for p in range(pp):
            nodes = {rank(p, r, c, t) // per_node for r in range(dp)}
            spans = max(spans, len(nodes))
            if p + 1 < pp:
                hops += sum(
                    rank(p, r, c, t) // per_node != rank(p + 1, r, c, t) // per_node
                    for r in range(dp)
                )
    return hops, spans


@pytest.mark.parametrize(
    "tp, cp, pp, dp, per_node",
    [(1, 1, 2, 2, 2), (2, 1, 4, 4, 8), (2, 2, 2, 4, 8), (1, 1, 4, 2, 2), (4, 1, 2, 4, 8)],
)
def test_the_note_counts_the_links_torchtitans_mesh_moves(tp, cp, pp, dp, per_node):
    note = node_groups_note(JobShape(tp, pp, dp, cp=cp), per_node)

    def ours(p, r, c, t):
        return t + tp * (c + cp * (p + pp * r))

    def titan(p, r, c, t):
        return torchtitan_rank(p, r, c, t, pp, dp, cp, tp)

    plan_hops, plan_spans = crossings(tp, cp, pp, dp, per_node, ours)
    titan_hops, titan_spans = crossings(tp, cp, pp, dp, per_node, titan)
    assert (titan_hops, titan_spans) != (plan_hops, plan_spans)  # each case moves links
    total = tp * cp * (pp - 1) * dp
    assert note is not None and "\n" not in note
    assert f"{titan_hops} of the {total} pipeline hops cross nodes in torchtitan " in note
    assert f"({plan_hops} in the plan)" in note
    assert f"spans {titan_spans} node" in note and f"({plan_spans} in the plan)" in note


@pytest.mark.parametrize(
    "tp, cp, pp, dp, per_node",
    [
        (1, 1, 2, 2, 4),  # one node
        (1, 1, 4, 1, 2),  # no data parallelism: the two orders are one
        (8, 1, 1, 4, 8),  # no pipeline
        (8, 1, 4, 2, 8),  # a device (TP 8) fills a node: every hop crosses in both orders
        (1, 1, 2, 2, 1),  # a GPU a node
    ],
)
def test_no_note_where_both_orders_put_the_same_ranks_in_a_node(tp, cp, pp, dp, per_node):
    assert node_groups_note(JobShape(tp, pp, dp, cp=cp), per_node) is None


def test_plan_gpus_prints_the_note_and_writes_it_into_the_config(tmp_path, capsys):
    config = tmp_path / "llama3_debugmodel.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 256,
                "num_attention_heads": 16,
                "num_key_value_heads": 16,
                "num_hidden_layers": 6,
                "intermediate_size": 768,
                "vocab_size": 2048,
                "tie_word_embeddings": False,
            }
        )
    )
    out = tmp_path / "out"
    argv = ["plan", "--model", str(config), "--seq-len", "128", "--gpus", "4"]
    argv += ["--gpus-per-node", "2", "--global-batch", "48", "--no-png", "--quiet"]
    argv += ["--torchtitan-config", "llama3:llama3_debugmodel", "-o", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    tp, pp, dp = (plan["parallelism"][k] for k in ("tp", "pp", "dp"))
    order = plan["parallelism"].get("rank_order", "octopipe")  # as the plan was priced
    expected = node_groups_note(JobShape(tp, pp, dp, rank_order=order), 2)
    if expected is None:
        pytest.skip(f"the search chose TP {tp} PP {pp} DP {dp} ({order}): torchtitan's groups")
    assert f"note: {expected}" in " ".join(printed.split())
    written = " ".join(
        line.lstrip("# ")
        for line in (out / "octopipe_torchtitan.py").read_text().splitlines()
        if line.startswith("#")
    )
    assert expected in " ".join(written.split())
