"""`octopipe run` under torchrun on two nodes: two torchrun agents on this machine, each standing
for a node, meet through torchrun's c10d rendezvous and run a TP 2 x PP 2 x DP 2 plan with FSDP2
(`--zero 3`), every rank taking its place from the plan's `parallelism` (no --tp or --dp given);
the losses are those of one process.

torchrun's TCP stores listen on every interface, so both agents run in a private network
namespace (`unshare`), whose only interface is its own loopback: nothing is reachable from,
or binds on, the machine's network, and any port in it is free.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from executor_helpers import SGD_FLAGS, gpipe, layer_count

from octopipe.plan import JobShape, save_plan
from octopipe.runtime.job.run_config import RunConfig
from octopipe.runtime.reference import train_reference

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`

HERE = Path(__file__).parent
PORT = 29400  # inside the private namespace nothing else listens
MODEL, STEPS, SEQ = "tiny-llama", 2, 8
TP, PP, DP, MBS = 2, 2, 2, 2
PER_NODE = 4  # 2 nodes x 4 ranks: node 0 holds replica 0, node 1 replica 1


def private_network_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True)
    return probe.returncode == 0


def agent_command(node: int, plan: Path) -> str:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
    torchrun += ["--nproc-per-node", str(PER_NODE), "--node-rank", str(node)]
    torchrun += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{PORT}"]
    torchrun += ["--rdzv-id", "two-nodes", "--rdzv-conf", f"is_host={int(node == 0)}"]
    torchrun += ["--local-addr", "127.0.0.1", "--max-restarts", "0"]
    run = ["-m", "octopipe", "run", "--plan", str(plan), "--model", MODEL, "--backend", "gloo"]
    run += ["--steps", str(STEPS), "--seq-len", str(SEQ), "--zero", "3", "--timeout", "60"]
    run += ["--json", *SGD_FLAGS]
    return " ".join(torchrun + run)


@pytest.mark.skipif(not private_network_available(), reason="needs unshare -rn (user namespaces)")
@pytest.mark.timeout(240)
def test_two_torchrun_nodes_train_a_tp_pp_dp_plan_as_one_process(tmp_path):
    plan = tmp_path / "plan.json"
    save_plan(gpipe(PP, 2, layer_count(MODEL)).with_shape(tp=TP, dp=DP, microbatch_size=MBS), plan)
    script = tmp_path / "nodes.sh"
    script.write_text(
        "ip link set lo up\n"
        + "".join(
            f"{agent_command(n, plan)} > {tmp_path}/out{n} 2> {tmp_path}/err{n} &\n" for n in (0, 1)
        )
        + f"wait %1; echo $? > {tmp_path}/rc0\nwait %2; echo $? > {tmp_path}/rc1\n"
    )
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    nodes = subprocess.Popen(["unshare", "-rn", "sh", str(script)], env=env, start_new_session=True)
    try:
        nodes.wait(timeout=200)
    finally:
        if nodes.poll() is None:  # every agent and rank is in its process group
            os.killpg(nodes.pid, signal.SIGKILL)
            nodes.wait()
    read = {
        name: [(tmp_path / f"{name}{n}").read_text() for n in (0, 1)]
        for name in ("rc", "out", "err")
    }
    assert [rc.strip() for rc in read["rc"]] == ["0", "0"], "\n".join(
        e[-3000:] for e in read["err"]
    )
    # Global rank 0 sits on one of the nodes; it alone prints, one line per step, then the summary.
    printed = [out for out in read["out"] if out.strip()]
    assert len(printed) == 1
    *steps, summary = [json.loads(line) for line in printed[0].strip().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert len(summary["peak_memory_bytes"]) == 2 * PER_NODE
    # Each node is one replica: its ranks hold the same shares of the stages as the other's.
    held = summary["state_bytes"]
    assert held[:PER_NODE] == held[PER_NODE:] and all(b > 0 for b in held)

    config = RunConfig(
        MODEL, steps=STEPS, seq_len=SEQ, shape=JobShape(tp=1, pp=1, dp=DP, microbatch_size=MBS)
    )
    assert summary["losses"] == pytest.approx(train_reference(config, 2).losses, rel=1e-5)
