"""`octopipe run` under torchrun on two nodes: two torchrun agents on this machine, each standing
for a node, meet through torchrun's c10d rendezvous; the losses are those of a spawned run.

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
from executor_helpers import TOY, gpipe

import octopipe as op
from octopipe.plan import save_plan

pytestmark = pytest.mark.slow  # real process groups: the full suite, not `-m "not slow"`

HERE = Path(__file__).parent
PORT = 29400  # inside the private namespace nothing else listens
STEPS, DP, PER_NODE = 2, 2, 2  # 2 nodes x 2 ranks: the plan's 2 devices x 2 replicas


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
    run = ["-m", "octopipe", "run", "--plan", str(plan), "--model", TOY, "--backend", "gloo"]
    run += ["--steps", str(STEPS), "--dp", str(DP), "--timeout", "60", "--json"]
    return " ".join(torchrun + run)


@pytest.mark.skipif(not private_network_available(), reason="needs unshare -rn (user namespaces)")
@pytest.mark.timeout(240)
def test_two_torchrun_nodes_train_as_a_spawned_run_does(tmp_path):
    plan = tmp_path / "plan.json"
    save_plan(gpipe(2, 2), plan)
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
    assert [s["step"] for s in steps] == list(range(STEPS))
    assert len(summary["peak_memory_bytes"]) == 2 * PER_NODE

    spawned = op.run(op.load_plan(plan), TOY, steps=STEPS, dp=DP, backend="gloo")
    assert summary["losses"] == list(spawned.losses)
