"""ResumableSampler: every sample once per epoch, also across a mid-epoch restart at another world size."""
import collections

import pytest

from ddpjob_trainer.loop.sampler import ResumableSampler


def shards(size, world, seed=0, epoch=0, consumed=0):
    samplers = [ResumableSampler(size, world, rank, seed=seed) for rank in range(world)]
    for sampler in samplers:
        sampler.set_epoch(epoch, consumed)
    return [list(sampler) for sampler in samplers]


def trained_before_restart(rank_shards, batch_size, batches):
    """What each rank trained in ``batches`` micro-steps of ``batch_size``, and the global consumed count."""
    seen = [index for shard in rank_shards for index in shard[: batch_size * batches]]
    return seen, batch_size * batches * len(rank_shards)


def test_a_fresh_epoch_gives_each_rank_an_equal_disjoint_share():
    parts = shards(103, 4)
    assert [len(part) for part in parts] == [25] * 4
    everything = [index for part in parts for index in part]
    assert len(set(everything)) == 100  # 3 left over: fewer than the world size
    assert set(everything) <= set(range(103))


def test_the_epoch_order_depends_on_seed_and_epoch_but_not_on_the_world_size():
    one = ResumableSampler(50, 1, 0, seed=3)
    three = ResumableSampler(50, 3, 2, seed=3)
    one.set_epoch(2)
    three.set_epoch(2)
    assert one.epoch_order() == three.epoch_order()
    three.set_epoch(1)
    assert three.epoch_order() != one.epoch_order()
    assert sorted(one.epoch_order()) == list(range(50))


def test_the_samples_consumed_by_all_ranks_are_a_prefix_of_the_epoch_order():
    parts = shards(64, 4, seed=1, epoch=5)
    seen, consumed = trained_before_restart(parts, batch_size=3, batches=2)
    order = ResumableSampler(64, 1, 0, seed=1)
    order.set_epoch(5)
    assert sorted(seen) == sorted(order.epoch_order()[:consumed])


@pytest.mark.parametrize(
    ("size", "old_world", "new_world", "batch_size", "batches"),
    [
        (96, 2, 3, 4, 5),   # grow
        (96, 4, 2, 3, 2),   # shrink
        (100, 3, 1, 5, 4),  # to a single worker
        (97, 2, 2, 8, 3),   # same size
    ],
)
def test_a_mid_epoch_resume_at_another_world_size_trains_each_sample_exactly_once(
    size, old_world, new_world, batch_size, batches
):
    before, consumed = trained_before_restart(shards(size, old_world, seed=7, epoch=3), batch_size, batches)
    after = [index for part in shards(size, new_world, seed=7, epoch=3, consumed=consumed) for index in part]
    counts = collections.Counter(before + after)
    assert max(counts.values()) == 1, "a sample was trained twice"
    unused = set(range(size)) - set(counts)
    assert len(unused) < new_world, f"only the remainder smaller than the world size may be left: {unused}"
    assert len(after) == (size - consumed) // new_world * new_world


def test_a_snapshot_at_the_end_of_an_epoch_leaves_nothing_to_resume():
    assert shards(10, 2, consumed=10) == [[], []]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((10, 0, 0), r"num_replicas \(0\) must be >= 1"),
        ((10, 2, 2), r"rank \(2\) must be in \[0, num_replicas=2\)"),
    ],
)
def test_invalid_arguments_name_the_value_and_rule(args, message):
    with pytest.raises(ValueError, match=message):
        ResumableSampler(*args)


def test_consumed_beyond_the_dataset_is_rejected():
    with pytest.raises(ValueError, match=r"consumed \(11\) must be in \[0, dataset size 10\]"):
        ResumableSampler(10, 1, 0).set_epoch(0, consumed=11)
