"""How ranks start: on Linux forked from one starter process that imported what they need once
(`runtime/launch/forks.py`), while the launcher checks the run; a refused run leaves nothing."""

import os
import sys
from pathlib import Path

import pytest

from octopipe.errors import InputError
from octopipe.runtime.launch.spawn import RankFailure, spawn_ranks

pytestmark = pytest.mark.slow  # real processes: the full suite, not `-m "not slow"`
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks on Linux")

PRELOADED = "startup_preloaded_probe"  # a module of tests/ (below), imported by the starter


def where_things_happened(rank, world, store, launcher_pid):
    """Each rank: its parent, whether the probe module was imported before the body ran (and in
    another process), and what `warm` left behind."""
    probe = sys.modules.get(PRELOADED)
    return (
        [
            os.getppid() != launcher_pid,
            probe is not None and probe.IMPORTED_BY not in (os.getpid(), launcher_pid),
            probe is not None and probe.WARMED,
        ],
        rank,
        world,
    )


def warm_the_probe(args):
    sys.modules[PRELOADED].WARMED = True


def parent_pid(rank, world, store):
    return os.getppid()


def report_parents(rank, world, store):
    from octopipe.runtime.launch.spawn import tell_parent

    tell_parent((rank, os.getppid()))
    return rank


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """A module whose import records the process that imported it."""
    (tmp_path / f"{PRELOADED}.py").write_text("import os\nIMPORTED_BY = os.getpid()\nWARMED = 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    )
    yield
    sys.modules.pop(PRELOADED, None)


@linux_only
@pytest.mark.timeout(120)
def test_ranks_are_forked_from_one_starter_that_imported_and_warmed_once(probe_module):
    notes = []
    rank0 = spawn_ranks(report_parents, (), 3, on_note=notes.append)
    assert rank0 == 0
    parents = {rank: ppid for rank, ppid in notes}
    assert sorted(parents) == [0, 1, 2]
    assert len(set(parents.values())) == 1  # one starter for all of them...
    assert os.getpid() not in parents.values()  # ...which is not the launcher

    (not_launcher, preloaded, warmed), rank, world = spawn_ranks(
        where_things_happened,
        (os.getpid(),),
        2,
        preload=(PRELOADED,),
        warm=warm_the_probe,
    )
    assert (rank, world) == (0, 2)
    assert not_launcher and preloaded and warmed


@pytest.mark.timeout(120)
def test_check_gives_the_ranks_their_args_while_they_start():
    seen = []

    def check(args):
        seen.append(args)
        return (os.getpid(),)

    _, rank, world = spawn_ranks(where_things_happened, ("unchecked",), 2, check=check)
    assert seen == [("unchecked",)] and (rank, world) == (0, 2)


def _left_behind(tmp: Path) -> list[Path]:
    return [p for p in tmp.iterdir() if p.name.startswith("octopipe")]


def _children() -> list[int]:
    """Live (not zombie) children of this process, but multiprocessing's resource tracker
    (started once, kept until this process exits)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            tracker = b"resource_tracker" in (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and not tracker:
            out.append(int(entry.name))
    return out


@linux_only
@pytest.mark.timeout(120)
def test_a_refusal_in_check_stops_the_start_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    before = set(_children())

    def refuse(args):
        raise InputError("--tp", "refused while the ranks start")

    with pytest.raises(InputError, match="refused while the ranks start"):
        spawn_ranks(parent_pid, (), 2, check=refuse)
    assert set(_children()) - before == set()
    assert _left_behind(tmp_path) == []


def broken_body(rank, world, store):
    raise ValueError(f"rank {rank} is broken")


@pytest.mark.timeout(120)
def test_every_forked_rank_has_an_exit_code_after_a_failure():
    with pytest.raises(RankFailure, match="is broken") as caught:
        spawn_ranks(broken_body, (), 3)
    assert len(caught.value.exit_codes) == 3
    assert all(code not in (None, 0) for code in caught.value.exit_codes)


def test_a_rank_takes_the_recipe_built_before_it_was_forked():
    from executor_helpers import run_config

    from octopipe.runtime.job import session

    config = run_config(model="tiny-llama")
    session.build_recipes([config])
    built = session._BUILT[id(config)][1]
    assert session._recipe(config) is built  # taken, not built again
    assert session._recipe(config) is not built  # once: a second job builds its own


@linux_only
@pytest.mark.timeout(120)
def test_a_starter_spawned_early_is_taken_over_or_stopped(tmp_path, monkeypatch):
    """`octopipe run` spawns the starter before it imports torch (`start_early`): a run of the
    same count takes it over; any other, or none, stops it and its folder goes."""
    from octopipe.runtime.launch import spawn

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    before = set(_children())
    spawn.start_early(2, "octopipe", ())
    early = spawn._early
    assert early is not None and set(_children()) - before == {early.ranks.starter.pid}
    pids = spawn_ranks(parent_pid, (), 2)  # taken over: rank 0's parent is that starter
    assert pids == early.ranks.starter.pid and spawn._early is None
    spawn.start_early(3, "octopipe", ())  # another count: stopped, a starter of its own
    stale = spawn._early.ranks.starter.pid
    assert spawn_ranks(parent_pid, (), 2) not in (stale, os.getpid())
    spawn.start_early(2, "octopipe", ())  # no run at all (refused before): stopped
    spawn.stop_early()
    assert set(_children()) - before == set()
    assert _left_behind(tmp_path) == []


@linux_only
@pytest.mark.timeout(120)
def test_a_run_refused_after_its_early_start_leaves_nothing(tmp_path, monkeypatch, capsys):
    from octopipe.cli import main
    from octopipe.runtime.launch import spawn

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", None)
    import octopipe as op
    from octopipe.plan import save_plan

    profile = op.profile_from_config("tiny-moe", devices=2)
    save_plan(op.baseline(profile, "1f1b", "uniform", 4), tmp_path / "plan.json")
    started, start = [], spawn.start_early
    monkeypatch.setattr(spawn, "start_early", lambda *a: (started.append(a[0]), start(*a)))
    before = set(_children())
    argv = ["run", "--plan", str(tmp_path / "plan.json"), "--model", "tiny-moe"]
    assert main([*argv, "--ep", "3", "--dp", "3"]) == 2  # refused by the launcher's checks
    assert "3 must divide them" in capsys.readouterr().err
    assert started == [6]  # its starter was on its way: TP 1 x PP 2 x DP 3
    assert spawn._early is None and set(_children()) - before == set()
    assert _left_behind(tmp_path / "tmp") == []
