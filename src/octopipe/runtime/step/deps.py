"""The dependency graph of a plan's actions, and the checks a plan must pass before it runs.

Pure functions over `Plan` only: no torch, no processes. The executor calls `check_runnable`
before any rank starts, so a plan that would deadlock or does not fit the model is refused with
one line instead of hanging a process group.
"""

from __future__ import annotations

from collections.abc import Iterator

from octopipe.actions import Action
from octopipe.errors import DeadlockError, InputError
from octopipe.plan import Plan, check_structure, dependencies, split_backwards


def find_cycle(plan: Plan) -> list[Action] | None:
    """A cycle in the plan's dependency graph, or None when it is acyclic.

    In the returned list each action waits for the next one, and the last waits for the first.

    Edges: every data dependency, plus each device's order (an action waits for the one listed
    before it on its device).
    """
    split = split_backwards(plan)
    waits_for: dict[Action, list[Action]] = {}
    for acts in plan.schedule.values():
        for j, act in enumerate(acts):
            preds = list(dependencies(plan, act, split))
            if j > 0:
                preds.append(acts[j - 1])
            waits_for[act] = preds
    state: dict[Action, int] = {}  # 1 = on the current path, 2 = finished
    for root, root_preds in waits_for.items():
        if root in state:
            continue
        path: list[Action] = [root]
        todo: list[Iterator[Action]] = [iter(root_preds)]
        state[root] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :]
            elif nxt not in state and nxt in waits_for:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(waits_for[nxt]))
    return None


def check_acyclic(plan: Plan) -> None:
    cycle = find_cycle(plan)
    if cycle:
        chain = " waits for ".join(str(a) for a in [*cycle, cycle[0]])
        raise DeadlockError(f"the schedule deadlocks: {chain}")


def check_runnable(plan: Plan, num_layers: int, world_size: int, where: str = "<plan>") -> None:
    """Refuse a plan the executor cannot run on this model and this many processes."""
    check_structure(plan, where, num_layers, layers_of="the model")
    if plan.num_devices > world_size:
        raise InputError(
            where,
            f"the plan needs {plan.num_devices} devices but only {world_size} processes run",
            "num_devices",
        )
    try:
        check_acyclic(plan)
    except DeadlockError as exc:
        raise InputError(where, str(exc), "schedule") from None
