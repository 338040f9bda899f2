"""The fast tier's resume agreement in a real two-rank gloo group (two processes, each with its
own "node" directory): a rank without a copy gets it broadcast, a stale round's copy is ignored,
a newer volume snapshot wins, and RNG states come back only for the ranks whose copy survived."""
import os

import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp

from ddpjob_trainer.snapshots import fast_resume
from ddpjob_trainer.snapshots.fast import FastSnapshot
from ddpjob_sandbox.procs import free_port


def copy_of(step, value, incarnation, rank):
    state = {"model": {"w": torch.full((200, 200), float(value))}, "epoch": 0, "step": step,
             "samples_consumed": step * 8, "world_size": 2}
    return state, dict(step=step, incarnation=incarnation, rank=rank, rng={"torch": torch.full((3,), rank)})


def save(directory, state_meta):
    fast = FastSnapshot(directory, 0)
    state, meta = state_meta
    fast.save(state, **meta)
    fast.wait()


def agree(directory, rank, volume_step=-1):
    """Each rank's agreement; ``directory`` None for a rank whose tier could not start (no /dev/shm)."""
    fast = FastSnapshot(directory, 0) if directory is not None else None
    choice, meta, incarnation = fast_resume.agree(fast, volume_step if rank == 0 else -1, rank, 2, torch.device("cpu"))
    state = fast_resume.load(choice, fast, meta, rank, torch.device("cpu")) if choice else None
    return choice, incarnation, state


def worker(rank, port, root, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch_dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        node = root / f"node{rank}"
        # 1. Only rank 0 holds a copy (rank 1's node was replaced): it is broadcast.
        if rank == 0:
            save(node, copy_of(5, 5.0, 0, rank=0))
        choice, incarnation, state = agree(node, rank)
        results[f"1-{rank}"] = (choice.step, choice.source, incarnation, float(state["model"]["w"][0, 0]),
                                [None if r is None else int(r["torch"][0]) for r in state["rng"]])
        # 2. Rank 1 holds a copy of an older round at a later step: ignored for rank 0's newer round.
        save(node, copy_of(7, 7.0, 1, rank=0) if rank == 0 else copy_of(9, 9.0, 0, rank=1))
        choice, incarnation, state = agree(node, rank)
        results[f"2-{rank}"] = (choice.step, choice.source, incarnation, float(state["model"]["w"][0, 0]))
        # 3. The volume holds a newer step: the fast tier stands back, and a new round begins anyway.
        choice, incarnation, _ = agree(node, rank, volume_step=8)
        results[f"3-{rank}"] = (choice, incarnation)
        # 4. Rank 1's tier could not start at all: it still takes part and gets rank 0's copy.
        if rank == 0:
            save(node, copy_of(12, 12.0, 3, rank=0))
        choice, incarnation, state = agree(node if rank == 0 else None, rank)
        results[f"4-{rank}"] = (choice.step, choice.source, incarnation, float(state["model"]["w"][0, 0]))
    finally:
        torch_dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    manager = mp.Manager()
    shared = manager.dict()
    mp.start_processes(worker, args=(free_port(), tmp_path_factory.mktemp("fast"), shared), nprocs=2,
                       start_method="spawn")
    return dict(shared)


def test_a_rank_without_a_copy_gets_the_newest_step_broadcast_and_keeps_a_fresh_rng(results):
    assert results["1-0"] == results["1-1"] == (5, 0, 1, 5.0, [0, None])


def test_a_copy_from_an_older_round_is_ignored_even_at_a_later_step(results):
    assert results["2-0"] == results["2-1"] == (7, 0, 2, 7.0)


def test_a_newer_volume_snapshot_wins_and_still_starts_a_new_round(results):
    assert results["3-0"] == results["3-1"] == (None, 2)


def test_a_rank_whose_tier_could_not_start_takes_part_and_gets_the_copy_broadcast(results):
    assert results["4-0"] == results["4-1"] == (12, 0, 4, 12.0)
